/* SPDX-License-Identifier: MIT
 * Parked messages: list them in place, replay them to the expired exchange. */
#include <lapse/parked.h>

#include "broker_int.h"
#include "headers_int.h"
#include "topology_int.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REPLAY_CHUNK                                                                     \
    128 /* publishes confirmed (and their parked copies acked) per round */
#define REPLAY_CONFIRM_MS 30000 /* how long a round waits for its confirms */

/* ---- describing a message (pure) ---- */

/* Copy for display: one line of printable ASCII, so it stays valid JSON text and one
 * terminal line whatever a foreign publisher put there. */
static void copy_printable(char *dst, size_t cap, const void *src, size_t len) {
    const unsigned char *s = src;
    size_t n = len < cap - 1 ? len : cap - 1;
    for (size_t i = 0; i < n; i++) {
        dst[i] = s[i] >= 0x20 && s[i] < 0x7f ? (char)s[i] : '?';
    }
    dst[n] = '\0';
}

/* The body's order_id even when another field is wrong (a message parked for a missing
 * deadline still names its order), as long as the id itself is valid. */
static bool body_order_id(amqp_bytes_t body, char out[LAPSE_ORDER_ID_MAX + 1]) {
    if (body.len == 0 || body.len > LAPSE_MSG_MAX_BODY) {
        return false;
    }
    json_t *root = json_loadb(body.bytes, body.len, 0, NULL);
    const char *id = json_string_value(json_object_get(root, "order_id"));
    size_t len = id ? json_string_length(json_object_get(root, "order_id")) : 0;
    bool ok = id && lapse_order_id_is_valid(id, len);
    if (ok) {
        memcpy(out, id, len);
        out[len] = '\0';
    }
    json_decref(root);
    return ok;
}

static void describe(const amqp_message_t *msg, lapse_parked_msg_t *out,
                     char body_id[LAPSE_ORDER_ID_MAX + 1]) {
    const amqp_basic_properties_t *props = &msg->properties;
    memset(out, 0, sizeof *out);
    body_id[0] = '\0';
    out->body_len = msg->body.len;
    bool has_body_id = body_order_id(msg->body, body_id);
    if (props->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) {
        copy_printable(out->message_id, sizeof out->message_id, props->message_id.bytes,
                       props->message_id.len);
    }
    if (out->message_id[0] &&
        lapse_order_id_is_valid(out->message_id, props->message_id.len)) {
        snprintf(out->order_id, sizeof out->order_id, "%s", out->message_id);
    } else if (has_body_id) {
        snprintf(out->order_id, sizeof out->order_id, "%s", body_id);
    } else {
        snprintf(out->order_id, sizeof out->order_id, "-");
    }
    const amqp_field_value_t *reason = lapse__hdr_find(props, LAPSE_HDR_REASON);
    if (reason &&
        (reason->kind == AMQP_FIELD_KIND_UTF8 || reason->kind == AMQP_FIELD_KIND_BYTES)) {
        copy_printable(out->reason, sizeof out->reason, reason->value.bytes.bytes,
                       reason->value.bytes.len);
    }
    /* A parked message took at least the attempt that parked it. */
    out->attempts = lapse__hdr_attempts(props);
    if (out->attempts < 1) {
        out->attempts = 1;
    }
    out->parked_at_ms = lapse__hdr_parked_at_ms(props);
}

/* ---- reading the parked queue ---- */

typedef struct session {
    lapse__broker_t broker;
    lapse__topology_t topo;
    int64_t depth; /* ready messages when the session started */
} session_t;

static lapse_status_t session_open(session_t *s, const lapse_config_t *cfg,
                                   const char *name, size_t window,
                                   lapse__settle_cb settle_cb, void *opaque,
                                   lapse_error_t *err) {
    lapse__topology_build(cfg, &s->topo);
    lapse_status_t rc =
        lapse__broker_open(&s->broker, cfg, name, window, settle_cb, opaque, err);
    if (rc != LAPSE_OK) {
        return rc;
    }
    amqp_queue_declare_ok_t *ok = amqp_queue_declare(
        s->broker.conn, LAPSE__CHANNEL, amqp_cstring_bytes(s->topo.parked_queue), 1, 0, 0,
        0, amqp_empty_table);
    char what[LAPSE__NAME_MAX + 64];
    snprintf(what, sizeof what, "queue %s (run 'lapse topology declare')",
             s->topo.parked_queue);
    rc = lapse__broker_reply(&s->broker, amqp_get_rpc_reply(s->broker.conn), what, err);
    if (rc == LAPSE_OK) {
        s->depth = ok ? (int64_t)ok->message_count : 0;
    } else {
        lapse__broker_close(&s->broker);
    }
    return rc;
}

/* basic.get one message without acking it: it stays unacked on this channel until it is
 * acked, or goes back to its place in the queue when the channel closes. *got is false
 * when the queue is empty. */
static lapse_status_t get_one(session_t *s, amqp_message_t *msg, uint64_t *delivery_tag,
                              uint32_t *remaining, bool *got, lapse_error_t *err) {
    *got = false;
    amqp_rpc_reply_t r = amqp_basic_get(s->broker.conn, LAPSE__CHANNEL,
                                        amqp_cstring_bytes(s->topo.parked_queue), 0);
    lapse_status_t rc = lapse__broker_reply(&s->broker, r, "basic.get", err);
    if (rc != LAPSE_OK || r.reply.id == AMQP_BASIC_GET_EMPTY_METHOD) {
        return rc;
    }
    if (r.reply.id != AMQP_BASIC_GET_OK_METHOD) {
        return lapse_error_set(err, LAPSE_ERR_BROKER_PROTOCOL,
                               "basic.get: unexpected method 0x%08x",
                               (unsigned)r.reply.id);
    }
    const amqp_basic_get_ok_t *ok = r.reply.decoded;
    *delivery_tag = ok->delivery_tag;
    *remaining = ok->message_count;
    r = amqp_read_message(s->broker.conn, LAPSE__CHANNEL, msg, 0);
    rc = lapse__broker_reply(&s->broker, r, "read parked message", err);
    *got = rc == LAPSE_OK;
    return rc;
}

lapse_status_t lapse_parked_list(const lapse_config_t *cfg, size_t limit,
                                 lapse_parked_cb cb, void *opaque, size_t *more,
                                 lapse_error_t *err) {
    if (more) {
        *more = 0;
    }
    if (limit == 0) {
        return lapse_error_set(err, LAPSE_ERR_INVALID, "limit must be at least 1");
    }
    session_t s;
    lapse_status_t rc = session_open(&s, cfg, "lapse parked list", 0, NULL, NULL, err);
    if (rc != LAPSE_OK) {
        return rc;
    }
    uint32_t remaining = 0;
    for (size_t n = 0; n < limit && rc == LAPSE_OK; n++) {
        amqp_message_t msg;
        uint64_t tag;
        bool got;
        rc = get_one(&s, &msg, &tag, &remaining, &got, err);
        if (rc != LAPSE_OK || !got) {
            remaining = 0;
            break;
        }
        lapse_parked_msg_t desc;
        char body_id[LAPSE_ORDER_ID_MAX + 1];
        describe(&msg, &desc, body_id);
        amqp_destroy_message(&msg);
        amqp_maybe_release_buffers_on_channel(s.broker.conn, LAPSE__CHANNEL);
        if (cb) {
            cb(opaque, &desc);
        }
    }
    if (more && rc == LAPSE_OK) {
        *more = remaining;
    }
    /* Nothing was acked: closing the channel puts every listed message back. */
    lapse__broker_close(&s.broker);
    return rc;
}

/* ---- replay ---- */

typedef struct replay_item {
    uint64_t publish_tag;
    uint64_t delivery_tag;
    lapse_status_t outcome;
    lapse_parked_msg_t desc;
} replay_item_t;

/* Two connections: confirms for the publishes must not arrive on the channel that
 * basic.gets (rabbitmq-c queues such a frame during the get's RPC and then hands it to
 * amqp_read_message instead of the content header). */
typedef struct replay {
    session_t s;         /* gets and acks the parked copies */
    lapse__broker_t out; /* publishes to the expired exchange, with confirms */
    replay_item_t items[REPLAY_CHUNK];
    size_t n;
    size_t replayed;
    lapse_parked_cb cb;
    void *opaque;
} replay_t;

static void on_settle(void *opaque, uint64_t tag, lapse_status_t outcome) {
    replay_t *r = opaque;
    for (size_t i = 0; i < r->n; i++) {
        if (r->items[i].publish_tag == tag) {
            r->items[i].outcome = outcome;
            return;
        }
    }
}

/* Wait for the round's confirms, then ack the parked copy of each confirmed publish.
 * A copy whose publish failed stays unacked and goes back to the queue at close. */
static lapse_status_t flush(replay_t *r, lapse_error_t *err) {
    if (r->n == 0) {
        return LAPSE_OK;
    }
    lapse_status_t rc = lapse__broker_wait_confirms(&r->out, REPLAY_CONFIRM_MS, err);
    lapse_status_t failed = LAPSE_OK;
    const char *failed_id = "";
    for (size_t i = 0; i < r->n && rc == LAPSE_OK; i++) {
        replay_item_t *it = &r->items[i];
        if (it->outcome != LAPSE_OK) {
            if (failed == LAPSE_OK) {
                failed = it->outcome;
                failed_id = it->desc.order_id;
            }
            continue;
        }
        if (amqp_basic_ack(r->s.broker.conn, LAPSE__CHANNEL, it->delivery_tag, 0) !=
            AMQP_STATUS_OK) {
            r->s.broker.open = false;
            rc = lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED,
                                 "ack of a replayed parked message failed");
            break;
        }
        r->replayed++;
        if (r->cb) {
            r->cb(r->opaque, &it->desc);
        }
    }
    if (rc == LAPSE_OK && failed != LAPSE_OK) {
        rc = lapse_error_set(err, failed, "replay of %s: %s (its parked copy was kept)",
                             failed_id, lapse_strerror(failed));
    }
    r->n = 0;
    return rc;
}

/* The parking headers describe the last failure; a replayed message starts afresh, so a
 * retry path that counts attempts gives it its full budget again. */

static lapse_status_t republish(replay_t *r, const amqp_message_t *msg,
                                uint64_t delivery_tag, const lapse_parked_msg_t *desc,
                                lapse_error_t *err) {
    amqp_basic_properties_t props = msg->properties;
    amqp_table_t old =
        (props._flags & AMQP_BASIC_HEADERS_FLAG) ? props.headers : amqp_empty_table;
    amqp_table_entry_t *entries = calloc((size_t)old.num_entries + 1, sizeof *entries);
    if (!entries) {
        return lapse_error_set(err, LAPSE_ERR_NOMEM, "replay headers");
    }
    int n = 0;
    for (int i = 0; i < old.num_entries; i++) {
        if (!lapse__hdr_is_parking(old.entries[i].key)) {
            entries[n++] = old.entries[i];
        }
    }
    props.headers.num_entries = n;
    props.headers.entries = entries;
    props._flags |= AMQP_BASIC_DELIVERY_MODE_FLAG;
    if (n == 0) {
        props._flags &= ~(amqp_flags_t)AMQP_BASIC_HEADERS_FLAG;
    }
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    replay_item_t *it = &r->items[r->n];
    it->delivery_tag = delivery_tag;
    it->outcome = LAPSE_ERR_BROKER_CLOSED; /* until the broker settles it */
    it->desc = *desc;
    /* Mandatory, although the expired exchange's alternate exchange parks what it
     * cannot route: without one, a return still keeps the parked copy. */
    lapse_status_t rc = lapse__broker_publish(
        &r->out, r->s.topo.expired_exchange, LAPSE__RK_EXPIRED, true, &props,
        msg->body.bytes, msg->body.len, &it->publish_tag, err);
    free(entries);
    if (rc == LAPSE_OK) {
        r->n++;
    }
    return rc;
}

lapse_status_t lapse_parked_replay(const lapse_config_t *cfg, const char *order_id,
                                   lapse_parked_cb cb, void *opaque, size_t *replayed,
                                   lapse_error_t *err) {
    if (replayed) {
        *replayed = 0;
    }
    if (order_id && !lapse_order_id_is_valid(order_id, strlen(order_id))) {
        return lapse_error_set(err, LAPSE_ERR_INVALID, "invalid order id '%s'", order_id);
    }
    replay_t *r = calloc(1, sizeof *r);
    if (!r) {
        return lapse_error_set(err, LAPSE_ERR_NOMEM, "replay state");
    }
    r->cb = cb;
    r->opaque = opaque;
    lapse_status_t rc = lapse__broker_open(&r->out, cfg, "lapse parked replay out",
                                           REPLAY_CHUNK, on_settle, r, err);
    if (rc != LAPSE_OK) {
        free(r);
        return rc;
    }
    rc = session_open(&r->s, cfg, "lapse parked replay", 0, NULL, NULL, err);
    if (rc != LAPSE_OK) {
        lapse__broker_close(&r->out);
        free(r);
        return rc;
    }
    /* Only the messages there at the start: a replayed message the consumer parks again
     * joins the tail and must not come round a second time. */
    for (int64_t seen = 0; seen < r->s.depth && rc == LAPSE_OK; seen++) {
        amqp_message_t msg;
        uint64_t tag;
        uint32_t remaining;
        bool got;
        rc = get_one(&r->s, &msg, &tag, &remaining, &got, err);
        if (rc != LAPSE_OK || !got) {
            break;
        }
        lapse_parked_msg_t desc;
        char body_id[LAPSE_ORDER_ID_MAX + 1];
        describe(&msg, &desc, body_id);
        bool match = !order_id || strcmp(desc.order_id, order_id) == 0 ||
                     strcmp(body_id, order_id) == 0;
        if (match) {
            rc = republish(r, &msg, tag, &desc, err);
        }
        amqp_destroy_message(&msg);
        amqp_maybe_release_buffers_on_channel(r->s.broker.conn, LAPSE__CHANNEL);
        if (rc == LAPSE_OK && r->n == REPLAY_CHUNK) {
            rc = flush(r, err);
        } else if (rc == LAPSE_OK && seen % REPLAY_CHUNK == REPLAY_CHUNK - 1) {
            /* A long scan for one order publishes rarely: keep the publishing
             * connection's heartbeats going so the broker does not drop it. */
            rc = lapse__broker_poll(&r->out, 0, err);
        }
    }
    if (rc == LAPSE_OK) {
        rc = flush(r, err);
    }
    if (replayed) {
        *replayed = r->replayed;
    }
    /* Unmatched (and failed) parked copies were never acked: closing the channel puts
     * them back in their places. */
    lapse__broker_close(&r->s.broker);
    lapse__broker_close(&r->out);
    free(r);
    return rc;
}

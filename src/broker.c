/* SPDX-License-Identifier: MIT
 * The rabbitmq-c boundary: connect, map replies to lapse codes, confirmed publishing. */
#include "broker_int.h"

#include "headers_int.h"

#include <lapse/message.h>

#include <amqp_tcp_socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONFIRM_WAIT_MS 30000 /* a full window waits this long for the broker */
/* Headers of a publish up to this many are stamped on the stack, more on the heap. */
#define SEQ_HEADERS_FIXED 8

amqp_table_entry_t lapse__entry_str(const char *k, const char *v) {
    amqp_table_entry_t e;
    e.key = amqp_cstring_bytes(k);
    e.value.kind = AMQP_FIELD_KIND_UTF8;
    e.value.value.bytes = amqp_cstring_bytes(v);
    return e;
}

amqp_table_entry_t lapse__entry_i64(const char *k, int64_t v) {
    amqp_table_entry_t e;
    e.key = amqp_cstring_bytes(k);
    e.value.kind = AMQP_FIELD_KIND_I64;
    e.value.value.i64 = v;
    return e;
}

void lapse__bytes_to_str(amqp_bytes_t bytes, char *buf, size_t cap) {
    size_t n = bytes.len < cap - 1 ? bytes.len : cap - 1;
    if (n > 0) {
        memcpy(buf, bytes.bytes, n);
    }
    buf[n] = '\0';
}

static lapse_status_t server_close(lapse__broker_t *broker, const char *what,
                                   uint16_t code, amqp_bytes_t text, bool connection,
                                   lapse_error_t *err) {
    char reply[128];
    lapse__bytes_to_str(text, reply, sizeof reply);
    broker->open = false;
    bool refused =
        connection && (code == AMQP_ACCESS_REFUSED || code == AMQP_NOT_ALLOWED);
    lapse_status_t rc = refused ? LAPSE_ERR_BROKER_LOGIN : LAPSE_ERR_BROKER_CLOSED;
    return lapse_error_set(err, rc, "%s: broker closed the %s: %u %s", what,
                           connection ? "connection" : "channel", code, reply);
}

lapse_status_t lapse__broker_reply(lapse__broker_t *broker, amqp_rpc_reply_t reply,
                                   const char *what, lapse_error_t *err) {
    switch (reply.reply_type) {
        case AMQP_RESPONSE_NORMAL:
            return LAPSE_OK;
        case AMQP_RESPONSE_NONE:
            return lapse_error_set(err, LAPSE_ERR_BROKER_PROTOCOL, "%s: no reply", what);
        case AMQP_RESPONSE_LIBRARY_EXCEPTION:
            /* rabbitmq-c closes the connection when an RPC times out. */
            broker->open = false;
            if (reply.library_error == AMQP_STATUS_TIMEOUT) {
                return lapse_error_set(err, LAPSE_ERR_BROKER_TIMEOUT, "%s: timed out",
                                       what);
            }
            return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "%s: %s", what,
                                   amqp_error_string2(reply.library_error));
        case AMQP_RESPONSE_SERVER_EXCEPTION:
            if (reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
                amqp_connection_close_t *m = reply.reply.decoded;
                return server_close(broker, what, m->reply_code, m->reply_text, true,
                                    err);
            }
            if (reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
                amqp_channel_close_t *m = reply.reply.decoded;
                return server_close(broker, what, m->reply_code, m->reply_text, false,
                                    err);
            }
            return lapse_error_set(err, LAPSE_ERR_BROKER_PROTOCOL,
                                   "%s: unexpected method 0x%08x", what,
                                   (unsigned)reply.reply.id);
    }
    return lapse_error_set(err, LAPSE_ERR_BROKER_PROTOCOL, "%s: bad reply", what);
}

lapse_status_t lapse__broker_open(lapse__broker_t *broker, const lapse_config_t *cfg,
                                  const char *conn_name, size_t window,
                                  lapse__settle_cb settle_cb, void *settle_opaque,
                                  lapse_error_t *err) {
    memset(broker, 0, sizeof *broker);
    broker->cfg = cfg;
    broker->next_tag = 1;
    broker->first_open = 1;
    broker->settle_cb = settle_cb;
    broker->settle_opaque = settle_opaque;
    if (window > 0) {
        broker->slots = calloc(window, sizeof *broker->slots);
        if (!broker->slots) {
            return lapse_error_set(err, LAPSE_ERR_NOMEM, "confirm window");
        }
        broker->window = window;
    }

    broker->conn = amqp_new_connection();
    amqp_socket_t *socket = broker->conn ? amqp_tcp_socket_new(broker->conn) : NULL;
    if (!socket) {
        lapse__broker_close(broker);
        return lapse_error_set(err, LAPSE_ERR_NOMEM, "cannot allocate an AMQP socket");
    }
    struct timeval tv = {.tv_sec = 10, .tv_usec = 0};
    int st = amqp_socket_open_noblock(socket, cfg->host, cfg->port, &tv);
    if (st != AMQP_STATUS_OK) {
        lapse__broker_close(broker);
        return lapse_error_set(err, LAPSE_ERR_BROKER_CONNECT, "connect to %s:%d: %s",
                               cfg->host, cfg->port, amqp_error_string2(st));
    }
    /* Synchronous RPCs (declare, open, close) must not hang forever on a stuck broker. */
    struct timeval rpc = {.tv_sec = 30, .tv_usec = 0};
    amqp_set_rpc_timeout(broker->conn, &rpc);

    amqp_table_entry_t props_entries[] = {lapse__entry_str("connection_name", conn_name),
                                          lapse__entry_str("product", "lapse"),
                                          lapse__entry_str("version", LAPSE_VERSION)};
    amqp_table_t props = {.num_entries = 3, .entries = props_entries};
    amqp_rpc_reply_t reply = amqp_login_with_properties(
        broker->conn, cfg->vhost, 0, AMQP_DEFAULT_FRAME_SIZE, cfg->heartbeat, &props,
        AMQP_SASL_METHOD_PLAIN, cfg->user, cfg->password);
    /* A refused login arrives as connection.close 403 (or 530 for a vhost it may not
     * use) and is final; a dropped socket during the handshake (a broker restarting, a
     * proxy without backends) stays retriable. */
    lapse_status_t rc = lapse__broker_reply(broker, reply, "login", err);
    if (rc != LAPSE_OK) {
        lapse__broker_close(broker);
        return rc;
    }
    broker->open = true;
    amqp_channel_open(broker->conn, LAPSE__CHANNEL);
    rc = lapse__broker_reply(broker, amqp_get_rpc_reply(broker->conn), "channel.open",
                             err);
    if (rc == LAPSE_OK && window > 0) {
        amqp_confirm_select(broker->conn, LAPSE__CHANNEL);
        rc = lapse__broker_reply(broker, amqp_get_rpc_reply(broker->conn),
                                 "confirm.select", err);
        broker->confirms = rc == LAPSE_OK;
    }
    if (rc != LAPSE_OK) {
        lapse__broker_close(broker);
    }
    return rc;
}

static lapse__pub_slot_t *slot_of(lapse__broker_t *broker, uint64_t tag) {
    return &broker->slots[tag % broker->window];
}

static void settle_one(lapse__broker_t *broker, uint64_t tag, lapse_status_t outcome) {
    lapse__pub_slot_t *slot = slot_of(broker, tag);
    if (slot->tag != tag) {
        return; /* already settled (a late multiple ack) */
    }
    if (outcome == LAPSE_OK && slot->returned) {
        outcome = LAPSE_ERR_BROKER_RETURNED;
    }
    slot->tag = 0;
    slot->returned = false;
    if (broker->settle_cb) {
        broker->settle_cb(broker->settle_opaque, tag, outcome);
    }
}

static void advance(lapse__broker_t *broker) {
    while (broker->first_open < broker->next_tag &&
           slot_of(broker, broker->first_open)->tag != broker->first_open) {
        broker->first_open++;
    }
}

static void settle(lapse__broker_t *broker, uint64_t tag, bool multiple,
                   lapse_status_t outcome) {
    if (tag >= broker->next_tag) {
        return;
    }
    if (multiple) {
        for (uint64_t t = broker->first_open; t <= tag; t++) {
            settle_one(broker, t, outcome);
        }
    } else {
        settle_one(broker, tag, outcome);
    }
    advance(broker);
}

amqp_table_t lapse__headers_with_seq(const amqp_table_t *in, uint64_t seq,
                                     amqp_table_entry_t *out) {
    amqp_table_t t = {.num_entries = 0, .entries = out};
    size_t key_len = strlen(LAPSE_HDR_PUBLISH_SEQ);
    for (int i = 0; in && i < in->num_entries; i++) {
        amqp_bytes_t k = in->entries[i].key;
        if (!(k.len == key_len && memcmp(k.bytes, LAPSE_HDR_PUBLISH_SEQ, key_len) == 0)) {
            out[t.num_entries++] = in->entries[i];
        }
    }
    out[t.num_entries++] = lapse__hdr_publish_seq_entry(seq);
    return t;
}

/* basic.return names no delivery tag; the publish's own sequence header does. */
static void mark_returned(lapse__broker_t *broker, uint64_t seq) {
    if (seq >= broker->first_open && seq < broker->next_tag &&
        slot_of(broker, seq)->tag == seq) {
        slot_of(broker, seq)->returned = true;
        return;
    }
    /* A return we cannot attribute (no header: not published through here): failing
     * every unsettled publish is safe, since the callers publish again and every
     * consumer is idempotent. */
    for (uint64_t t = broker->first_open; t < broker->next_tag; t++) {
        lapse__pub_slot_t *slot = slot_of(broker, t);
        if (slot->tag == t) {
            slot->returned = true;
        }
    }
}

/* Read and handle one frame on a confirm-mode connection; *got says whether one came. */
static lapse_status_t pump(lapse__broker_t *broker, int64_t timeout_ms, bool *got,
                           lapse_error_t *err) {
    struct timeval tv = {.tv_sec = timeout_ms / 1000,
                         .tv_usec = (suseconds_t)((timeout_ms % 1000) * 1000)};
    amqp_frame_t frame;
    *got = false;
    int st = amqp_simple_wait_frame_noblock(broker->conn, &frame, &tv);
    if (st == AMQP_STATUS_TIMEOUT) {
        return LAPSE_OK;
    }
    if (st != AMQP_STATUS_OK) {
        broker->open = false;
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "waiting for confirms: %s",
                               amqp_error_string2(st));
    }
    *got = true;
    if (frame.frame_type != AMQP_FRAME_METHOD) {
        return LAPSE_OK;
    }
    switch (frame.payload.method.id) {
        case AMQP_BASIC_ACK_METHOD: {
            amqp_basic_ack_t *m = frame.payload.method.decoded;
            settle(broker, m->delivery_tag, m->multiple, LAPSE_OK);
            return LAPSE_OK;
        }
        case AMQP_BASIC_NACK_METHOD: {
            amqp_basic_nack_t *m = frame.payload.method.decoded;
            settle(broker, m->delivery_tag, m->multiple, LAPSE_ERR_BROKER_NACK);
            return LAPSE_OK;
        }
        case AMQP_BASIC_RETURN_METHOD: {
            /* The returned message's header and body follow; its ack comes after. */
            amqp_message_t msg;
            amqp_rpc_reply_t r = amqp_read_message(broker->conn, frame.channel, &msg, 0);
            lapse_status_t rc = lapse__broker_reply(broker, r, "basic.return", err);
            if (rc != LAPSE_OK) {
                return rc;
            }
            mark_returned(broker, lapse__hdr_publish_seq(&msg.properties));
            amqp_destroy_message(&msg);
            return LAPSE_OK;
        }
        case AMQP_CHANNEL_CLOSE_METHOD: {
            amqp_channel_close_t *m = frame.payload.method.decoded;
            amqp_channel_close_ok_t ok = {0};
            amqp_send_method(broker->conn, frame.channel, AMQP_CHANNEL_CLOSE_OK_METHOD,
                             &ok);
            return server_close(broker, "publish", m->reply_code, m->reply_text, false,
                                err);
        }
        case AMQP_CONNECTION_CLOSE_METHOD: {
            amqp_connection_close_t *m = frame.payload.method.decoded;
            amqp_connection_close_ok_t ok = {0};
            amqp_send_method(broker->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
            return server_close(broker, "publish", m->reply_code, m->reply_text, true,
                                err);
        }
        default:
            return LAPSE_OK;
    }
}

lapse_status_t lapse__broker_poll(lapse__broker_t *broker, int64_t timeout_ms,
                                  lapse_error_t *err) {
    if (!broker->open) {
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "not connected");
    }
    bool got = true;
    lapse_status_t rc = LAPSE_OK;
    /* Reading also sends a heartbeat when one is due, so an idle publishing connection
     * is not dropped by the broker. */
    for (int i = 0; i < 64 && got && rc == LAPSE_OK; i++) {
        rc = pump(broker, i == 0 ? timeout_ms : 0, &got, err);
    }
    if (broker->open) {
        /* Decoded frames stay in rabbitmq-c's pools until released: without this a
         * connection that only publishes grows with every confirm it reads. */
        amqp_maybe_release_buffers(broker->conn);
    }
    return rc;
}

size_t lapse__broker_unsettled(const lapse__broker_t *broker) {
    return (size_t)(broker->next_tag - broker->first_open);
}

lapse_status_t lapse__broker_wait_settled(lapse__broker_t *broker, uint64_t upto_tag,
                                          int64_t timeout_ms, lapse_error_t *err) {
    if (!broker->conn) {
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "not connected");
    }
    int64_t waited = 0;
    while (broker->first_open <= upto_tag && broker->first_open < broker->next_tag) {
        if (!broker->open) {
            return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED,
                                   "connection lost with publishes unconfirmed");
        }
        if (waited >= timeout_ms) {
            return lapse_error_set(
                err, LAPSE_ERR_BROKER_TIMEOUT, "%zu publishes unconfirmed after %lld ms",
                lapse__broker_unsettled(broker), (long long)timeout_ms);
        }
        bool got;
        int64_t step = timeout_ms - waited < 1000 ? timeout_ms - waited : 1000;
        lapse_status_t rc = pump(broker, step, &got, err);
        if (rc != LAPSE_OK) {
            return rc;
        }
        if (!got) {
            waited += step;
        }
    }
    amqp_maybe_release_buffers(broker->conn); /* see lapse__broker_poll */
    return LAPSE_OK;
}

lapse_status_t lapse__broker_wait_confirms(lapse__broker_t *broker, int64_t timeout_ms,
                                           lapse_error_t *err) {
    if (broker->next_tag == broker->first_open) {
        return LAPSE_OK;
    }
    return lapse__broker_wait_settled(broker, broker->next_tag - 1, timeout_ms, err);
}

lapse_status_t lapse__broker_publish(lapse__broker_t *broker, const char *exchange,
                                     const char *routing_key, bool mandatory,
                                     const amqp_basic_properties_t *props,
                                     const void *body, size_t len, uint64_t *tag,
                                     lapse_error_t *err) {
    if (!broker->open) {
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "publish: not connected");
    }
    if (broker->confirms) {
        /* Keep at most `window` publishes in flight: drain confirms before the next. */
        int64_t waited = 0;
        while (lapse__broker_unsettled(broker) >= broker->window) {
            bool got;
            lapse_status_t rc = pump(broker, 1000, &got, err);
            if (rc != LAPSE_OK) {
                return rc;
            }
            waited += got ? 0 : 1000;
            if (waited >= CONFIRM_WAIT_MS) {
                return lapse_error_set(err, LAPSE_ERR_BROKER_TIMEOUT,
                                       "confirm window full for %d ms", CONFIRM_WAIT_MS);
            }
        }
    }
    amqp_bytes_t bytes = {.len = len, .bytes = (void *)body};
    uint64_t t = broker->next_tag;
    amqp_basic_properties_t stamped;
    amqp_table_entry_t fixed[SEQ_HEADERS_FIXED];
    amqp_table_entry_t *entries = NULL;
    if (broker->confirms && mandatory) {
        const amqp_table_t *old =
            (props->_flags & AMQP_BASIC_HEADERS_FLAG) ? &props->headers : NULL;
        size_t need = (old ? (size_t)old->num_entries : 0) + 1;
        entries = need <= SEQ_HEADERS_FIXED ? fixed : malloc(need * sizeof *entries);
        if (!entries) {
            return lapse_error_set(err, LAPSE_ERR_NOMEM, "publish headers");
        }
        stamped = *props;
        stamped.headers = lapse__headers_with_seq(old, t, entries);
        stamped._flags |= AMQP_BASIC_HEADERS_FLAG;
        props = &stamped;
    }
    int st =
        amqp_basic_publish(broker->conn, LAPSE__CHANNEL, amqp_cstring_bytes(exchange),
                           amqp_cstring_bytes(routing_key), mandatory, 0, props, bytes);
    if (entries != fixed) {
        free(entries);
    }
    if (st != AMQP_STATUS_OK) {
        broker->open = false;
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "publish to %s: %s",
                               exchange[0] ? exchange : "(default)",
                               amqp_error_string2(st));
    }
    broker->next_tag++;
    if (broker->confirms) {
        lapse__pub_slot_t *slot = slot_of(broker, t);
        slot->tag = t;
        slot->returned = false;
    }
    if (tag) {
        *tag = t;
    }
    return LAPSE_OK;
}

void lapse__broker_swap_settle(lapse__broker_t *broker, lapse__settle_cb *cb,
                               void **opaque) {
    lapse__settle_cb old_cb = broker->settle_cb;
    void *old_opaque = broker->settle_opaque;
    broker->settle_cb = *cb;
    broker->settle_opaque = *opaque;
    *cb = old_cb;
    *opaque = old_opaque;
}

void lapse__broker_close(lapse__broker_t *broker) {
    if (broker->confirms) {
        for (uint64_t t = broker->first_open; t < broker->next_tag; t++) {
            settle_one(broker, t, LAPSE_ERR_BROKER_CLOSED);
        }
        broker->first_open = broker->next_tag;
    }
    if (broker->conn) {
        if (broker->open) {
            amqp_channel_close(broker->conn, LAPSE__CHANNEL, AMQP_REPLY_SUCCESS);
            amqp_connection_close(broker->conn, AMQP_REPLY_SUCCESS);
        }
        amqp_destroy_connection(broker->conn);
    }
    free(broker->slots);
    broker->slots = NULL;
    broker->conn = NULL;
    broker->open = false;
    broker->confirms = false;
}

/* ---- the consuming side: consume, ack, qos, get, and the frames in between -----------
 */

lapse_status_t lapse__broker_qos(lapse__broker_t *broker, uint16_t prefetch,
                                 lapse_error_t *err) {
    amqp_basic_qos(broker->conn, LAPSE__CHANNEL, 0, prefetch, 0);
    return lapse__broker_reply(broker, amqp_get_rpc_reply(broker->conn), "basic.qos",
                               err);
}

lapse_status_t lapse__broker_consume(lapse__broker_t *broker, const char *queue,
                                     const char *tag, lapse_error_t *err) {
    amqp_basic_consume(broker->conn, LAPSE__CHANNEL, amqp_cstring_bytes(queue),
                       amqp_cstring_bytes(tag), 0, 0, 0, amqp_empty_table);
    return lapse__broker_reply(broker, amqp_get_rpc_reply(broker->conn), "basic.consume",
                               err);
}

/* The one place a frame that is not a delivery is handled on a consuming connection (as
 * rabbitmq-c's amqp_consumer.c example does): a close is answered with its close-ok and
 * ends the session; a basic.cancel (the queue was deleted) ends it too; anything else
 * (a heartbeat, a late reply) is let go. */
static lapse_status_t unexpected_frame(lapse__broker_t *broker, lapse_error_t *err) {
    amqp_frame_t frame;
    int st = amqp_simple_wait_frame(broker->conn, &frame);
    if (st != AMQP_STATUS_OK) {
        broker->open = false;
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "consume: %s",
                               amqp_error_string2(st));
    }
    if (frame.frame_type != AMQP_FRAME_METHOD) {
        return LAPSE_OK;
    }
    switch (frame.payload.method.id) {
        case AMQP_CHANNEL_CLOSE_METHOD: {
            amqp_channel_close_t *m = frame.payload.method.decoded;
            amqp_channel_close_ok_t ok = {0};
            amqp_send_method(broker->conn, frame.channel, AMQP_CHANNEL_CLOSE_OK_METHOD,
                             &ok);
            return server_close(broker, "consume", m->reply_code, m->reply_text, false,
                                err);
        }
        case AMQP_CONNECTION_CLOSE_METHOD: {
            amqp_connection_close_t *m = frame.payload.method.decoded;
            amqp_connection_close_ok_t ok = {0};
            amqp_send_method(broker->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
            return server_close(broker, "consume", m->reply_code, m->reply_text, true,
                                err);
        }
        case AMQP_BASIC_CANCEL_METHOD:
            return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED,
                                   "consume: the broker cancelled the consumer");
        default:
            return LAPSE_OK;
    }
}

lapse_status_t lapse__broker_consume_next(lapse__broker_t *broker, amqp_envelope_t *env,
                                          int64_t timeout_ms, bool *got,
                                          lapse_error_t *err) {
    *got = false;
    if (timeout_ms < 0) {
        timeout_ms = 0;
    }
    struct timeval tv = {.tv_sec = timeout_ms / 1000,
                         .tv_usec = (suseconds_t)((timeout_ms % 1000) * 1000)};
    amqp_rpc_reply_t r = amqp_consume_message(broker->conn, env, &tv, 0);
    if (r.reply_type == AMQP_RESPONSE_NORMAL) {
        *got = true;
        return LAPSE_OK;
    }
    if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
        r.library_error == AMQP_STATUS_TIMEOUT) {
        return LAPSE_OK;
    }
    if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
        r.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
        return unexpected_frame(broker, err);
    }
    return lapse__broker_reply(broker, r, "consume", err);
}

void lapse__broker_envelope_clear(lapse__broker_t *broker, amqp_envelope_t *env) {
    amqp_destroy_envelope(env);
    if (broker->conn) {
        amqp_maybe_release_buffers(broker->conn);
    }
}

lapse_status_t lapse__broker_ack(lapse__broker_t *broker, uint64_t tag, bool multiple,
                                 lapse_error_t *err) {
    int st = amqp_basic_ack(broker->conn, LAPSE__CHANNEL, tag, multiple ? 1 : 0);
    if (st != AMQP_STATUS_OK) {
        broker->open = false;
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "ack: %s",
                               amqp_error_string2(st));
    }
    return LAPSE_OK;
}

void lapse__broker_set_rpc_timeout(lapse__broker_t *broker, int64_t timeout_ms) {
    if (timeout_ms < 1) {
        timeout_ms = 1;
    }
    struct timeval tv = {.tv_sec = timeout_ms / 1000,
                         .tv_usec = (suseconds_t)((timeout_ms % 1000) * 1000)};
    amqp_set_rpc_timeout(broker->conn, &tv);
}

lapse_status_t lapse__broker_declare_private(lapse__broker_t *broker,
                                             const amqp_table_t *args, char *name,
                                             size_t cap, lapse_error_t *err) {
    amqp_queue_declare_ok_t *ok =
        amqp_queue_declare(broker->conn, LAPSE__CHANNEL, amqp_empty_bytes, 0, 0, 1, 1,
                           args ? *args : amqp_empty_table);
    lapse_status_t rc = lapse__broker_reply(broker, amqp_get_rpc_reply(broker->conn),
                                            "queue.declare", err);
    if (rc == LAPSE_OK && ok) {
        lapse__bytes_to_str(ok->queue, name, cap);
    }
    return rc;
}

lapse_status_t lapse__broker_get(lapse__broker_t *broker, const char *queue,
                                 amqp_message_t *msg, bool *got, lapse_error_t *err) {
    *got = false;
    amqp_rpc_reply_t r =
        amqp_basic_get(broker->conn, LAPSE__CHANNEL, amqp_cstring_bytes(queue), 1);
    lapse_status_t rc = lapse__broker_reply(broker, r, "basic.get", err);
    if (rc != LAPSE_OK || r.reply.id != AMQP_BASIC_GET_OK_METHOD) {
        return rc; /* get-empty: nothing there yet */
    }
    rc = lapse__broker_reply(broker,
                             amqp_read_message(broker->conn, LAPSE__CHANNEL, msg, 0),
                             "basic.get", err);
    *got = rc == LAPSE_OK;
    return rc;
}

void lapse__broker_message_clear(amqp_message_t *msg) {
    amqp_destroy_message(msg);
}

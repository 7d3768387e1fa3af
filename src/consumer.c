/* SPDX-License-Identifier: MIT
 * Consumer: batches of expired messages -> one store transaction -> one multiple ack. */
#include <lapse/consumer.h>

#include "broker_int.h"
#include "publisher_int.h"
#include "topology_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WINDOW           1000 /* publishes in flight on the publishing connection */
#define BATCH_WINDOW_MS  20  /* how long a batch waits to fill after its first delivery */
#define IDLE_WAIT_MS     500 /* how often an idle consumer looks at the stop flag */
#define CONFIRM_WAIT_MS  30000
#define EVENTS_CHUNK     1000         /* outbox rows published in one go */
#define BACKLOG_EVERY_MS 5000         /* how often an idle consumer looks at the outbox */
#define STORE_ATTEMPTS   12           /* busy retries of one batch (about 15 s) */
#define MAX_EXPIRATION   4294967295LL /* RabbitMQ's largest per-message TTL */

typedef enum action { ACT_CANCEL, ACT_EARLY, ACT_PARK, ACT_DONE } action_t;

typedef struct delivery {
    amqp_envelope_t env;
    lapse_expiry_msg_t msg;
    action_t action;
    int64_t deadline_ms; /* the deadline to wait for (early) */
    char reason[256];    /* why it is parked */
} delivery_t;

struct lapse_consumer {
    const lapse_config_t *cfg;
    lapse_store_t *store;
    lapse__topology_t topo;
    lapse__broker_t in;  /* deliveries and acks */
    lapse__broker_t out; /* parking, re-holding, events: confirm mode */
    delivery_t *batch;
    size_t n;
    size_t cap;
    lapse_cancel_item_t *items;
    size_t *item_of; /* items index -> batch index */
    int64_t *seqs;
    size_t n_seqs;
    lapse_status_t out_failure; /* first failed confirm since the last check */
    lapse_error_t event_error;  /* why the last event publish failed */
    int64_t out_retry_at;       /* when to reopen a failed publishing connection */
    unsigned out_attempt;
    int64_t backlog_at;    /* next look at the outbox */
    int64_t out_polled_at; /* last heartbeat service of the publishing connection */
    lapse_consumer_stats_t stats;
};

static void on_settle(void *opaque, uint64_t tag, lapse_status_t outcome) {
    (void)tag;
    lapse_consumer_t *c = opaque;
    if (outcome != LAPSE_OK && c->out_failure == LAPSE_OK) {
        c->out_failure = outcome;
    }
}

lapse_consumer_t *lapse_consumer_new(const lapse_config_t *cfg, lapse_store_t *store,
                                     lapse_status_t *rc, lapse_error_t *err) {
    lapse_consumer_t *c = calloc(1, sizeof *c);
    if (!c) {
        *rc = lapse_error_set(err, LAPSE_ERR_NOMEM, "consumer");
        return NULL;
    }
    c->cfg = cfg;
    c->store = store;
    c->cap = (size_t)cfg->prefetch;
    c->batch = calloc(c->cap, sizeof *c->batch);
    c->items = calloc(c->cap, sizeof *c->items);
    c->item_of = calloc(c->cap, sizeof *c->item_of);
    c->seqs = calloc(c->cap > EVENTS_CHUNK ? c->cap : EVENTS_CHUNK, sizeof *c->seqs);
    if (!c->batch || !c->items || !c->item_of || !c->seqs) {
        lapse_consumer_free(c);
        *rc = lapse_error_set(err, LAPSE_ERR_NOMEM, "consumer batch");
        return NULL;
    }
    lapse__topology_build(cfg, &c->topo);
    *rc = LAPSE_OK;
    return c;
}

void lapse_consumer_get_stats(const lapse_consumer_t *c, lapse_consumer_stats_t *out) {
    *out = c->stats;
}

static void drop_batch(lapse_consumer_t *c) {
    for (size_t i = 0; i < c->n; i++) {
        amqp_destroy_envelope(&c->batch[i].env);
    }
    c->n = 0;
    if (c->in.conn) {
        amqp_maybe_release_buffers(c->in.conn);
    }
}

void lapse_consumer_free(lapse_consumer_t *c) {
    if (!c) {
        return;
    }
    if (c->batch) {
        drop_batch(c);
    }
    lapse__broker_close(&c->in);
    lapse__broker_close(&c->out);
    free(c->batch);
    free(c->items);
    free(c->item_of);
    free(c->seqs);
    free(c);
}

/* Log values must stay one token: quotes in reasons become apostrophes. */
static void sanitize(char *text) {
    for (char *p = text; *p; p++) {
        if (*p == '"' || *p == '\n' || *p == '\r') {
            *p = '\'';
        }
    }
}

/* Handle a frame that is not a delivery on the consuming connection. */
static lapse_status_t unexpected_frame(lapse_consumer_t *c, lapse_error_t *err) {
    amqp_frame_t frame;
    int st = amqp_simple_wait_frame(c->in.conn, &frame);
    if (st != AMQP_STATUS_OK) {
        c->in.open = false;
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "consume: %s",
                               amqp_error_string2(st));
    }
    if (frame.frame_type != AMQP_FRAME_METHOD) {
        return LAPSE_OK;
    }
    switch (frame.payload.method.id) {
        case AMQP_CHANNEL_CLOSE_METHOD: {
            amqp_channel_close_t *m = frame.payload.method.decoded;
            char text[128];
            lapse__bytes_to_str(m->reply_text, text, sizeof text);
            amqp_channel_close_ok_t ok = {0};
            amqp_send_method(c->in.conn, frame.channel, AMQP_CHANNEL_CLOSE_OK_METHOD,
                             &ok);
            c->in.open = false;
            return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED,
                                   "consume: broker closed the channel: %u %s",
                                   m->reply_code, text);
        }
        case AMQP_CONNECTION_CLOSE_METHOD: {
            amqp_connection_close_t *m = frame.payload.method.decoded;
            char text[128];
            lapse__bytes_to_str(m->reply_text, text, sizeof text);
            amqp_connection_close_ok_t ok = {0};
            amqp_send_method(c->in.conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
            c->in.open = false;
            return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED,
                                   "consume: broker closed the connection: %u %s",
                                   m->reply_code, text);
        }
        case AMQP_BASIC_CANCEL_METHOD:
            /* The queue was deleted: resume on a fresh connection once it is back. */
            return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED,
                                   "consume: the broker cancelled the consumer");
        default:
            return LAPSE_OK;
    }
}

/* Wait for one delivery (up to IDLE_WAIT_MS), then take more for up to BATCH_WINDOW_MS
 * or until the batch holds prefetch deliveries. */
static lapse_status_t collect(lapse_consumer_t *c, lapse_error_t *err) {
    int64_t started = 0;
    while (c->n < c->cap) {
        int64_t wait_ms = IDLE_WAIT_MS;
        if (c->n > 0) {
            wait_ms = BATCH_WINDOW_MS - (lapse_clock_now_ms() - started);
            if (wait_ms <= 0) {
                break;
            }
        }
        struct timeval tv = {.tv_sec = wait_ms / 1000,
                             .tv_usec = (suseconds_t)((wait_ms % 1000) * 1000)};
        delivery_t *d = &c->batch[c->n];
        amqp_rpc_reply_t r = amqp_consume_message(c->in.conn, &d->env, &tv, 0);
        if (r.reply_type == AMQP_RESPONSE_NORMAL) {
            if (c->n++ == 0) {
                started = lapse_clock_now_ms();
            }
            continue;
        }
        if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            r.library_error == AMQP_STATUS_TIMEOUT) {
            break;
        }
        if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            r.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
            lapse_status_t rc = unexpected_frame(c, err);
            if (rc != LAPSE_OK) {
                return rc;
            }
            continue;
        }
        return lapse__broker_reply(&c->in, r, "consume", err);
    }
    return LAPSE_OK;
}

/* Headers lapse sets when parking; a replayed and re-parked message gets fresh ones. */
static bool is_own_header(amqp_bytes_t key) {
    static const char *const own[] = {LAPSE_HDR_REASON, "x-lapse-parked-at-ms"};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) {
        if (key.len == strlen(own[i]) && memcmp(key.bytes, own[i], key.len) == 0) {
            return true;
        }
    }
    return false;
}

static lapse_status_t park(lapse_consumer_t *c, delivery_t *d, lapse_error_t *err) {
    /* The parked copy keeps the body and properties and adds why it was parked. */
    amqp_basic_properties_t props = d->env.message.properties;
    amqp_table_t old =
        (props._flags & AMQP_BASIC_HEADERS_FLAG) ? props.headers : amqp_empty_table;
    amqp_table_entry_t *entries = calloc((size_t)old.num_entries + 2, sizeof *entries);
    if (!entries) {
        return lapse_error_set(err, LAPSE_ERR_NOMEM, "park headers");
    }
    int n = 0;
    for (int i = 0; i < old.num_entries; i++) {
        if (!is_own_header(old.entries[i].key)) {
            entries[n++] = old.entries[i];
        }
    }
    entries[n++] = lapse__entry_str(LAPSE_HDR_REASON, d->reason);
    entries[n++] = lapse__entry_i64("x-lapse-parked-at-ms", lapse_clock_now_ms());
    props.headers.num_entries = n;
    props.headers.entries = entries;
    /* Parked messages wait for an operator: never let them expire. */
    props._flags &= ~(amqp_flags_t)AMQP_BASIC_EXPIRATION_FLAG;
    props._flags |= AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG;
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    char key[LAPSE_ORDER_ID_MAX + 1] = "";
    if (props._flags & AMQP_BASIC_MESSAGE_ID_FLAG) {
        lapse__bytes_to_str(props.message_id, key, sizeof key);
    }
    lapse_status_t rc = lapse__broker_publish(&c->out, c->topo.parked_exchange, "", true,
                                              &props, d->env.message.body.bytes,
                                              d->env.message.body.len, key, NULL, err);
    free(entries);
    return rc;
}

/* Classify every delivery; cancel the due ones in one transaction. */
static lapse_status_t decide(lapse_consumer_t *c, int64_t now,
                             const volatile sig_atomic_t *stop, lapse_error_t *err) {
    size_t n_items = 0;
    for (size_t i = 0; i < c->n; i++) {
        delivery_t *d = &c->batch[i];
        lapse_error_t derr = {0};
        amqp_bytes_t body = d->env.message.body;
        /* Slots are reused across batches and decode leaves msg alone on failure: clear
         * it, or a parked line would name the order of an earlier delivery. */
        memset(&d->msg, 0, sizeof d->msg);
        if (lapse_expiry_msg_decode(body.bytes, body.len, &d->msg, &derr) != LAPSE_OK) {
            d->action = ACT_PARK;
            snprintf(d->reason, sizeof d->reason, "%s: %s", lapse_status_name(derr.code),
                     derr.text);
        } else {
            /* The store's deadline decides, not the message's: a forged or stale
             * deadline can neither cancel early nor hold a message back. */
            d->action = ACT_CANCEL;
            c->items[n_items] = (lapse_cancel_item_t){.order_id = d->msg.order_id};
            c->item_of[n_items++] = i;
        }
    }
    lapse_status_t rc = LAPSE_OK;
    /* Bounded: while we sleep nobody services the consuming connection's heartbeats;
     * past the bound the batch goes back to the broker (unacked) and the session is
     * retried from the start. */
    for (unsigned attempt = 0; n_items > 0; attempt++) {
        rc = lapse_store_cancel_batch(c->store, c->items, n_items, now, err);
        if (rc != LAPSE_ERR_STORE_BUSY || attempt == STORE_ATTEMPTS) {
            break;
        }
        lapse__log(c->cfg, LAPSE_LOG_WARN, "event=store_retry op=cancel attempt=%u",
                   attempt + 1);
        if (!lapse__sleep_ms(lapse__backoff_ms(attempt, 50, 2000), stop)) {
            return lapse_error_set(err, LAPSE_ERR_STOPPED,
                                   "stopped while the store was busy");
        }
    }
    if (rc != LAPSE_OK) {
        return rc;
    }
    c->n_seqs = 0;
    for (size_t k = 0; k < n_items; k++) {
        const lapse_cancel_item_t *it = &c->items[k];
        delivery_t *d = &c->batch[c->item_of[k]];
        switch (it->outcome) {
            case LAPSE_CANCEL_DONE:
                d->action = ACT_DONE;
                c->seqs[c->n_seqs++] = it->event_seq;
                c->stats.cancelled++;
                lapse__log(c->cfg, LAPSE_LOG_INFO,
                           "event=decision order_id=%s decision=cancelled lag_ms=%lld "
                           "redelivered=%d",
                           it->order_id, (long long)(now - it->deadline_ms),
                           d->env.redelivered ? 1 : 0);
                break;
            case LAPSE_CANCEL_NOOP_PAID:
            case LAPSE_CANCEL_NOOP_CANCELLED:
                d->action = ACT_DONE;
                c->stats.noops++;
                lapse__log(c->cfg, LAPSE_LOG_INFO,
                           "event=decision order_id=%s decision=%s redelivered=%d",
                           it->order_id, lapse_cancel_outcome_name(it->outcome),
                           d->env.redelivered ? 1 : 0);
                break;
            case LAPSE_CANCEL_EARLY:
                d->action = ACT_EARLY;
                d->deadline_ms = it->deadline_ms;
                break;
            case LAPSE_CANCEL_UNKNOWN:
                d->action = ACT_PARK;
                snprintf(d->reason, sizeof d->reason, "unknown order: %s", it->order_id);
                break;
        }
    }
    return LAPSE_OK;
}

/* Publish the parked and re-held deliveries; all must be confirmed before the ack. */
static lapse_status_t forward(lapse_consumer_t *c, int64_t now, lapse_error_t *err) {
    char exchange[LAPSE__NAME_MAX];
    snprintf(exchange, sizeof exchange, "%s", c->topo.hold_exchange);
    lapse_status_t rc = LAPSE_OK;
    size_t forwarded = 0;
    for (size_t i = 0; i < c->n && rc == LAPSE_OK; i++) {
        delivery_t *d = &c->batch[i];
        if (d->action == ACT_PARK) {
            /* The header keeps the decoder's words; the log line must stay one token. */
            char logged[sizeof d->reason];
            memcpy(logged, d->reason, sizeof logged);
            sanitize(logged);
            lapse__log(c->cfg, LAPSE_LOG_WARN,
                       "event=decision order_id=%s decision=parked reason=\"%s\"",
                       d->msg.order_id[0] ? d->msg.order_id : "-", logged);
            rc = park(c, d, err);
            c->stats.parked++;
            forwarded++;
        } else if (d->action == ACT_EARLY) {
            /* Never act early: wait for the remainder, then come back through the
             * expired exchange. The TTL runs on the broker, so this cannot spin. */
            int64_t remaining = d->deadline_ms - now;
            lapse__log(c->cfg, LAPSE_LOG_INFO,
                       "event=decision order_id=%s decision=early remaining_ms=%lld",
                       d->msg.order_id, (long long)remaining);
            d->msg.deadline_ms = d->deadline_ms;
            /* A remainder beyond RabbitMQ's TTL limit waits the limit and comes back
             * to be held again. */
            int64_t ttl = remaining < 1                ? 1
                          : remaining > MAX_EXPIRATION ? MAX_EXPIRATION
                                                       : remaining;
            rc = lapse__publish_expiry(&c->out, exchange, LAPSE__RK_EARLY, &d->msg, ttl,
                                       NULL, err);
            c->stats.early++;
            forwarded++;
        }
    }
    if (rc == LAPSE_OK && forwarded > 0) {
        rc = lapse__broker_wait_confirms(&c->out, CONFIRM_WAIT_MS, err);
    }
    if (rc == LAPSE_OK && c->out_failure != LAPSE_OK) {
        rc = lapse_error_set(err, c->out_failure, "forwarding a delivery: %s",
                             lapse_strerror(c->out_failure));
        c->out_failure = LAPSE_OK;
    }
    return rc;
}

static int publish_event(void *opaque, const lapse_event_t *ev) {
    lapse_consumer_t *c = opaque;
    amqp_basic_properties_t props;
    memset(&props, 0, sizeof props);
    props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
                   AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TIMESTAMP_FLAG |
                   AMQP_BASIC_APP_ID_FLAG | AMQP_BASIC_TYPE_FLAG;
    props.content_type = amqp_cstring_bytes("application/json");
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    props.message_id = amqp_cstring_bytes(ev->event_id);
    props.timestamp = (uint64_t)(lapse_clock_now_ms() / 1000);
    props.app_id = amqp_cstring_bytes(LAPSE_APP_ID);
    props.type = amqp_cstring_bytes(LAPSE_EVENT_CANCELLED);
    /* Not mandatory: an events exchange nobody listens to is a normal deployment. */
    if (lapse__broker_publish(&c->out, c->topo.events_exchange, LAPSE_EVENT_CANCELLED,
                              false, &props, ev->body, strlen(ev->body), ev->event_id,
                              NULL, &c->event_error) != LAPSE_OK) {
        return 1;
    }
    c->seqs[c->n_seqs++] = ev->seq;
    return 0;
}

/* Publish outbox events (only those in `only` when given; it must not alias c->seqs),
 * confirmed, then mark them published. A crash in between re-publishes them: the event
 * id stays the same, so downstream deduplicates. */
static lapse_status_t publish_events(lapse_consumer_t *c, const int64_t *only,
                                     size_t n_only, size_t limit, lapse_error_t *err) {
    c->n_seqs = 0;
    lapse_error_clear(&c->event_error);
    lapse_status_t rc =
        lapse_store_events_pending(c->store, limit, only, n_only, publish_event, c, err);
    if (rc == LAPSE_OK && c->event_error.code != LAPSE_OK) {
        rc = lapse_error_set(err, c->event_error.code, "%s", c->event_error.text);
    }
    if (rc == LAPSE_OK && c->n_seqs > 0) {
        rc = lapse__broker_wait_confirms(&c->out, CONFIRM_WAIT_MS, err);
    }
    if (rc == LAPSE_OK && c->out_failure != LAPSE_OK) {
        rc = lapse_error_set(err, c->out_failure, "publishing events");
        c->out_failure = LAPSE_OK;
    }
    if (rc == LAPSE_OK && c->n_seqs > 0) {
        rc = lapse_store_events_mark_published(c->store, c->seqs, c->n_seqs,
                                               lapse_clock_now_ms(), err);
        if (rc == LAPSE_OK) {
            c->stats.events += c->n_seqs;
        }
    }
    return rc;
}

static void out_failed(lapse_consumer_t *c, lapse_status_t rc, const lapse_error_t *why,
                       const char *what) {
    char text[sizeof why->text];
    snprintf(text, sizeof text, "%s", why->text);
    sanitize(text);
    int64_t delay = lapse__backoff_ms(c->out_attempt++, 200, 10000);
    lapse__log(c->cfg, LAPSE_LOG_WARN,
               "event=%s status=%s reason=\"%s\" retry_in_ms=%lld", what,
               lapse_status_name(rc), text, (long long)delay);
    lapse__broker_close(&c->out);
    c->out_failure = LAPSE_OK;
    c->out_retry_at = lapse_clock_now_ms() + delay;
}

/* The publishing connection fails on its own (an events exchange deleted, a missed
 * heartbeat): reopen it with backoff, without stopping the consuming side. */
static lapse_status_t ensure_out(lapse_consumer_t *c, lapse_error_t *err) {
    if (c->out.open) {
        return LAPSE_OK;
    }
    if (lapse_clock_now_ms() < c->out_retry_at) {
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED,
                               "publishing connection down, retrying later");
    }
    char name[96];
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    snprintf(name, sizeof name, "lapse consume %s/%d out", host, (int)getpid());
    lapse_status_t rc =
        lapse__broker_open(&c->out, c->cfg, name, WINDOW, on_settle, c, err);
    if (rc != LAPSE_OK) {
        out_failed(c, rc, err, "out_connect_failed");
        return rc;
    }
    c->out_attempt = 0;
    return LAPSE_OK;
}

/* Events are published after the ack; a failure leaves them in the outbox for a later
 * try and never holds up cancelling. */
static void events_step(lapse_consumer_t *c, const int64_t *only, size_t n_only,
                        size_t limit) {
    lapse_error_t err = {0};
    if (ensure_out(c, &err) != LAPSE_OK) {
        return;
    }
    lapse_status_t rc = publish_events(c, only, n_only, limit, &err);
    if (rc != LAPSE_OK) {
        out_failed(c, rc, &err, "events_failed");
    } else if (!only && c->n_seqs == limit) {
        c->backlog_at = 0; /* more waiting: look again on the next idle pass */
    }
}

static lapse_status_t process(lapse_consumer_t *c, const volatile sig_atomic_t *stop,
                              lapse_error_t *err) {
    int64_t now = lapse_clock_now_ms();
    c->stats.deliveries += c->n;
    lapse_status_t rc = decide(c, now, stop, err);
    bool forwards = false;
    for (size_t i = 0; i < c->n; i++) {
        forwards |= c->batch[i].action == ACT_PARK || c->batch[i].action == ACT_EARLY;
    }
    if (rc == LAPSE_OK && forwards) {
        rc = ensure_out(c, err);
    }
    if (rc == LAPSE_OK && forwards) {
        rc = forward(c, now, err);
    }
    if (rc != LAPSE_OK) {
        return rc; /* nothing acked: the broker redelivers the batch */
    }
    /* The store committed and every forward was confirmed: one ack covers the batch. */
    uint64_t last = c->batch[c->n - 1].env.delivery_tag;
    int st = amqp_basic_ack(c->in.conn, LAPSE__CHANNEL, last, 1);
    if (st != AMQP_STATUS_OK) {
        c->in.open = false;
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "ack: %s",
                               amqp_error_string2(st));
    }
    if (c->n_seqs > 0) {
        int64_t seqs[c->n_seqs];
        size_t n_seqs = c->n_seqs;
        memcpy(seqs, c->seqs, n_seqs * sizeof *seqs);
        events_step(c, seqs, n_seqs, n_seqs);
    }
    return LAPSE_OK;
}

static lapse_status_t connect_all(lapse_consumer_t *c, lapse_error_t *err) {
    char name[96];
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    snprintf(name, sizeof name, "lapse consume %s/%d", host, (int)getpid());
    c->out_retry_at = 0;
    lapse_status_t rc = ensure_out(c, err);
    if (rc == LAPSE_OK) {
        rc = lapse__broker_open(&c->in, c->cfg, name, 0, NULL, NULL, err);
    }
    if (rc == LAPSE_OK) {
        amqp_basic_qos(c->in.conn, LAPSE__CHANNEL, 0, (uint16_t)c->cfg->prefetch, 0);
        rc =
            lapse__broker_reply(&c->in, amqp_get_rpc_reply(c->in.conn), "basic.qos", err);
    }
    if (rc == LAPSE_OK) {
        amqp_basic_consume(c->in.conn, LAPSE__CHANNEL,
                           amqp_cstring_bytes(c->topo.expired_queue),
                           amqp_cstring_bytes(name), 0, 0, 0, amqp_empty_table);
        rc = lapse__broker_reply(&c->in, amqp_get_rpc_reply(c->in.conn),
                                 "consume from the expired queue", err);
    }
    return rc;
}

/* After every batch or idle wait: keep the publishing connection alive (heartbeats,
 * late frames) even when nothing is published for a while, and publish the outbox
 * backlog now and then. */
static void housekeeping(lapse_consumer_t *c) {
    lapse_error_t err = {0};
    int64_t now = lapse_clock_now_ms();
    if (c->out.open && now - c->out_polled_at >= 1000) {
        c->out_polled_at = now;
        lapse_status_t rc = lapse__broker_poll(&c->out, 0, &err);
        if (rc != LAPSE_OK) {
            out_failed(c, rc, &err, "out_connection_lost");
        }
    }
    if (now >= c->backlog_at) {
        c->backlog_at = now + BACKLOG_EVERY_MS;
        events_step(c, NULL, 0, EVENTS_CHUNK);
    }
}

static lapse_status_t session(lapse_consumer_t *c, const volatile sig_atomic_t *stop,
                              bool *progress, lapse_error_t *err) {
    lapse_status_t rc = connect_all(c, err);
    if (rc == LAPSE_OK) {
        lapse__log(c->cfg, LAPSE_LOG_INFO, "event=consuming queue=%s prefetch=%d",
                   c->topo.expired_queue, c->cfg->prefetch);
        /* Events left unpublished by an earlier crash or outage go out first. */
        c->backlog_at = 0;
    }
    while (rc == LAPSE_OK && !*stop) {
        rc = collect(c, err);
        if (rc == LAPSE_OK && c->n > 0) {
            rc = process(c, stop, err);
            *progress |= rc == LAPSE_OK;
        }
        if (rc == LAPSE_OK) {
            housekeeping(c);
        }
        drop_batch(c);
    }
    drop_batch(c);
    lapse__broker_close(&c->in);
    lapse__broker_close(&c->out);
    c->out_failure = LAPSE_OK;
    return rc;
}

lapse_status_t lapse_consumer_run(lapse_consumer_t *c, const volatile sig_atomic_t *stop,
                                  lapse_error_t *err) {
    unsigned attempt = 0;
    while (!*stop) {
        bool progress = false;
        lapse_status_t rc = session(c, stop, &progress, err);
        if (rc == LAPSE_OK || rc == LAPSE_ERR_STOPPED) {
            break;
        }
        /* A service outlasts what it can: only a refused login or a wrong setting
         * ends it; store and broker failures are retried with backoff. */
        if (rc == LAPSE_ERR_BROKER_LOGIN || rc == LAPSE_ERR_INVALID ||
            (rc <= -0x0401 && rc >= -0x04ff)) {
            return rc;
        }
        attempt = progress ? 0 : attempt + 1;
        int64_t delay = lapse__backoff_ms(attempt, 200, 10000);
        c->stats.reconnects++;
        char text[sizeof err->text] = "";
        if (err) {
            snprintf(text, sizeof text, "%s", err->text);
            sanitize(text);
        }
        lapse__log(c->cfg, LAPSE_LOG_WARN,
                   "event=reconnect status=%s reason=\"%s\" attempt=%u delay_ms=%lld",
                   lapse_status_name(rc), text, attempt, (long long)delay);
        lapse__sleep_ms(delay, stop);
    }
    lapse__log(c->cfg, LAPSE_LOG_INFO,
               "event=stopped deliveries=%llu cancelled=%llu noops=%llu early=%llu "
               "parked=%llu events=%llu",
               (unsigned long long)c->stats.deliveries,
               (unsigned long long)c->stats.cancelled, (unsigned long long)c->stats.noops,
               (unsigned long long)c->stats.early, (unsigned long long)c->stats.parked,
               (unsigned long long)c->stats.events);
    return LAPSE_OK;
}

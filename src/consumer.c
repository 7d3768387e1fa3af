/* SPDX-License-Identifier: MIT
 * Consumer: batches of expired messages -> one store transaction -> one multiple ack. */
#include "consumer_int.h"

#include "publisher_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

lapse_consumer_t *lapse_consumer_new(const lapse_config_t *cfg, lapse_store_t *store,
                                     lapse_status_t *rc, lapse_error_t *err) {
    lapse_consumer_t *c = calloc(1, sizeof *c);
    if (!c) {
        *rc = lapse_error_set(err, LAPSE_ERR_NOMEM, "consumer");
        return NULL;
    }
    c->cfg = cfg;
    c->store = store;
    /* Batches of half the prefetch: while one batch is decided, committed and acked, the
     * broker already sends the next one instead of waiting for the ack. */
    c->cap = cfg->prefetch > 1 ? (size_t)cfg->prefetch / 2 : 1;
    c->batch = calloc(c->cap, sizeof *c->batch);
    c->items = calloc(c->cap, sizeof *c->items);
    c->item_of = calloc(c->cap, sizeof *c->item_of);
    c->item_failed = calloc(c->cap, sizeof *c->item_failed);
    c->seqs = calloc(c->cap, sizeof *c->seqs);
    c->owed = calloc(CONSUMER_OWED_MAX, sizeof *c->owed);
    if (!c->batch || !c->items || !c->item_of || !c->item_failed || !c->seqs ||
        !c->owed) {
        lapse_consumer_free(c);
        *rc = lapse_error_set(err, LAPSE_ERR_NOMEM, "consumer batch");
        return NULL;
    }
    lapse__topology_build(cfg, &c->topo);
    c->skew = (skew_t){.current = INT64_MAX, .previous = INT64_MAX};
    /* Shown in the management UI for both connections and as the consumer tag. */
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    snprintf(c->name, sizeof c->name, "lapse consume %s/%d", host, (int)getpid());
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
    free(c->item_failed);
    free(c->seqs);
    free(c->owed);
    free(c);
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

/* Wait for one delivery (up to CONSUMER_IDLE_WAIT_MS), then take more for up to
 * CONSUMER_BATCH_WINDOW_MS or until the batch holds prefetch deliveries. */
static lapse_status_t collect(lapse_consumer_t *c, lapse_error_t *err) {
    int64_t started = 0;
    while (c->n < c->cap) {
        int64_t wait_ms = CONSUMER_IDLE_WAIT_MS;
        if (c->n == 0 && c->n_owed > 0) { /* owed events must not wait for traffic */
            int64_t due = c->owed_since + CONSUMER_EVENTS_DELAY_MS;
            int64_t backoff = lapse__consumer_owed_due(c);
            due = backoff > due ? backoff : due;
            int64_t until_due = due - lapse_clock_now_ms();
            if (until_due <= 0) {
                break;
            }
            wait_ms =
                until_due < CONSUMER_IDLE_WAIT_MS ? until_due : CONSUMER_IDLE_WAIT_MS;
        }
        if (c->n > 0) {
            wait_ms = CONSUMER_BATCH_WINDOW_MS - (lapse_clock_now_ms() - started);
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

/* The x-lapse-attempts header (failed attempts so far), 0 when absent. */
static int attempts_of(const amqp_basic_properties_t *props) {
    if (!(props->_flags & AMQP_BASIC_HEADERS_FLAG)) {
        return 0;
    }
    for (int i = 0; i < props->headers.num_entries; i++) {
        const amqp_table_entry_t *h = &props->headers.entries[i];
        if (h->key.len == strlen(LAPSE_HDR_ATTEMPTS) &&
            memcmp(h->key.bytes, LAPSE_HDR_ATTEMPTS, h->key.len) == 0) {
            int64_t v = h->value.kind == AMQP_FIELD_KIND_I64   ? h->value.value.i64
                        : h->value.kind == AMQP_FIELD_KIND_I32 ? h->value.value.i32
                        : h->value.kind == AMQP_FIELD_KIND_U8  ? h->value.value.u8
                                                               : 0;
            return v < 0 ? 0 : v > 1000000 ? 1000000 : (int)v;
        }
    }
    return 0;
}

/* Never early, even with a local clock that runs ahead of the broker's: a message the
 * broker dead-lettered at broker time T (x-death) is received at broker time >= T, so
 * local_now - T bounds from above how far the local clock is ahead. The smallest such
 * sample of the last minute or two is the bound; once it exceeds the resolution of T,
 * "now" is taken as local_now - bound, which is never later than the broker's now.
 * Every delivery is sampled. One that waited in a backlog adds its wait to its sample,
 * so after a backlog some on-time messages look early and take one more trip down the
 * ladder: late, never early. (Sampling only deliveries that found the queue empty was
 * tried and dropped: a batch with no such delivery then had no bound at all, and the
 * ladder test d caught an order cancelled 2 s early.) */
static int64_t effective_now(lapse_consumer_t *c, int64_t local_now) {
    skew_t *s = &c->skew;
    if (local_now - s->bucket_at >= CONSUMER_SKEW_BUCKET_MS) {
        /* A bucket without samples (a long backlog) keeps the last bound known. */
        if (s->current != INT64_MAX) {
            s->previous = s->current;
        }
        s->current = INT64_MAX;
        s->bucket_at = local_now;
    }
    for (size_t i = 0; i < c->n; i++) {
        delivery_t *d = &c->batch[i];
        int64_t at = lapse__dead_lettered_at_ms(&d->env.message.properties);
        d->undated = at < 0;
        d->attempts = attempts_of(&d->env.message.properties);
        if (at >= 0) {
            lapse__consumer_skew_sample(c, local_now - at);
        }
    }
    int64_t bound = lapse__consumer_skew_bound(c);
    if (bound == 0) {
        if (c->skew_logged != 0) {
            c->skew_logged = 0;
            lapse__log(c->cfg, LAPSE_LOG_INFO, "event=clock_skew ahead_by_up_to_ms=0");
        }
        return local_now;
    }
    if (bound / 1000 != c->skew_logged / 1000) {
        c->skew_logged = bound;
        lapse__log(c->cfg, LAPSE_LOG_WARN,
                   "event=clock_skew ahead_by_up_to_ms=%lld note=\"deadlines are checked "
                   "against the broker's clock\"",
                   (long long)bound);
    }
    return local_now - bound;
}

int64_t lapse__consumer_skew_bound(const lapse_consumer_t *c) {
    int64_t bound =
        c->skew.current < c->skew.previous ? c->skew.current : c->skew.previous;
    return bound == INT64_MAX || bound <= CONSUMER_SKEW_TOLERANCE_MS ? 0 : bound;
}

/* Cancel items (the due ones) in one transaction; a busy store is retried a little. */
static lapse_status_t cancel_items(lapse_consumer_t *c, lapse_cancel_item_t *items,
                                   size_t n, int64_t now,
                                   const volatile sig_atomic_t *stop,
                                   lapse_error_t *err) {
    lapse_status_t rc = LAPSE_OK;
    /* Bounded: while we wait nobody services the consuming connection's heartbeats;
     * past the bound the deliveries take the retry path. */
    for (unsigned attempt = 0; n > 0; attempt++) {
        rc = lapse_store_cancel_batch(c->store, items, n, now, err);
        if (rc != LAPSE_ERR_STORE_BUSY || attempt + 1 == CONSUMER_STORE_ATTEMPTS) {
            break;
        }
        lapse__log(c->cfg, LAPSE_LOG_WARN, "event=store_retry op=cancel attempt=%u",
                   attempt + 1);
        if (!lapse__sleep_ms(lapse__backoff_ms(attempt, 50, 2000), stop)) {
            return lapse_error_set(err, LAPSE_ERR_STOPPED,
                                   "stopped while the store was busy");
        }
    }
    return rc;
}

static bool is_store_failure(lapse_status_t rc) {
    return rc <= -0x0201 && rc >= -0x02ff;
}

/* Settle items[first..first+n): on LAPSE_OK every item has an outcome or is marked
 * failed (with why in its delivery's reason). A store that fails for the whole batch
 * marks them all; a statement that fails (not a busy store) is retried one item per
 * transaction, so that one poisoned order cannot hold back the others. */
static lapse_status_t settle_items(lapse_consumer_t *c, size_t first, size_t n,
                                   int64_t now, const volatile sig_atomic_t *stop,
                                   lapse_error_t *err) {
    lapse_cancel_item_t *items = c->items + first;
    for (size_t k = 0; k < n; k++) {
        c->item_failed[first + k] = false;
    }
    lapse_error_t why = {0};
    lapse_status_t rc = cancel_items(c, items, n, now, stop, &why);
    if (rc == LAPSE_OK || n == 0) {
        return LAPSE_OK;
    }
    if (!is_store_failure(rc)) {
        return lapse_error_set(err, rc, "%s", why.text);
    }
    for (size_t k = 0; k < n; k++) {
        lapse_error_t one = why;
        lapse_status_t orc = rc;
        if (rc != LAPSE_ERR_STORE_BUSY && n > 1) {
            orc = cancel_items(c, items + k, 1, now, stop, &one);
            if (orc == LAPSE_ERR_STOPPED) {
                return lapse_error_set(err, orc, "%s", one.text);
            }
        }
        if (orc != LAPSE_OK) {
            c->item_failed[first + k] = true;
            delivery_t *d = &c->batch[c->item_of[first + k]];
            snprintf(d->reason, sizeof d->reason, "%s: %s", lapse_status_name(orc),
                     one.text);
        }
    }
    return LAPSE_OK;
}

/* Classify every delivery; cancel the due ones in one transaction. */
static lapse_status_t decide(lapse_consumer_t *c, int64_t now,
                             const volatile sig_atomic_t *stop, lapse_error_t *err) {
    /* Dated deliveries first, undated ones after them. */
    size_t n_dated = 0;
    size_t n_items = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < c->n; i++) {
            delivery_t *d = &c->batch[i];
            if (d->undated != (pass == 1)) {
                continue;
            }
            lapse_error_t derr = {0};
            amqp_bytes_t body = d->env.message.body;
            /* Slots are reused across batches and decode leaves msg alone on failure:
             * clear it, or a parked line would name the order of an earlier delivery. */
            memset(&d->msg, 0, sizeof d->msg);
            if (lapse_expiry_msg_decode(body.bytes, body.len, &d->msg, &derr) !=
                LAPSE_OK) {
                d->action = ACT_PARK;
                snprintf(d->reason, sizeof d->reason, "%s: %s",
                         lapse_status_name(derr.code), derr.text);
            } else {
                /* The store's deadline decides, not the message's: a forged or stale
                 * deadline can neither cancel early nor hold a message back. */
                d->action = ACT_CANCEL;
                c->items[n_items] = (lapse_cancel_item_t){.order_id = d->msg.order_id};
                c->item_of[n_items++] = i;
            }
        }
        if (pass == 0) {
            n_dated = n_items;
        }
    }
    lapse_status_t rc = settle_items(c, 0, n_dated, now, stop, err);
    /* A message the broker never held (published straight into the expired exchange,
     * e.g. a replay by hand) has no broker time to check its deadline against: it is
     * not cancelled on arrival but goes once down the ladder (now 0: pending orders come
     * back as early; paid, cancelled and unknown ones are settled as usual). */
    if (rc == LAPSE_OK) {
        rc = settle_items(c, n_dated, n_items - n_dated, 0, stop, err);
    }
    if (rc != LAPSE_OK) {
        return rc;
    }
    c->n_seqs = 0;
    for (size_t k = 0; k < n_items; k++) {
        const lapse_cancel_item_t *it = &c->items[k];
        delivery_t *d = &c->batch[c->item_of[k]];
        if (c->item_failed[k]) {
            d->action = ACT_RETRY;
            continue;
        }
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

static lapse_status_t process(lapse_consumer_t *c, const volatile sig_atomic_t *stop,
                              lapse_error_t *err) {
    int64_t now = effective_now(c, lapse_clock_now_ms());
    c->stats.deliveries += c->n;
    lapse_status_t rc = decide(c, now, stop, err);
    bool forwards = false;
    for (size_t i = 0; i < c->n; i++) {
        forwards |= c->batch[i].action == ACT_PARK || c->batch[i].action == ACT_EARLY ||
                    c->batch[i].action == ACT_RETRY;
    }
    if (rc == LAPSE_OK && forwards) {
        rc = lapse__consumer_ensure_out(c, err);
    }
    c->batch_settled = false;
    if (rc == LAPSE_OK && forwards) {
        rc = lapse__consumer_forward(c, now, err);
    }
    if (rc != LAPSE_OK) {
        return rc; /* nothing acked: the broker redelivers the batch */
    }
    /* The store committed and every forward was confirmed: one ack covers the batch
     * (unless a forward failed and the batch was settled delivery by delivery). */
    uint64_t last = c->batch[c->n - 1].env.delivery_tag;
    int st = c->batch_settled ? AMQP_STATUS_OK
                              : amqp_basic_ack(c->in.conn, LAPSE__CHANNEL, last, 1);
    if (st != AMQP_STATUS_OK) {
        c->in.open = false;
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "ack: %s",
                               amqp_error_string2(st));
    }
    /* This batch's events go out with the next ones, within CONSUMER_EVENTS_DELAY_MS:
     * one confirmed publish round and one store write for several batches. */
    lapse__consumer_owe(c, c->seqs, c->n_seqs);
    return LAPSE_OK;
}

static lapse_status_t connect_all(lapse_consumer_t *c, lapse_error_t *err) {
    c->out_retry_at = 0;
    lapse_status_t rc = lapse__consumer_ensure_out(c, err);
    if (rc == LAPSE_OK) {
        rc = lapse__broker_open(&c->in, c->cfg, c->name, 0, NULL, NULL, err);
    }
    if (rc == LAPSE_OK) {
        lapse__consumer_probe_clock(c);
        amqp_basic_qos(c->in.conn, LAPSE__CHANNEL, 0, (uint16_t)c->cfg->prefetch, 0);
        rc =
            lapse__broker_reply(&c->in, amqp_get_rpc_reply(c->in.conn), "basic.qos", err);
    }
    if (rc == LAPSE_OK) {
        amqp_basic_consume(c->in.conn, LAPSE__CHANNEL,
                           amqp_cstring_bytes(c->topo.expired_queue),
                           amqp_cstring_bytes(c->name), 0, 0, 0, amqp_empty_table);
        rc = lapse__broker_reply(&c->in, amqp_get_rpc_reply(c->in.conn),
                                 "consume from the expired queue", err);
    }
    return rc;
}

static lapse_status_t session(lapse_consumer_t *c, const volatile sig_atomic_t *stop,
                              bool *progress, lapse_error_t *err) {
    /* A missing queue or exchange is named with its fix before forwards fail on it. */
    lapse__topology_check(c->cfg, &c->topo, NULL, NULL);
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
            lapse__consumer_housekeeping(c);
        }
        drop_batch(c);
    }
    drop_batch(c);
    /* Deliveries not acked go back to the queue now, for the other consumers. */
    lapse__broker_close(&c->in);
    if (!*stop) {
        lapse__broker_close(&c->out);
        c->out_failure = LAPSE_OK;
    }
    return rc;
}

lapse_status_t lapse_consumer_run(lapse_consumer_t *c, const volatile sig_atomic_t *stop,
                                  lapse_error_t *err) {
    unsigned attempt = 0;
    c->stop = stop;
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
        int64_t delay = lapse__backoff_ms(attempt, 200, 5000);
        c->stats.reconnects++;
        char text[sizeof err->text] = "";
        if (err) {
            snprintf(text, sizeof text, "%s", err->text);
            lapse__consumer_sanitize(text);
        }
        lapse__log(c->cfg, LAPSE_LOG_WARN,
                   "event=reconnect status=%s reason=\"%s\" attempt=%u delay_ms=%lld",
                   lapse_status_name(rc), text, attempt, (long long)delay);
        lapse__sleep_ms(delay, stop);
    }
    /* Stopped: what this consumer cancelled is published before it goes, within a
     * bound, on the connection it has (or a new one). */
    lapse__consumer_events_final(c);
    lapse__log(c->cfg, LAPSE_LOG_INFO,
               "event=stopped deliveries=%llu cancelled=%llu noops=%llu early=%llu "
               "retried=%llu parked=%llu events=%llu",
               (unsigned long long)c->stats.deliveries,
               (unsigned long long)c->stats.cancelled, (unsigned long long)c->stats.noops,
               (unsigned long long)c->stats.early, (unsigned long long)c->stats.retried,
               (unsigned long long)c->stats.parked, (unsigned long long)c->stats.events);
    return LAPSE_OK;
}

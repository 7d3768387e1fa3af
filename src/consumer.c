/* SPDX-License-Identifier: MIT
 * Consumer: taking and deciding. Batches of expired messages -> the facts of each ->
 * decision.c's verdict -> one store transaction -> forwards confirmed -> one multiple
 * ack; reconnect with backoff, and the sweep's direct cancels while the broker is down.
 */
#include "consumer_int.h"

#include "publisher_int.h"

#include "headers_int.h"

#include <stdarg.h>
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
    lapse__clock_init(&c->clock);
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

void lapse__consumer_set_metrics(lapse_consumer_t *c, lapse__metrics_t *metrics) {
    c->metrics = metrics;
}

void lapse__delivery_why(delivery_t *d, const char *fmt, ...) {
    if (d->reason == NULL && (d->reason = malloc(CONSUMER_REASON_MAX)) == NULL) {
        d->reason_lost = true; /* lapse__delivery_reason says so */
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->reason, CONSUMER_REASON_MAX, fmt, ap);
    va_end(ap);
}

const char *lapse__delivery_reason(const delivery_t *d) {
    return d->reason != NULL ? d->reason : d->reason_lost ? "out of memory" : "";
}

static void drop_batch(lapse_consumer_t *c) {
    for (size_t i = 0; i < c->n; i++) {
        free(c->batch[i].reason);
        c->batch[i].reason = NULL;
    }
    c->n = 0;
    c->raw.n = 0;
    if (c->raw.cap > CONSUMER_RAW_KEEP) {
        lapse__frames_free(&c->raw); /* an unusual batch does not pin its memory */
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
    lapse__consumer_close_out(c);
    free(c->batch);
    free(c->items);
    free(c->item_of);
    free(c->item_failed);
    free(c->seqs);
    free(c->owed);
    lapse__frames_free(&c->raw);
    free(c);
}

/* Wait for one delivery (up to CONSUMER_IDLE_WAIT_MS), then take more for up to
 * CONSUMER_BATCH_WINDOW_MS or until the batch holds prefetch deliveries. Monotonic: a
 * wall clock stepping back must not hold a partial batch unacked. */
static lapse_status_t collect_batch(lapse_consumer_t *c, lapse_error_t *err) {
    int64_t started = 0;
    /* When the window is over after waits that gathered (CONSUMER_LOWAT_BYTES), one last
     * look without waiting takes what came meanwhile and still sits in the socket: a
     * batch holds what arrived within its window, as it did before the gathering. */
    bool gathered = false;
    bool last_look = false;
    while (c->n < c->cap) {
        int64_t now = lapse__mono_ms();
        int64_t wait_ms = CONSUMER_IDLE_WAIT_MS;
        if (c->n == 0 && c->relay.active) {
            /* The open round's confirms are read between batches (housekeeping). */
            wait_ms = CONSUMER_RELAY_POLL_MS;
        } else if (c->n == 0 &&
                   c->n_owed > 0) { /* owed events must not wait for traffic */
            int64_t due = lapse__time_add(c->owed_since, CONSUMER_EVENTS_DELAY_MS);
            int64_t backoff = lapse__consumer_owed_due(c);
            due = backoff > due ? backoff : due;
            int64_t until_due = due - now;
            if (until_due <= 0) {
                break;
            }
            wait_ms =
                until_due < CONSUMER_IDLE_WAIT_MS ? until_due : CONSUMER_IDLE_WAIT_MS;
        }
        if (c->n > 0) {
            wait_ms = CONSUMER_BATCH_WINDOW_MS - (now - started);
            if (wait_ms <= 0) {
                if (!gathered) {
                    break;
                }
                last_look = true;
                wait_ms = 0;
            }
        }
        bool gather = !last_look && c->n > 0 &&
                      (c->cap - c->n) * CONSUMER_LOWAT_DELIVERY >= CONSUMER_LOWAT_BYTES;
        gathered = gathered || gather;
        lapse__broker_set_lowat(&c->in, gather ? CONSUMER_LOWAT_BYTES : 0);
        lapse__inbound_t in;
        bool got = false;
        lapse_status_t rc = lapse__broker_consume_next(
            &c->in, &c->raw, wait_ms, CONSUMER_BODY_KEEP, &in, &got, err);
        if (rc != LAPSE_OK) {
            return rc;
        }
        if (!got) {
            if (c->n == 0 || last_look) {
                break;
            }
            if (lapse__mono_ms() - started >= CONSUMER_BATCH_WINDOW_MS) {
                if (!gathered) {
                    break;
                }
                last_look = true;
            }
            continue; /* a frame that needed nothing, or the last look is next */
        }
        /* Its facts now: the decoded properties last only until the next delivery. */
        delivery_t *d = &c->batch[c->n];
        *d = (delivery_t){.tag = in.delivery_tag,
                          .redelivered = in.redelivered,
                          .body_size = in.body_size,
                          .props_at = in.props_at,
                          .props_len = in.props_len,
                          .body_at = in.body_at,
                          .body_len = in.body_len,
                          .death_ms = lapse__hdr_death_time_ms(in.props),
                          .attempts = lapse__hdr_attempts(in.props)};
        d->received_mono = lapse__mono_ms();
        if (c->n++ == 0) {
            started = d->received_mono;
        }
    }
    return LAPSE_OK;
}

/* collect_batch; then waits on the consuming connection wake at the first byte again. */
static lapse_status_t collect(lapse_consumer_t *c, lapse_error_t *err) {
    lapse_status_t rc = collect_batch(c, err);
    lapse__broker_set_lowat(&c->in, 0);
    return rc;
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
        int64_t t0 = lapse__metrics_now_us();
        rc = lapse_store_cancel_batch(c->store, items, n, now, err);
        lapse__metrics_latency(c->metrics, LAPSE__OP_STORE_CANCEL,
                               lapse__metrics_now_us() - t0);
        lapse__metrics_store(c->metrics, rc == LAPSE_OK, err ? err->text : "failed");
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
/* Mark item k of a settle as failed, with why in its delivery's reason. */
static void item_fails(lapse_consumer_t *c, size_t k, lapse_status_t rc,
                       const char *why) {
    c->item_failed[k] = true;
    lapse__delivery_why(&c->batch[c->item_of[k]], "%s: %s", lapse_status_name(rc), why);
}

static lapse_status_t settle_items(lapse_consumer_t *c, size_t first, size_t n,
                                   int64_t now, const volatile sig_atomic_t *stop,
                                   lapse_error_t *err) {
    lapse_cancel_item_t *items = c->items + first;
    for (size_t k = 0; k < n; k++) {
        c->item_failed[first + k] = false;
    }
    lapse_error_t why = {0};
    lapse_status_t rc = cancel_items(c, items, n, now, stop, &why);
    if (rc != LAPSE_OK && n > 0 && !is_store_failure(rc)) {
        return lapse_error_set(err, rc, "%s", why.text);
    }
    for (size_t k = 0; rc != LAPSE_OK && k < n; k++) {
        lapse_error_t one = why;
        lapse_status_t orc = rc;
        if (rc != LAPSE_ERR_STORE_BUSY && n > 1) {
            orc = cancel_items(c, items + k, 1, now, stop, &one);
            if (orc == LAPSE_ERR_STOPPED) {
                return lapse_error_set(err, orc, "%s", one.text);
            }
        }
        if (orc != LAPSE_OK) {
            item_fails(c, first + k, orc, one.text);
        }
    }
    /* A row locked by another transaction settled nothing: that order alone retries. */
    for (size_t k = 0; k < n; k++) {
        if (!c->item_failed[first + k] && items[k].outcome == LAPSE_CANCEL_BUSY) {
            char text[LAPSE_ORDER_ID_MAX + 64];
            snprintf(text, sizeof text, "order %s is locked by another transaction",
                     items[k].order_id);
            item_fails(c, first + k, LAPSE_ERR_STORE_BUSY, text);
        }
    }
    return LAPSE_OK;
}

/* Decode every delivery; settle the decoded ones in the store, dated ones by now and
 * undated ones after them by LAPSE__NOTHING_DUE. */
static lapse_status_t settle(lapse_consumer_t *c, int64_t now,
                             const volatile sig_atomic_t *stop, size_t *n_items,
                             lapse_error_t *err) {
    size_t n_dated = 0;
    *n_items = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < c->n; i++) {
            delivery_t *d = &c->batch[i];
            if (d->undated != (pass == 1)) {
                continue;
            }
            lapse_error_t derr = {0};
            /* msg was cleared as the delivery came in (collect), and decode leaves it
             * alone on failure: a parked line names no order of an earlier delivery. */
            if (d->body_size > d->body_len) {
                /* Only its first bytes were kept (lapse__broker_consume_next): park
                 * those, saying how large it was. */
                d->decoded = false;
                lapse__delivery_why(
                    d,
                    "%s: body is %llu bytes, more than %d; parked with its first %zu "
                    "bytes",
                    lapse_status_name(LAPSE_ERR_MSG_TOO_LARGE),
                    (unsigned long long)d->body_size, LAPSE_MSG_MAX_BODY, d->body_len);
                continue;
            }
            d->decoded = lapse_expiry_msg_decode(c->raw.p + d->body_at, d->body_len,
                                                 &d->msg, &derr) == LAPSE_OK;
            if (!d->decoded) {
                lapse__delivery_why(d, "%s: %s", lapse_status_name(derr.code), derr.text);
                continue;
            }
            /* The store's deadline decides, not the message's: a forged or stale
             * deadline can neither cancel early nor hold a message back. */
            c->items[*n_items] = (lapse_cancel_item_t){.order_id = d->msg.order_id};
            c->item_of[(*n_items)++] = i;
        }
        if (pass == 0) {
            n_dated = *n_items;
        }
    }
    lapse_status_t rc = settle_items(c, 0, n_dated, now, stop, err);
    /* A message the broker never held (published straight into the expired exchange,
     * e.g. a replay by hand) has no broker time to check its deadline against: it is
     * not cancelled on arrival but goes once down the ladder (pending orders come back
     * as early; paid, cancelled and unknown ones are settled as usual). */
    if (rc == LAPSE_OK) {
        rc = settle_items(c, n_dated, *n_items - n_dated, LAPSE__NOTHING_DUE, stop, err);
    }
    return rc;
}

/* Gather the facts of every delivery and have decision.c decide; log what needs no
 * forward. The consumer decides nothing itself. now: the batch's decision clock, which
 * times the wait of an undated delivery (the store settled it with LAPSE__NOTHING_DUE,
 * so its now_ms says nothing of the time). */
static void decide(lapse_consumer_t *c, int64_t now, size_t n_items) {
    for (size_t i = 0; i < c->n; i++) {
        delivery_t *d = &c->batch[i];
        if (!d->decoded) {
            lapse__facts_t f = {.decoded = false,
                                .attempts = d->attempts,
                                .max_attempts = c->cfg->max_attempts};
            lapse__decide(&f, &d->verdict);
        }
    }
    c->n_seqs = 0;
    /* One decision line per order, built without printf (lapse__decision_line): the sink
     * may write the batch's together. */
    char line[LAPSE__DECISION_LINE_MAX];
    lapse__log_burst(c->cfg, true);
    for (size_t k = 0; k < n_items; k++) {
        const lapse_cancel_item_t *it = &c->items[k];
        delivery_t *d = &c->batch[c->item_of[k]];
        lapse__facts_t f = {.decoded = true,
                            .undated = d->undated,
                            .settled = !c->item_failed[k],
                            .outcome = it->outcome,
                            .deadline_ms = it->deadline_ms,
                            .now_ms = it->now_ms != LAPSE__NOTHING_DUE ? it->now_ms : now,
                            .attempts = d->attempts,
                            .max_attempts = c->cfg->max_attempts};
        lapse__decide(&f, &d->verdict);
        d->deadline_ms = it->deadline_ms;
        switch (d->verdict.action) {
            case LAPSE__ACT_CANCELLED:
                c->seqs[c->n_seqs++] = it->event_seq;
                c->stats.cancelled++;
                lapse__metrics_cancelled(c->metrics,
                                         lapse__time_add(it->now_ms, -it->deadline_ms));
                lapse__consumer_arrived(c, lapse__time_add(it->now_ms, -it->deadline_ms),
                                        d->attempts);
                if (lapse__log_wants(c->cfg, LAPSE_LOG_INFO)) {
                    int64_t lag = lapse__time_add(it->now_ms, -it->deadline_ms);
                    lapse__log_text(c->cfg, LAPSE_LOG_INFO,
                                    lapse__decision_line(line, it->order_id, "cancelled",
                                                         &lag, d->redelivered));
                }
                break;
            case LAPSE__ACT_NOOP:
                c->stats.noops++;
                /* A paid or cancelled order's message is as late as a pending one's:
                 * a backlog of no-ops also holds the sweep back. */
                if (!d->undated && it->deadline_ms != 0) {
                    lapse__consumer_arrived(
                        c, lapse__time_add(f.now_ms, -it->deadline_ms), d->attempts);
                }
                lapse__metrics_decision(c->metrics, it->outcome == LAPSE_CANCEL_NOOP_PAID
                                                        ? LAPSE__DEC_NOOP_PAID
                                                        : LAPSE__DEC_NOOP_CANCELLED);
                if (lapse__log_wants(c->cfg, LAPSE_LOG_INFO)) {
                    lapse__log_text(
                        c->cfg, LAPSE_LOG_INFO,
                        lapse__decision_line(line, it->order_id,
                                             lapse_cancel_outcome_name(it->outcome), NULL,
                                             d->redelivered));
                }
                break;
            case LAPSE__ACT_PARK:
                if (d->verdict.why == LAPSE__WHY_UNKNOWN) {
                    lapse__delivery_why(d, "unknown order: %s", it->order_id);
                }
                break;
            case LAPSE__ACT_EARLY:
            case LAPSE__ACT_RETRY:
                break;
        }
    }
    lapse__log_burst(c->cfg, false);
}

static lapse_status_t process(lapse_consumer_t *c, const volatile sig_atomic_t *stop,
                              lapse_error_t *err) {
    lapse__consumer_observe_clock(c);
    /* The decision clock: the wall clock bounded by the broker's (decision.c). It is
     * also what the store writes as cancelled_at, so the record shows the time the
     * decision was made by. */
    int64_t now = lapse__consumer_sample_batch(c);
    c->stats.deliveries += c->n;
    lapse__metrics_batch(c->metrics, c->n);
    size_t n_items = 0;
    lapse_status_t rc = settle(c, now, stop, &n_items, err);
    if (rc != LAPSE_OK) {
        return rc; /* nothing acked: the broker redelivers the batch */
    }
    decide(c, now, n_items);
    bool forwards = false;
    for (size_t i = 0; i < c->n; i++) {
        lapse__action_t a = c->batch[i].verdict.action;
        forwards |=
            a == LAPSE__ACT_PARK || a == LAPSE__ACT_EARLY || a == LAPSE__ACT_RETRY;
    }
    if (forwards) {
        rc = lapse__consumer_ensure_out(c, err);
    }
    c->batch_settled = false;
    if (rc == LAPSE_OK && forwards) {
        rc = lapse__consumer_forward(c, err);
    }
    if (rc != LAPSE_OK) {
        return rc; /* nothing acked: the broker redelivers the batch */
    }
    /* The store committed and every forward was confirmed: one ack covers the batch
     * (unless a forward failed and the batch was settled delivery by delivery). */
    if (!c->batch_settled) {
        int64_t t0 = lapse__metrics_now_us();
        rc = lapse__broker_ack(&c->in, c->batch[c->n - 1].tag, true, err);
        lapse__metrics_latency(c->metrics, LAPSE__OP_BROKER_ACK,
                               lapse__metrics_now_us() - t0);
    }
    if (rc != LAPSE_OK) {
        return rc;
    }
    /* This batch's events go out with the next ones, within CONSUMER_EVENTS_DELAY_MS:
     * one confirmed publish round and one store write for several batches. */
    lapse__consumer_owe(c, c->seqs, c->n_seqs);
    return LAPSE_OK;
}

/* After every batch or idle wait: keep the publishing connection alive (heartbeats,
 * late frames) even when nothing is published for a while, publish owed events and the
 * outbox backlog, probe the clock when due, sweep when due. */
static void housekeeping(lapse_consumer_t *c) {
    lapse__consumer_observe_clock(c);
    int64_t mono = lapse__mono_ms();
    if (c->out.open && mono - c->out_polled_at >= 1000) {
        c->out_polled_at = mono;
        lapse_error_t err = {0};
        lapse_status_t rc = lapse__broker_poll(&c->out, 0, &err);
        if (rc != LAPSE_OK) {
            lapse__consumer_out_failed(c, rc, &err, "out_connection_lost");
        }
    }
    lapse__consumer_events_owed(c);
    lapse__consumer_events_backlog(c);
    if (mono >= c->probe_at && !*c->stop) {
        lapse__consumer_probe_clock(c);
    }
    lapse__consumer_sweep(c, true);
}

static lapse_status_t connect_all(lapse_consumer_t *c, lapse_error_t *err) {
    c->out_retry_at = 0;
    lapse_status_t rc = lapse__consumer_ensure_out(c, err);
    if (rc == LAPSE_OK) {
        rc = lapse__broker_open(&c->in, c->cfg, c->name, 0, NULL, NULL, err);
    }
    if (rc == LAPSE_OK) {
        /* Before consuming, so that a backlog is decided by a tight floor. */
        lapse__consumer_probe_clock(c);
        rc = lapse__broker_qos(&c->in, (uint16_t)c->cfg->prefetch, err);
    }
    if (rc == LAPSE_OK) {
        rc = lapse__broker_consume(&c->in, c->topo.expired_queue, c->name, err);
    }
    return rc;
}

static void report(const lapse_consumer_t *c, lapse_consumer_state_t state,
                   const char *detail) {
    if (c->state_cb != NULL) {
        c->state_cb(c->state_opaque, state, detail);
    }
}

void lapse_consumer_set_state_cb(lapse_consumer_t *c, lapse_consumer_state_cb cb,
                                 void *opaque) {
    if (c != NULL) {
        c->state_cb = cb;
        c->state_opaque = opaque;
    }
}

static lapse_status_t session(lapse_consumer_t *c, const volatile sig_atomic_t *stop,
                              bool *progress, lapse_error_t *err) {
    /* A missing queue or exchange is named with its fix before forwards fail on it. */
    lapse__topology_check(c->cfg, &c->topo, NULL, NULL);
    lapse_status_t rc = connect_all(c, err);
    if (rc == LAPSE_OK) {
        lapse__log(c->cfg, LAPSE_LOG_INFO, "event=consuming queue=%s prefetch=%d",
                   c->topo.expired_queue, c->cfg->prefetch);
        lapse__metrics_subscribed(c->metrics, true, NULL);
        /* Events left unpublished by an earlier crash or outage go out first. */
        c->backlog_at = 0;
    }
    while (rc == LAPSE_OK && !*stop) {
        /* Subscribed, and the loop turns (a service's readiness and watchdog). */
        report(c, LAPSE_CONSUMER_CONSUMING, c->topo.expired_queue);
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
    lapse__metrics_subscribed(c->metrics, false,
                              *stop ? "stopping"
                                    : (err && err->text[0] ? err->text : "failed"));
    /* Deliveries not acked go back to the queue now, for the other consumers. */
    lapse__broker_close(&c->in);
    if (!*stop) {
        lapse__consumer_close_out(c);
        c->out_failure = LAPSE_OK;
    }
    return rc;
}

/* Wait out a reconnect backoff, running the sweep's direct cancels when due: they need
 * only the store, and orders the broker lost must not wait for it to come back. */
static void backoff(lapse_consumer_t *c, int64_t delay_ms, const char *reason) {
    int64_t until = lapse__time_add(lapse__mono_ms(), delay_ms);
    while (!*c->stop) {
        report(c, LAPSE_CONSUMER_CONNECTING, reason);
        lapse__consumer_observe_clock(c);
        lapse__consumer_sweep(c, false);
        int64_t left = until - lapse__mono_ms();
        if (left <= 0) {
            return;
        }
        lapse__sleep_ms(left < 250 ? left : 250, c->stop);
    }
}

lapse_status_t lapse_consumer_run(lapse_consumer_t *c, const volatile sig_atomic_t *stop,
                                  lapse_error_t *err) {
    unsigned attempt = 0;
    c->stop = stop;
    report(c, LAPSE_CONSUMER_CONNECTING, "");
    while (!*stop) {
        bool progress = false;
        lapse_status_t rc = session(c, stop, &progress, err);
        if (rc == LAPSE_OK || rc == LAPSE_ERR_STOPPED) {
            break;
        }
        /* A service outlasts what it can: only a refused login, a certificate that
         * fails verification (or a broker that refuses ours), a password file it
         * cannot read (ERR_IO) or a wrong setting ends it; store and broker failures
         * are retried with backoff. */
        if (rc == LAPSE_ERR_BROKER_LOGIN || rc == LAPSE_ERR_BROKER_TLS ||
            rc == LAPSE_ERR_IO || rc == LAPSE_ERR_INVALID ||
            (rc <= -0x0401 && rc >= -0x04ff)) {
            return rc;
        }
        attempt = progress ? 0 : attempt + 1;
        int64_t delay = lapse__backoff_ms(attempt, 200, 5000);
        c->stats.reconnects++;
        lapse__metrics_reconnect(c->metrics);
        char text[sizeof err->text] = "";
        if (err) {
            snprintf(text, sizeof text, "%s", err->text);
            lapse__consumer_sanitize(text);
        }
        lapse__log(c->cfg, LAPSE_LOG_WARN,
                   "event=reconnect status=%s reason=\"%s\" attempt=%u delay_ms=%lld",
                   lapse_status_name(rc), text, attempt, (long long)delay);
        backoff(c, delay, text);
    }
    report(c, LAPSE_CONSUMER_STOPPING, "");
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

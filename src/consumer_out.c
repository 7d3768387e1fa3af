/* SPDX-License-Identifier: MIT
 * Consumer, publishing side: parked and re-held deliveries, order.cancelled events, and
 * a publishing connection that recovers on its own. */
#include "consumer_int.h"

#include "clock_int.h"
#include "events_int.h"
#include "publisher_int.h"

#include <lapse/sweep.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void on_settle(void *opaque, uint64_t tag, lapse_status_t outcome) {
    (void)tag;
    lapse_consumer_t *c = opaque;
    if (outcome != LAPSE_OK && c->out_failure == LAPSE_OK) {
        c->out_failure = outcome;
    }
    for (size_t i = 0; i < c->n; i++) {
        if (c->batch[i].fwd_tag == tag) {
            c->batch[i].fwd_rc = outcome;
            break;
        }
    }
}

/* Log values must stay one token: quotes in reasons become apostrophes. */
void lapse__consumer_sanitize(char *text) {
    for (char *p = text; *p; p++) {
        if (*p == '"' || *p == '\n' || *p == '\r') {
            *p = '\'';
        }
    }
}

/* Headers lapse sets when parking; a replayed and re-parked message gets fresh ones. */
static bool is_own_header(amqp_bytes_t key) {
    static const char *const own[] = {LAPSE_HDR_REASON, LAPSE_HDR_PARKED_AT,
                                      LAPSE_HDR_ATTEMPTS};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) {
        if (key.len == strlen(own[i]) && memcmp(key.bytes, own[i], key.len) == 0) {
            return true;
        }
    }
    return false;
}

static lapse_status_t park(lapse_consumer_t *c, delivery_t *d, uint64_t *tag,
                           lapse_error_t *err) {
    /* The parked copy keeps the body and properties and adds why it was parked. */
    amqp_basic_properties_t props = d->env.message.properties;
    amqp_table_t old =
        (props._flags & AMQP_BASIC_HEADERS_FLAG) ? props.headers : amqp_empty_table;
    amqp_table_entry_t *entries = calloc((size_t)old.num_entries + 3, sizeof *entries);
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
    entries[n++] = lapse__entry_i64(LAPSE_HDR_PARKED_AT, lapse_clock_now_ms());
    if (d->attempts > 0) {
        entries[n++] = lapse__entry_i64(LAPSE_HDR_ATTEMPTS, d->attempts);
    }
    props.headers.num_entries = n;
    props.headers.entries = entries;
    /* Parked messages wait for an operator: never let them expire. */
    props._flags &= ~(amqp_flags_t)AMQP_BASIC_EXPIRATION_FLAG;
    props._flags |= AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG;
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    lapse_status_t rc = lapse__broker_publish(&c->out, c->topo.parked_exchange, "", true,
                                              &props, d->env.message.body.bytes,
                                              d->env.message.body.len, tag, err);
    free(entries);
    return rc;
}

static bool needs_forward(const delivery_t *d) {
    return d->action == ACT_PARK || d->action == ACT_EARLY || d->action == ACT_RETRY;
}

/* Some forward of the batch failed (a missing parked queue or delay exchange returns,
 * nacks or closes the channel): redelivering the whole batch would fail the same way
 * forever and hold up the queue behind it. Instead every delivery that is settled (its
 * forward confirmed, or none needed: the store committed) is acked on its own, and the
 * rest go back to the queue after a growing backoff, to be tried again; none is acked
 * whose forward was not confirmed, none is lost. */
static lapse_status_t forward_failed(lapse_consumer_t *c, lapse_status_t rc,
                                     const lapse_error_t *why, lapse_error_t *err) {
    size_t needed = 0;
    size_t failed = 0;
    for (size_t i = 0; i < c->n; i++) {
        const delivery_t *d = &c->batch[i];
        if (needs_forward(d)) {
            needed++;
            failed += !(d->fwd_tag != 0 && d->fwd_rc == LAPSE_OK);
        }
    }
    lapse_status_t cause = rc != LAPSE_OK ? rc : c->out_failure;
    char text[sizeof why->text];
    snprintf(text, sizeof text, "%s",
             rc != LAPSE_OK && why ? why->text : lapse_strerror(cause));
    lapse__consumer_sanitize(text);
    int64_t delay = lapse__backoff_ms(c->fwd_attempt++, 500, 5000);
    lapse__log(c->cfg, LAPSE_LOG_WARN,
               "event=forward_failed status=%s reason=\"%s\" failed=%zu of=%zu "
               "requeue_in_ms=%lld note=\"the other deliveries are acked; these go back "
               "to the queue (see event=topology_missing)\"",
               lapse_status_name(cause), text, failed, needed, (long long)delay);
    c->out_failure = LAPSE_OK;
    if (!c->out.open || rc != LAPSE_OK) {
        /* A closed channel or a timeout: the connection is opened afresh next time. */
        lapse__broker_close(&c->out);
    }
    for (size_t i = 0; i < c->n; i++) {
        const delivery_t *d = &c->batch[i];
        bool settled = !needs_forward(d) || (d->fwd_tag != 0 && d->fwd_rc == LAPSE_OK);
        if (settled && amqp_basic_ack(c->in.conn, LAPSE__CHANNEL, d->env.delivery_tag,
                                      0) != AMQP_STATUS_OK) {
            c->in.open = false;
            return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "ack: connection lost");
        }
    }
    /* Not at once: back at the head of the queue, they would come straight back. */
    lapse__sleep_ms(delay, c->stop);
    for (size_t i = 0; i < c->n; i++) {
        const delivery_t *d = &c->batch[i];
        bool settled = !needs_forward(d) || (d->fwd_tag != 0 && d->fwd_rc == LAPSE_OK);
        if (!settled && amqp_basic_nack(c->in.conn, LAPSE__CHANNEL, d->env.delivery_tag,
                                        0, 1) != AMQP_STATUS_OK) {
            c->in.open = false;
            return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "nack: connection lost");
        }
    }
    c->batch_settled = true;
    return LAPSE_OK;
}

/* Publish the parked and re-held deliveries; all must be confirmed before the ack. */
lapse_status_t lapse__consumer_forward(lapse_consumer_t *c, int64_t now,
                                       lapse_error_t *err) {
    lapse_status_t rc = LAPSE_OK;
    size_t forwarded = 0;
    for (size_t i = 0; i < c->n; i++) {
        c->batch[i].fwd_tag = 0;
        c->batch[i].fwd_rc = LAPSE_ERR_BROKER_TIMEOUT;
    }
    for (size_t i = 0; i < c->n && rc == LAPSE_OK; i++) {
        delivery_t *d = &c->batch[i];
        if (d->action == ACT_RETRY && d->attempts + 1 >= c->cfg->max_attempts) {
            /* Out of attempts: park it with the last failure and the count. */
            char last[sizeof d->reason - 40];
            memcpy(last, d->reason, sizeof last - 1);
            last[sizeof last - 1] = '\0';
            d->attempts++;
            snprintf(d->reason, sizeof d->reason, "failed %d times, last: %s",
                     d->attempts, last);
            d->action = ACT_PARK;
        }
        if (d->action == ACT_PARK) {
            /* The header keeps the decoder's words; the log line must stay one token. */
            char logged[sizeof d->reason];
            memcpy(logged, d->reason, sizeof logged);
            lapse__consumer_sanitize(logged);
            lapse__log(c->cfg, LAPSE_LOG_WARN,
                       "event=decision order_id=%s decision=parked reason=\"%s\"",
                       d->msg.order_id[0] ? d->msg.order_id : "-", logged);
            rc = park(c, d, &d->fwd_tag, err);
            c->stats.parked++;
            forwarded++;
        } else if (d->action == ACT_EARLY) {
            /* Never act early: the remainder goes down the ladder and comes back
             * through the expired queue. The TTLs run on the broker, rounded up to whole
             * seconds (at least one), so this cannot spin. */
            int64_t remaining = d->deadline_ms - now;
            if (remaining > LAPSE__LADDER_MAX_MS) {
                remaining = LAPSE__LADDER_MAX_MS; /* it comes back and goes again */
            }
            lapse__ladder_route_t route;
            lapse__ladder_route(remaining, &route);
            lapse__log(c->cfg, LAPSE_LOG_INFO,
                       "event=decision order_id=%s decision=early remaining_ms=%lld "
                       "reason=%s ladder_s=%lld",
                       d->msg.order_id, (long long)remaining,
                       d->undated ? "undated" : "ahead", (long long)route.seconds);
            d->msg.deadline_ms = d->deadline_ms;
            rc = lapse__publish_expiry(&c->out, c->topo.delay[route.top],
                                       route.routing_key, &d->msg, d->attempts,
                                       &d->fwd_tag, err);
            c->stats.early++;
            forwarded++;
        } else if (d->action == ACT_RETRY) {
            /* The retry path: back down the ladder after a growing delay, the attempt
             * counted in the message. Nothing waits behind it, and it is acked only once
             * this publish is confirmed. */
            d->attempts++;
            int64_t delay = (int64_t)1000 << (d->attempts < 20 ? d->attempts - 1 : 19);
            delay =
                delay > CONSUMER_RETRY_MAX_DELAY_MS ? CONSUMER_RETRY_MAX_DELAY_MS : delay;
            lapse__ladder_route_t route;
            lapse__ladder_route(delay, &route);
            char logged[sizeof d->reason];
            memcpy(logged, d->reason, sizeof logged);
            lapse__consumer_sanitize(logged);
            lapse__log(c->cfg, LAPSE_LOG_WARN,
                       "event=decision order_id=%s decision=retry attempt=%d of=%d "
                       "delay_ms=%lld reason=\"%s\"",
                       d->msg.order_id, d->attempts, c->cfg->max_attempts,
                       (long long)delay, logged);
            rc = lapse__publish_expiry(&c->out, c->topo.delay[route.top],
                                       route.routing_key, &d->msg, d->attempts,
                                       &d->fwd_tag, err);
            c->stats.retried++;
            forwarded++;
        }
    }
    if (rc == LAPSE_OK && forwarded > 0) {
        rc = lapse__broker_wait_confirms(&c->out, CONSUMER_CONFIRM_WAIT_MS, err);
    }
    bool all_ok = rc == LAPSE_OK;
    for (size_t i = 0; i < c->n && all_ok; i++) {
        const delivery_t *d = &c->batch[i];
        all_ok = !needs_forward(d) || (d->fwd_tag != 0 && d->fwd_rc == LAPSE_OK);
    }
    if (all_ok) {
        c->out_failure = LAPSE_OK;
        c->fwd_attempt = 0;
        return LAPSE_OK;
    }
    if (rc == LAPSE_ERR_STOPPED || (rc != LAPSE_OK && !c->in.open)) {
        return rc; /* nothing acked: the broker redelivers the batch */
    }
    lapse_error_t why = {0};
    if (rc != LAPSE_OK && err) {
        why = *err;
    }
    return forward_failed(c, rc, &why, err);
}

static void out_failed(lapse_consumer_t *c, lapse_status_t rc, const lapse_error_t *why,
                       const char *what) {
    char text[sizeof why->text];
    snprintf(text, sizeof text, "%s", why->text);
    lapse__consumer_sanitize(text);
    int64_t delay = lapse__backoff_ms(c->out_attempt++, 200, 10000);
    lapse__log(c->cfg, LAPSE_LOG_WARN,
               "event=%s status=%s reason=\"%s\" retry_in_ms=%lld", what,
               lapse_status_name(rc), text, (long long)delay);
    lapse__broker_close(&c->out);
    c->out_failure = LAPSE_OK;
    c->out_retry_at = lapse_clock_now_ms() + delay;
}

static lapse_status_t open_out(lapse_consumer_t *c, lapse_error_t *err) {
    char name[sizeof c->name + 4];
    snprintf(name, sizeof name, "%s out", c->name);
    lapse_status_t rc =
        lapse__broker_open(&c->out, c->cfg, name, CONSUMER_WINDOW, on_settle, c, err);
    /* SIGTERM ends the out connection's waits too (a blocked broker, confirms). While
     * an alarm blocks it, forwards and events fail fast (requeued, left in the outbox)
     * instead of holding up the cancelling, which goes on. */
    c->out.stop = c->stop;
    c->out.blocked_wait_ms = CONSUMER_BLOCKED_WAIT_MS;
    return rc;
}

/* The publishing connection fails on its own (an events exchange deleted, a missed
 * heartbeat): reopen it with backoff, without stopping the consuming side. */
lapse_status_t lapse__consumer_ensure_out(lapse_consumer_t *c, lapse_error_t *err) {
    if (c->out.open) {
        return LAPSE_OK;
    }
    if (lapse_clock_now_ms() < c->out_retry_at) {
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED,
                               "publishing connection down, retrying later");
    }
    lapse_status_t rc = open_out(c, err);
    if (rc != LAPSE_OK) {
        out_failed(c, rc, err, "out_connect_failed");
        return rc;
    }
    c->out_attempt = 0;
    return LAPSE_OK;
}

/* No queue took the last events: they wait in the outbox, and the next try comes after
 * a growing delay. Until then the consumer publishes no events at all; its owed ones
 * stay owed (see lapse__consumer_events_owed), and the next try is a probe of one. */
static void events_unroutable(lapse_consumer_t *c, size_t returned) {
    int64_t waiting = -1;
    lapse_store_events_count(c->store, &waiting, NULL);
    int64_t delay = lapse__backoff_ms(c->events_attempt++, CONSUMER_EVENTS_RETRY_MIN_MS,
                                      CONSUMER_EVENTS_RETRY_MAX_MS);
    c->events_retry_at = lapse_clock_now_ms() + delay;
    c->backlog_at = c->events_retry_at;
    lapse__log(
        c->cfg, LAPSE_LOG_WARN,
        "event=events_unroutable exchange=%s returned=%zu waiting=%lld "
        "retry_in_ms=%lld note=\"no queue is bound to the exchange; events stay in "
        "the outbox\"",
        c->topo.events_exchange, returned, (long long)waiting, (long long)delay);
}

/* One relay round on the publishing connection. True when it went through: no failure
 * and nothing returned (failures and returns are logged and start their backoff). */
static bool relay_round(lapse_consumer_t *c, const int64_t *only, size_t n_only,
                        size_t limit, lapse__relay_report_t *report) {
    *report = (lapse__relay_report_t){0};
    lapse_error_t err = {0};
    if (lapse__consumer_ensure_out(c, &err) != LAPSE_OK) {
        return false;
    }
    lapse_status_t rc =
        lapse__events_relay(&c->out, c->store, c->topo.events_exchange, only, n_only,
                            limit, CONSUMER_CONFIRM_WAIT_MS, report, &err);
    c->stats.events += report->published;
    if (rc != LAPSE_OK) {
        out_failed(c, rc, &err, "events_failed");
        return false;
    }
    if (report->returned > 0) {
        events_unroutable(c, report->returned);
        return false;
    }
    return true;
}

/* Events are published after the ack; a failure leaves them in the outbox for a later
 * try and never holds up cancelling. */
bool lapse__consumer_events(lapse_consumer_t *c, const int64_t *only, size_t n_only,
                            size_t limit) {
    if (lapse_clock_now_ms() < c->events_retry_at) {
        return false; /* unroutable a moment ago: tried again in time */
    }
    lapse__relay_report_t report;
    if (c->events_attempt > 0) {
        /* The oldest event in the outbox goes first, alone: when it is returned again,
         * one publish was wasted, not a thousand. */
        if (!relay_round(c, NULL, 0, 1, &report)) {
            return false;
        }
        c->events_attempt = 0;
        if (report.published > 0) {
            lapse__log(c->cfg, LAPSE_LOG_INFO, "event=events_routable exchange=%s",
                       c->topo.events_exchange);
        }
        /* The backlog (other consumers' events among it) waits for its usual pass, so
         * that every consumer first publishes what it owes itself. */
        c->backlog_at = lapse_clock_now_ms() + CONSUMER_BACKLOG_EVERY_MS;
    }
    if (!relay_round(c, only, n_only, limit, &report)) {
        return false;
    }
    if (!only && report.read == limit) {
        c->backlog_at = 0; /* more waiting: look again on the next idle pass */
    }
    return true;
}

void lapse__consumer_events_owed(lapse_consumer_t *c, bool now) {
    if (c->n_owed == 0 || lapse_clock_now_ms() < lapse__consumer_owed_due(c) ||
        (!now && c->n_owed < CONSUMER_EVENTS_CHUNK &&
         lapse_clock_now_ms() - c->owed_since < CONSUMER_EVENTS_DELAY_MS)) {
        return;
    }
    /* Owed until they went through; those published meanwhile by someone else are
     * skipped by the relay (it reads unpublished rows only). */
    if (lapse__consumer_events(c, c->owed, c->n_owed, c->n_owed)) {
        c->n_owed = 0;
    }
}

int64_t lapse__consumer_owed_due(const lapse_consumer_t *c) {
    int64_t due = c->events_retry_at;
    if (!c->out.open && c->out_retry_at > due) {
        due = c->out_retry_at;
    }
    return due;
}

void lapse__consumer_owe(lapse_consumer_t *c, const int64_t *seqs, size_t n) {
    if (n == 0) {
        return;
    }
    if (c->n_owed == 0) {
        c->owed_since = lapse_clock_now_ms();
    }
    size_t cap = CONSUMER_OWED_MAX;
    if (n > cap) { /* cannot happen: a batch is at most 32767 deliveries */
        seqs += n - cap;
        n = cap;
    }
    if (c->n_owed + n > cap) {
        /* Held back long (no queue bound, no connection): the oldest are left to the
         * outbox's backlog pass, so memory stays bounded. */
        size_t drop = c->n_owed + n - cap;
        memmove(c->owed, c->owed + drop, (c->n_owed - drop) * sizeof *c->owed);
        c->n_owed -= drop;
    }
    memcpy(c->owed + c->n_owed, seqs, n * sizeof *c->owed);
    c->n_owed += n;
}

void lapse__consumer_events_final(lapse_consumer_t *c) {
    int64_t deadline = lapse_clock_now_ms() + CONSUMER_STOP_EVENTS_MS;
    lapse__relay_report_t total = {0};
    lapse_error_t err = {0};
    lapse_status_t rc = LAPSE_OK;
    size_t owed = c->n_owed;
    /* The last chance: neither the publishing connection's nor the events' backoff is
     * waited out (a queue may have been bound meanwhile). Only what this consumer owes:
     * the rest of the outbox may be another consumer's, publishing it right now. */
    if (owed > 0 && !c->out.open) {
        rc = open_out(c, &err);
    }
    /* Already stopping: this flush has its own bound instead of the stop flag. */
    c->out.stop = NULL;
    c->out.give_up_at = lapse__mono_ms() + CONSUMER_STOP_EVENTS_MS;
    size_t k = 0;
    while (rc == LAPSE_OK && k < owed && total.returned == 0) {
        int64_t left = deadline - lapse_clock_now_ms();
        if (left <= 0) {
            rc = lapse_error_set(&err, LAPSE_ERR_BROKER_TIMEOUT, "out of time");
            break;
        }
        size_t n = owed - k < CONSUMER_EVENTS_CHUNK ? owed - k : CONSUMER_EVENTS_CHUNK;
        lapse__relay_report_t one;
        rc = lapse__events_relay(&c->out, c->store, c->topo.events_exchange, c->owed + k,
                                 n, n, left, &one, &err);
        lapse__relay_report_add(&total, &one);
        k += n;
    }
    c->n_owed = 0;
    c->stats.events += total.published;
    lapse__broker_close(&c->out);
    c->out_failure = LAPSE_OK;

    int64_t waiting = -1;
    lapse_store_events_count(c->store, &waiting, NULL);
    if (rc == LAPSE_OK && total.returned == 0) {
        lapse__log(c->cfg, LAPSE_LOG_INFO,
                   "event=events_flushed published=%zu owed=%zu waiting=%lld",
                   total.published, owed, (long long)waiting);
        return;
    }
    char text[sizeof err.text];
    snprintf(text, sizeof text, "%s",
             rc != LAPSE_OK ? err.text : "no queue is bound to the events exchange");
    lapse__consumer_sanitize(text);
    lapse__log(c->cfg, LAPSE_LOG_WARN,
               "event=events_left exchange=%s published=%zu owed=%zu waiting=%lld "
               "status=%s reason=\"%s\" note=\"they stay in the outbox for the next "
               "consumer or sweep\"",
               c->topo.events_exchange, total.published, owed, (long long)waiting,
               lapse_status_name(rc), text);
}

/* The safety net under the broker path (see sweep.h): orders never confirmed are
 * published again, orders still pending a grace period after their deadline are
 * cancelled directly. Bounded per call so that deliveries are not held up; called again
 * at once while there is more. */
static void sweep(lapse_consumer_t *c, int64_t now) {
    lapse_sweep_opts_t opts;
    lapse_sweep_opts_init(&opts);
    opts.grace_ms = c->cfg->sweep_grace_ms;
    opts.in_flight_ms = c->cfg->sweep_in_flight_ms;
    opts.max_orders = CONSUMER_SWEEP_CHUNK;
    opts.events = false; /* the consumer publishes the outbox itself */
    /* The sweep cancels by this host's clock: when it may run ahead by more than the
     * grace, direct cancelling could be early, so only the re-publish part runs. */
    int64_t skew = lapse__consumer_skew_bound(c);
    if (skew >= opts.grace_ms) {
        opts.cancel = false;
        lapse__log(
            c->cfg, LAPSE_LOG_WARN,
            "event=sweep_cancel_skipped clock_ahead_by_up_to_ms=%lld grace_ms=%lld",
            (long long)skew, (long long)opts.grace_ms);
    }
    lapse_sweep_report_t report;
    lapse_error_t err = {0};
    lapse_status_t rc = lapse_sweep_run(c->cfg, c->store, &opts, &report, &err);
    c->sweep_at = report.more && rc == LAPSE_OK ? now : now + c->cfg->sweep_every_ms;
    if (rc != LAPSE_OK) {
        char text[sizeof err.text];
        snprintf(text, sizeof text, "%s", err.text);
        lapse__consumer_sanitize(text);
        lapse__log(c->cfg, LAPSE_LOG_WARN, "event=sweep_failed status=%s reason=\"%s\"",
                   lapse_status_name(rc), text);
    }
    if (report.republished + report.cancelled + report.failed > 0) {
        lapse__log(c->cfg, LAPSE_LOG_INFO,
                   "event=sweep republished=%llu cancelled=%llu failed=%llu more=%d",
                   (unsigned long long)report.republished,
                   (unsigned long long)report.cancelled,
                   (unsigned long long)report.failed, report.more ? 1 : 0);
    }
}

/* After every batch or idle wait: keep the publishing connection alive (heartbeats,
 * late frames) even when nothing is published for a while, and publish the outbox
 * backlog now and then. */
void lapse__consumer_housekeeping(lapse_consumer_t *c) {
    lapse_error_t err = {0};
    int64_t now = lapse_clock_now_ms();
    if (c->out.open && now - c->out_polled_at >= 1000) {
        c->out_polled_at = now;
        lapse_status_t rc = lapse__broker_poll(&c->out, 0, &err);
        if (rc != LAPSE_OK) {
            out_failed(c, rc, &err, "out_connection_lost");
        }
    }
    lapse__consumer_events_owed(c, false);
    if (now >= c->backlog_at) {
        c->backlog_at = now + CONSUMER_BACKLOG_EVERY_MS;
        lapse__consumer_events(c, NULL, 0, CONSUMER_EVENTS_CHUNK);
    }
    if (c->cfg->sweep_every_ms > 0 && now >= c->sweep_at) {
        sweep(c, now);
    }
}

/* SPDX-License-Identifier: MIT
 * Consumer: carrying out the verdicts that publish (docs/design.md, "Parking" and "The
 * clock rule"): parked deliveries to <p>.parked, early and retried ones back down the
 * ladder, all on the publishing connection (confirm mode), which recovers on its own. */
#include "consumer_int.h"

#include "headers_int.h"

#include "publisher_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void on_settle(void *opaque, uint64_t tag, lapse_status_t outcome) {
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

/* A delivery's properties decode into about 1 KiB (an x-death table). */
#define PARK_POOL_PAGE 4096

static lapse_status_t park(lapse_consumer_t *c, delivery_t *d, lapse_error_t *err) {
    /* The parked copy keeps the body and properties as they came and adds why it was
     * parked. The properties are decoded again from their bytes: only here, for the few
     * parked, instead of kept decoded for every delivery of the batch. */
    amqp_pool_t pool;
    init_amqp_pool(&pool, PARK_POOL_PAGE);
    amqp_basic_properties_t *came = NULL;
    lapse_status_t rc = lapse__broker_props_decode(c->raw.p + d->props_at, d->props_len,
                                                   &pool, &came, err);
    if (rc != LAPSE_OK) {
        empty_amqp_pool(&pool);
        return rc;
    }
    amqp_basic_properties_t props = *came;
    amqp_table_t old =
        (props._flags & AMQP_BASIC_HEADERS_FLAG) ? props.headers : amqp_empty_table;
    amqp_table_entry_t *entries = calloc((size_t)old.num_entries + 3, sizeof *entries);
    if (!entries) {
        empty_amqp_pool(&pool);
        return lapse_error_set(err, LAPSE_ERR_NOMEM, "park headers");
    }
    int n = 0;
    for (int i = 0; i < old.num_entries; i++) {
        /* A replayed and re-parked message gets fresh parking headers. */
        if (!lapse__hdr_is_parking(old.entries[i].key)) {
            entries[n++] = old.entries[i];
        }
    }
    entries[n++] = lapse__hdr_reason_entry(lapse__delivery_reason(d));
    /* For people: when it was parked, by the wall clock. */
    entries[n++] = lapse__hdr_parked_at_entry(lapse_clock_now_ms());
    if (d->verdict.attempts > 0) {
        entries[n++] = lapse__hdr_attempts_entry(d->verdict.attempts);
    }
    props.headers.num_entries = n;
    props.headers.entries = entries;
    /* Parked messages wait for an operator: never let them expire. */
    props._flags &= ~(amqp_flags_t)AMQP_BASIC_EXPIRATION_FLAG;
    props._flags |= AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG;
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    rc = lapse__broker_publish(&c->out, c->topo.parked_exchange, "", true, &props,
                               c->raw.p + d->body_at, d->body_len, &d->fwd_tag, err);
    free(entries);
    empty_amqp_pool(&pool);
    return rc;
}

/* The delivery back down the ladder for verdict.delay_ms, with verdict.attempts. */
static lapse_status_t hold_again(lapse_consumer_t *c, delivery_t *d,
                                 lapse__ladder_route_t *route, lapse_error_t *err) {
    lapse__ladder_route(d->verdict.delay_ms, route);
    d->msg.deadline_ms = d->deadline_ms;
    return lapse__publish_expiry(&c->out, c->topo.delay[route->top], route->routing_key,
                                 &d->msg, d->verdict.attempts, &d->fwd_tag, err);
}

static void logged_reason(const delivery_t *d, char *out, size_t cap) {
    snprintf(out, cap, "%s", lapse__delivery_reason(d));
    lapse__consumer_sanitize(out);
}

static bool needs_forward(const delivery_t *d) {
    lapse__action_t a = d->verdict.action;
    return a == LAPSE__ACT_PARK || a == LAPSE__ACT_EARLY || a == LAPSE__ACT_RETRY;
}

static bool is_settled(const delivery_t *d) {
    return !needs_forward(d) || (d->fwd_tag != 0 && d->fwd_rc == LAPSE_OK);
}

/* A forward is counted once it is confirmed: one that fails goes back to the queue and
 * is decided (and counted) again when it returns. */
static void count_forward(lapse_consumer_t *c, const delivery_t *d) {
    switch (d->verdict.action) {
        case LAPSE__ACT_PARK:
            c->stats.parked++;
            lapse__metrics_decision(c->metrics, LAPSE__DEC_PARKED);
            break;
        case LAPSE__ACT_EARLY:
            c->stats.early++;
            lapse__metrics_decision(c->metrics, LAPSE__DEC_EARLY);
            break;
        case LAPSE__ACT_RETRY:
            c->stats.retried++;
            lapse__metrics_decision(c->metrics, LAPSE__DEC_RETRY);
            break;
        case LAPSE__ACT_CANCELLED:
        case LAPSE__ACT_NOOP:
            break;
    }
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
        needed += needs_forward(&c->batch[i]);
        failed += !is_settled(&c->batch[i]);
    }
    lapse_status_t cause = rc != LAPSE_OK ? rc : c->out_failure;
    char text[sizeof why->text];
    snprintf(text, sizeof text, "%s",
             rc != LAPSE_OK && why->text[0] ? why->text : lapse_strerror(cause));
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
        lapse__consumer_close_out(c);
    }
    for (size_t i = 0; i < c->n; i++) {
        const delivery_t *d = &c->batch[i];
        if (is_settled(d)) {
            lapse_status_t arc = lapse__broker_ack(&c->in, d->tag, false, err);
            if (arc != LAPSE_OK) {
                return arc;
            }
            count_forward(c, d);
        }
    }
    /* Not at once: back at the head of the queue, they would come straight back. */
    lapse__sleep_ms(delay, c->stop);
    for (size_t i = 0; i < c->n; i++) {
        const delivery_t *d = &c->batch[i];
        if (!is_settled(d)) {
            lapse_status_t nrc = lapse__broker_nack(&c->in, d->tag, err);
            if (nrc != LAPSE_OK) {
                return nrc;
            }
        }
    }
    c->batch_settled = true;
    return LAPSE_OK;
}

lapse_status_t lapse__consumer_forward(lapse_consumer_t *c, lapse_error_t *err) {
    lapse_status_t rc = LAPSE_OK;
    size_t forwarded = 0;
    for (size_t i = 0; i < c->n; i++) {
        c->batch[i].fwd_tag = 0;
        c->batch[i].fwd_rc = LAPSE_ERR_BROKER_TIMEOUT;
    }
    for (size_t i = 0; i < c->n && rc == LAPSE_OK; i++) {
        delivery_t *d = &c->batch[i];
        const lapse__verdict_t *v = &d->verdict;
        char logged[CONSUMER_REASON_MAX];
        lapse__ladder_route_t route;
        switch (v->action) {
            case LAPSE__ACT_PARK:
                if (v->why == LAPSE__WHY_EXHAUSTED) {
                    /* The last failure, cut to leave room for the count. */
                    char last[CONSUMER_REASON_MAX - 40];
                    snprintf(last, sizeof last, "%s", lapse__delivery_reason(d));
                    lapse__delivery_why(d, "failed %d times, last: %s", v->attempts,
                                        last);
                }
                /* The header keeps the decoder's words; the log line one token. */
                logged_reason(d, logged, sizeof logged);
                lapse__log(c->cfg, LAPSE_LOG_WARN,
                           "event=decision order_id=%s decision=parked reason=\"%s\"",
                           d->msg.order_id[0] ? d->msg.order_id : "-", logged);
                rc = park(c, d, err);
                forwarded++;
                break;
            case LAPSE__ACT_EARLY:
                /* Never act early: the remainder goes down the ladder, whose TTLs run
                 * on the broker, and comes back through the expired queue. */
                rc = hold_again(c, d, &route, err);
                lapse__log(c->cfg, LAPSE_LOG_INFO,
                           "event=decision order_id=%s decision=early remaining_ms=%lld "
                           "reason=%s ladder_s=%lld",
                           d->msg.order_id, (long long)v->delay_ms,
                           lapse__why_name(v->why), (long long)route.seconds);
                forwarded++;
                break;
            case LAPSE__ACT_RETRY:
                /* The retry path: back down the ladder after a growing delay, the
                 * attempt counted in the message. Nothing waits behind it, and it is
                 * acked only once this publish is confirmed. */
                rc = hold_again(c, d, &route, err);
                logged_reason(d, logged, sizeof logged);
                lapse__log(c->cfg, LAPSE_LOG_WARN,
                           "event=decision order_id=%s decision=retry attempt=%d of=%d "
                           "delay_ms=%lld reason=\"%s\"",
                           d->msg.order_id, v->attempts, c->cfg->max_attempts,
                           (long long)v->delay_ms, logged);
                forwarded++;
                break;
            case LAPSE__ACT_CANCELLED:
            case LAPSE__ACT_NOOP:
                break;
        }
    }
    if (rc == LAPSE_OK && forwarded > 0) {
        int64_t t0 = lapse__metrics_now_us();
        rc = lapse__broker_wait_confirms(&c->out, CONSUMER_CONFIRM_WAIT_MS, err);
        lapse__metrics_latency(c->metrics, LAPSE__OP_BROKER_CONFIRM,
                               lapse__metrics_now_us() - t0);
    }
    bool all_ok = rc == LAPSE_OK;
    for (size_t i = 0; i < c->n && all_ok; i++) {
        all_ok = is_settled(&c->batch[i]);
    }
    if (all_ok) {
        for (size_t i = 0; i < c->n; i++) {
            count_forward(c, &c->batch[i]);
        }
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

void lapse__consumer_out_failed(lapse_consumer_t *c, lapse_status_t rc,
                                const lapse_error_t *why, const char *what) {
    char text[sizeof why->text];
    snprintf(text, sizeof text, "%s", why->text);
    lapse__consumer_sanitize(text);
    int64_t delay = lapse__backoff_ms(c->out_attempt++, 200, 10000);
    lapse__log(c->cfg, LAPSE_LOG_WARN,
               "event=%s status=%s reason=\"%s\" retry_in_ms=%lld", what,
               lapse_status_name(rc), text, (long long)delay);
    lapse__consumer_close_out(c);
    c->out_failure = LAPSE_OK;
    c->out_retry_at = lapse__time_add(lapse__mono_ms(), delay);
}

lapse_status_t lapse__consumer_open_out(lapse_consumer_t *c, lapse_error_t *err) {
    /* An events round still open on the old connection would take the new one's
     * confirms (it numbers its publishes from 1 again): end it first. Every close goes
     * through lapse__consumer_close_out, so this is only a guard. */
    if (c->relay.active) {
        lapse__consumer_close_out(c);
    }
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
    if (lapse__mono_ms() < c->out_retry_at) {
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED,
                               "publishing connection down, retrying later");
    }
    lapse_status_t rc = lapse__consumer_open_out(c, err);
    if (rc != LAPSE_OK) {
        lapse__consumer_out_failed(c, rc, err, "out_connect_failed");
        return rc;
    }
    c->out_attempt = 0;
    return LAPSE_OK;
}

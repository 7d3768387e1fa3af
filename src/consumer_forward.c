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
    (void)tag;
    lapse_consumer_t *c = opaque;
    if (outcome != LAPSE_OK && c->out_failure == LAPSE_OK) {
        c->out_failure = outcome;
    }
}

static lapse_status_t park(lapse_consumer_t *c, delivery_t *d, lapse_error_t *err) {
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
        /* A replayed and re-parked message gets fresh parking headers. */
        if (!lapse__hdr_is_parking(old.entries[i].key)) {
            entries[n++] = old.entries[i];
        }
    }
    entries[n++] = lapse__hdr_reason_entry(d->reason);
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
    lapse_status_t rc = lapse__broker_publish(&c->out, c->topo.parked_exchange, "", true,
                                              &props, d->env.message.body.bytes,
                                              d->env.message.body.len, NULL, err);
    free(entries);
    return rc;
}

/* The delivery back down the ladder for verdict.delay_ms, with verdict.attempts. */
static lapse_status_t hold_again(lapse_consumer_t *c, delivery_t *d,
                                 lapse__ladder_route_t *route, lapse_error_t *err) {
    lapse__ladder_route(d->verdict.delay_ms, route);
    d->msg.deadline_ms = d->deadline_ms;
    return lapse__publish_expiry(&c->out, c->topo.delay[route->top], route->routing_key,
                                 &d->msg, d->verdict.attempts, NULL, err);
}

static void logged_reason(const delivery_t *d, char *out, size_t cap) {
    snprintf(out, cap, "%s", d->reason);
    lapse__consumer_sanitize(out);
}

lapse_status_t lapse__consumer_forward(lapse_consumer_t *c, lapse_error_t *err) {
    lapse_status_t rc = LAPSE_OK;
    size_t forwarded = 0;
    for (size_t i = 0; i < c->n && rc == LAPSE_OK; i++) {
        delivery_t *d = &c->batch[i];
        const lapse__verdict_t *v = &d->verdict;
        char logged[sizeof d->reason];
        lapse__ladder_route_t route;
        switch (v->action) {
            case LAPSE__ACT_PARK:
                if (v->why == LAPSE__WHY_EXHAUSTED) {
                    /* The last failure, cut to leave room for the count. */
                    char last[sizeof d->reason - 40];
                    memcpy(last, d->reason, sizeof last - 1);
                    last[sizeof last - 1] = '\0';
                    snprintf(d->reason, sizeof d->reason, "failed %d times, last: %s",
                             v->attempts, last);
                }
                /* The header keeps the decoder's words; the log line one token. */
                logged_reason(d, logged, sizeof logged);
                lapse__log(c->cfg, LAPSE_LOG_WARN,
                           "event=decision order_id=%s decision=parked reason=\"%s\"",
                           d->msg.order_id[0] ? d->msg.order_id : "-", logged);
                rc = park(c, d, err);
                c->stats.parked++;
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
                c->stats.early++;
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
                c->stats.retried++;
                forwarded++;
                break;
            case LAPSE__ACT_CANCELLED:
            case LAPSE__ACT_NOOP:
                break;
        }
    }
    if (rc == LAPSE_OK && forwarded > 0) {
        rc = lapse__broker_wait_confirms(&c->out, CONSUMER_CONFIRM_WAIT_MS, err);
    }
    if (rc == LAPSE_OK && c->out_failure != LAPSE_OK) {
        rc = lapse_error_set(err, c->out_failure, "forwarding a delivery: %s",
                             lapse_strerror(c->out_failure));
        c->out_failure = LAPSE_OK;
    }
    return rc;
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
    lapse__broker_close(&c->out);
    c->out_failure = LAPSE_OK;
    c->out_retry_at = lapse__time_add(lapse__mono_ms(), delay);
}

lapse_status_t lapse__consumer_open_out(lapse_consumer_t *c, lapse_error_t *err) {
    char name[sizeof c->name + 4];
    snprintf(name, sizeof name, "%s out", c->name);
    return lapse__broker_open(&c->out, c->cfg, name, CONSUMER_WINDOW, on_settle, c, err);
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

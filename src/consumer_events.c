/* SPDX-License-Identifier: MIT
 * Consumer: the order.cancelled events it owes (docs/design.md, "Events"), published
 * after the ack through the outbox relay (events.c) on the publishing connection; and
 * the outbox backlog (a crash's or another consumer's), now and then. */
#include "consumer_int.h"

#include "events_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* No queue took the last events: they wait in the outbox, and the next try comes after
 * a growing delay. Until then the consumer publishes no events at all; its owed ones
 * stay owed (see lapse__consumer_events_owed), and the next try is a probe of one. */
static void events_unroutable(lapse_consumer_t *c, size_t returned) {
    int64_t waiting = -1;
    if (lapse_store_events_count(c->store, &waiting, NULL) == LAPSE_OK) {
        lapse__metrics_outbox(c->metrics, waiting);
    }
    int64_t delay = lapse__backoff_ms(c->events_attempt++, CONSUMER_EVENTS_RETRY_MIN_MS,
                                      CONSUMER_EVENTS_RETRY_MAX_MS);
    c->events_retry_at = lapse__time_add(lapse__mono_ms(), delay);
    c->backlog_at = c->events_retry_at;
    lapse__log(
        c->cfg, LAPSE_LOG_WARN,
        "event=events_unroutable exchange=%s returned=%zu waiting=%lld "
        "retry_in_ms=%lld note=\"no queue is bound to the exchange; events stay in "
        "the outbox\"",
        c->topo.events_exchange, returned, (long long)waiting, (long long)delay);
}

/* After a round: count what went out; log a failure or returns (and start their
 * backoff). True when it went through: no failure and nothing returned. */
static bool round_done(lapse_consumer_t *c, lapse_status_t rc,
                       const lapse__relay_report_t *report, lapse_error_t *err) {
    c->stats.events += report->published;
    lapse__metrics_events(c->metrics, report->published);
    if (rc != LAPSE_OK) {
        lapse__consumer_out_failed(c, rc, err, "events_failed");
        return false;
    }
    if (report->returned > 0) {
        events_unroutable(c, report->returned);
        return false;
    }
    return true;
}

/* One relay round on the publishing connection, waited for. */
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
    return round_done(c, rc, report, &err);
}

/* The first n owed went through: they are owed no more. */
static void drop_owed(lapse_consumer_t *c, size_t n) {
    n = n < c->n_owed ? n : c->n_owed;
    memmove(c->owed, c->owed + n, (c->n_owed - n) * sizeof *c->owed);
    c->n_owed -= n;
    c->owed_since = lapse__mono_ms(); /* for those left: owed since the round began */
}

bool lapse__consumer_events_settle(lapse_consumer_t *c, bool block) {
    if (!c->relay.active) {
        return true;
    }
    lapse_error_t err = {0};
    lapse_status_t rc = LAPSE_OK;
    int64_t left =
        lapse__time_add(c->relay_since, CONSUMER_CONFIRM_WAIT_MS) - lapse__mono_ms();
    if (block) {
        rc = lapse__relay_wait(&c->relay, left > 0 ? left : 0, &err);
    } else if (!lapse__relay_settled(&c->relay)) {
        rc = lapse__broker_poll(&c->out, 0, &err);
        if (rc == LAPSE_OK && !lapse__relay_settled(&c->relay)) {
            if (left > 0) {
                return false;
            }
            rc = lapse_error_set(
                &err, LAPSE_ERR_BROKER_TIMEOUT, "%zu events not confirmed within %d ms",
                c->relay.n - c->relay.n_settled, CONSUMER_CONFIRM_WAIT_MS);
        }
    }
    size_t in_round = c->relay_owed;
    lapse__relay_report_t report;
    rc = lapse__relay_finish(&c->relay, rc, &report, &err);
    c->relay_owed = 0;
    if (round_done(c, rc, &report, &err)) {
        drop_owed(c, in_round);
    }
    return true;
}

void lapse__consumer_close_out(lapse_consumer_t *c) {
    /* The close settles the round's unconfirmed publishes as failed: its confirmed ones
     * are marked, the rest stay owed. Whoever closed has logged why. */
    lapse__broker_close(&c->out);
    if (c->relay.active) {
        lapse__relay_report_t report;
        lapse__relay_finish(&c->relay, LAPSE_ERR_BROKER_CLOSED, &report, NULL);
        c->relay_owed = 0;
        c->stats.events += report.published;
        lapse__metrics_events(c->metrics, report.published);
    }
}

/* Events are published after the ack; a failure leaves them in the outbox for a later
 * try and never holds up cancelling. */
bool lapse__consumer_events(lapse_consumer_t *c, const int64_t *only, size_t n_only,
                            size_t limit) {
    /* The open round's events are published but not yet marked: a round started now
     * would read them as unpublished and publish them twice. */
    lapse__consumer_events_settle(c, true);
    if (lapse__mono_ms() < c->events_retry_at) {
        return false; /* unroutable a moment ago: tried again in time */
    }
    lapse__relay_report_t report;
    if (c->events_attempt > 0) {
        /* One event goes first, alone: when it is returned again, one publish was
         * wasted, not a thousand. One this consumer owes when it owes any: a store
         * shared by many hosts keeps those claimed for their owner, so a walk of the
         * outbox would find nothing and prove nothing. */
        const int64_t *probe = c->n_owed > 0 ? c->owed : NULL;
        if (!relay_round(c, probe, probe != NULL ? 1 : 0, 1, &report)) {
            return false;
        }
        c->events_attempt = 0;
        if (report.published > 0) {
            lapse__log(c->cfg, LAPSE_LOG_INFO, "event=events_routable exchange=%s",
                       c->topo.events_exchange);
        }
        /* The backlog (other consumers' events among it) waits for its usual pass, so
         * that every consumer first publishes what it owes itself. */
        c->backlog_at = lapse__time_add(lapse__mono_ms(), CONSUMER_BACKLOG_EVERY_MS);
    }
    if (!relay_round(c, only, n_only, limit, &report)) {
        return false;
    }
    if (!only && report.read == limit) {
        c->backlog_at = 0; /* more waiting: look again on the next idle pass */
    }
    return true;
}

/* Publishes all that is owed now, as a round left open: confirmed while the next
 * batches are cancelled, until lapse__consumer_events_settle finds its confirms in. */
static void start_round(lapse_consumer_t *c) {
    lapse_error_t err = {0};
    if (lapse__consumer_ensure_out(c, &err) != LAPSE_OK) {
        return;
    }
    size_t n = c->n_owed;
    lapse_status_t rc = lapse__relay_start(&c->relay, &c->out, c->store,
                                           c->topo.events_exchange, c->owed, n, n, &err);
    c->relay_owed = n;
    c->relay_since = lapse__mono_ms();
    if (rc != LAPSE_OK) {
        lapse__relay_report_t report;
        rc = lapse__relay_finish(&c->relay, rc, &report, &err);
        c->relay_owed = 0;
        round_done(c, rc, &report, &err);
    }
}

void lapse__consumer_events_owed(lapse_consumer_t *c) {
    if (!lapse__consumer_events_settle(c, false) || c->n_owed == 0 ||
        lapse__mono_ms() < lapse__consumer_owed_due(c) ||
        (c->n_owed < CONSUMER_EVENTS_CHUNK &&
         lapse__mono_ms() - c->owed_since < CONSUMER_EVENTS_DELAY_MS)) {
        return;
    }
    if (c->events_attempt > 0) {
        /* After returns: the probe first, waited for (lapse__consumer_events). Owed
         * until they went through; those published meanwhile by someone else are
         * skipped by the relay (it reads unpublished rows only). */
        if (lapse__consumer_events(c, c->owed, c->n_owed, c->n_owed)) {
            c->n_owed = 0;
        }
        return;
    }
    start_round(c);
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
        c->owed_since = lapse__mono_ms();
    }
    size_t cap = CONSUMER_OWED_MAX;
    if (n > cap) { /* cannot happen: a batch is at most 32767 deliveries */
        seqs += n - cap;
        n = cap;
    }
    /* Cancelling ran ahead of the events' confirms while the broker takes them: wait
     * for the open round (at most CONSUMER_CONFIRM_WAIT_MS) and start the next, so the
     * events keep pace with the cancellations instead of falling to the backlog pass. */
    while (c->n_owed + n > cap && c->events_attempt == 0 &&
           lapse__mono_ms() >= lapse__consumer_owed_due(c)) {
        if (!c->relay.active) {
            start_round(c);
            if (!c->relay.active) {
                break; /* failed, logged: the connection's backoff has begun */
            }
        }
        size_t before = c->n_owed;
        lapse__consumer_events_settle(c, true);
        if (c->n_owed == before) {
            break; /* the round failed or came back: the backoff decides */
        }
    }
    if (c->n_owed + n > cap) {
        /* Held back long (no queue bound, no connection): the oldest are left to the
         * outbox's backlog pass, so memory stays bounded. */
        size_t drop = c->n_owed + n - cap;
        memmove(c->owed, c->owed + drop, (c->n_owed - drop) * sizeof *c->owed);
        c->n_owed -= drop;
        c->relay_owed -= drop < c->relay_owed ? drop : c->relay_owed;
    }
    memcpy(c->owed + c->n_owed, seqs, n * sizeof *c->owed);
    c->n_owed += n;
}

void lapse__consumer_events_final(lapse_consumer_t *c) {
    int64_t deadline = lapse__time_add(lapse__mono_ms(), CONSUMER_STOP_EVENTS_MS);
    lapse__relay_report_t total = {0};
    lapse_error_t err = {0};
    lapse_status_t rc = LAPSE_OK;
    size_t owed = c->n_owed; /* the open round's among them */
    size_t k = 0;
    if (c->relay.active) {
        /* Its confirms first: what they settle is not published again below. */
        c->out.stop = NULL;
        c->out.give_up_at = deadline;
        lapse__relay_report_t one;
        size_t in_round = c->relay_owed;
        rc = lapse__relay_wait(&c->relay, CONSUMER_STOP_EVENTS_MS, &err);
        rc = lapse__relay_finish(&c->relay, rc, &one, &err);
        c->relay_owed = 0;
        lapse__relay_report_add(&total, &one);
        k = rc == LAPSE_OK && one.returned == 0 ? in_round : owed;
    }
    /* The last chance: neither the publishing connection's nor the events' backoff is
     * waited out (a queue may have been bound meanwhile). Only what this consumer owes:
     * the rest of the outbox may be another consumer's, publishing it right now. */
    if (rc == LAPSE_OK && k < owed && !c->out.open) {
        rc = lapse__consumer_open_out(c, &err);
    }
    /* Already stopping: this flush has its own bound instead of the stop flag. */
    c->out.stop = NULL;
    c->out.give_up_at = deadline;
    while (rc == LAPSE_OK && k < owed && total.returned == 0) {
        int64_t left = deadline - lapse__mono_ms();
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
    lapse__consumer_close_out(c);
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

/* With metrics: the outbox count, which is also the store's health probe while no
 * delivery comes (every CONSUMER_BACKLOG_EVERY_MS, a count of unpublished rows). */
static void count_outbox(lapse_consumer_t *c, int64_t mono) {
    if (c->metrics == NULL || mono < c->count_at) {
        return;
    }
    c->count_at = lapse__time_add(mono, CONSUMER_BACKLOG_EVERY_MS);
    int64_t pending = -1;
    lapse_error_t err = {0};
    int64_t t0 = lapse__metrics_now_us();
    lapse_status_t rc = lapse_store_events_count(c->store, &pending, &err);
    lapse__metrics_latency(c->metrics, LAPSE__OP_STORE_COUNT,
                           lapse__metrics_now_us() - t0);
    lapse__metrics_store(c->metrics, rc == LAPSE_OK, err.text);
    if (rc == LAPSE_OK) {
        lapse__metrics_outbox(c->metrics, pending);
    }
}

void lapse__consumer_events_backlog(lapse_consumer_t *c) {
    int64_t mono = lapse__mono_ms();
    count_outbox(c, mono);
    if (mono >= c->backlog_at) {
        c->backlog_at = lapse__time_add(mono, CONSUMER_BACKLOG_EVERY_MS);
        lapse__consumer_events(c, NULL, 0, CONSUMER_EVENTS_CHUNK);
    }
}

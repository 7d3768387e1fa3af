/* SPDX-License-Identifier: MIT
 * Consumer: the safety net in process (docs/design.md, "The safety nets"). Every
 * sweep_every, orders never confirmed are published again and orders still pending a
 * grace period after their deadline are cancelled directly, by the consumer's decision
 * clock for direct cancels. While the broker is down, the direct cancels still run:
 * they need only the store. */
#include "consumer_int.h"

#include <lapse/sweep.h>

#include <stdio.h>

typedef struct budget {
    const volatile sig_atomic_t *stop;
    int64_t until; /* mono */
} budget_t;

/* Asked between batches and between busy-store retries: a stop or the end of the time
 * budget ends the call (report.more says there is more). */
static int over_budget(void *opaque, const lapse_sweep_report_t *so_far) {
    (void)so_far;
    const budget_t *b = opaque;
    return *b->stop || lapse__mono_ms() >= b->until;
}

static void log_skipped(lapse_consumer_t *c, const char *why) {
    if (why == c->sweep_skipped) {
        return; /* said when it started; said again when it changes */
    }
    c->sweep_skipped = why;
    if (why) {
        lapse__log(
            c->cfg, LAPSE_LOG_WARN,
            "event=sweep_cancel_skipped reason=%s note=\"no time known to be at or "
            "before the broker's; direct cancels wait for one\"",
            why);
    }
}

void lapse__consumer_drained(lapse_consumer_t *c) {
    const char *why = NULL;
    int64_t now = lapse__consumer_sweep_now(c, true, &why);
    if (now == LAPSE__NOTHING_DUE) {
        now = lapse_clock_now_ms(); /* no broker bound: the wall clock, as the sweep */
    }
    if (now > c->delivered_until) {
        c->delivered_until = now;
    }
}

/* The bound for direct cancels while consuming: how far the expired queue is drained.
 * Logged when a backlog older than the grace starts and stops holding them back. */
static int64_t delivered_until(lapse_consumer_t *c, int64_t now) {
    /* Nothing delivered and no empty wait yet (just connected): nothing is known
     * lost. 1 ms after the epoch bounds every deadline out. */
    int64_t until = c->delivered_until > 0 ? c->delivered_until : 1;
    bool behind = now != LAPSE__NOTHING_DUE && c->delivered_until > 0 &&
                  now - until > c->cfg->sweep_grace_ms;
    if (behind != c->sweep_behind) {
        c->sweep_behind = behind;
        if (behind) {
            lapse__log(c->cfg, LAPSE_LOG_WARN,
                       "event=sweep_behind_backlog behind_ms=%lld note=\"the expired "
                       "queue holds messages older than the grace; direct cancels wait "
                       "for the consumer to reach them\"",
                       (long long)(now - until));
        } else {
            lapse__log(c->cfg, LAPSE_LOG_INFO, "event=sweep_caught_up");
        }
    }
    return until;
}

void lapse__consumer_sweep(lapse_consumer_t *c, bool broker_up) {
    int64_t mono = lapse__mono_ms();
    if (c->cfg->sweep_every_ms <= 0 || mono < c->sweep_at || *c->stop) {
        return;
    }
    lapse_sweep_opts_t opts;
    lapse_sweep_opts_init(&opts);
    opts.grace_ms = c->cfg->sweep_grace_ms;
    opts.in_flight_ms = c->cfg->sweep_in_flight_ms;
    if (c->prune_at == 0) {
        c->prune_at = lapse__time_add(mono, CONSUMER_PRUNE_EVERY_MS);
    }
    if (mono >= c->prune_at) {
        opts.retention_ms = c->cfg->retention_ms;
        c->prune_at = lapse__time_add(mono, CONSUMER_PRUNE_EVERY_MS);
    }
    opts.max_orders = CONSUMER_SWEEP_CHUNK;
    opts.events = false;        /* the consumer publishes the outbox itself */
    opts.republish = broker_up; /* publishing needs the broker */
    const char *why = NULL;
    if (lapse_store_has_clock(c->store)) {
        /* The store's clock decides (PostgreSQL's server): no broker bound needed. */
        opts.now_ms = 0;
        opts.cancel = true;
    } else {
        opts.now_ms = lapse__consumer_sweep_now(c, broker_up, &why);
        opts.cancel = opts.now_ms != LAPSE__NOTHING_DUE;
    }
    log_skipped(c, why);
    if (broker_up) {
        /* While the broker is down nothing can be delivered: the grace alone decides. */
        opts.delivered_until_ms =
            delivered_until(c, opts.now_ms != 0 ? opts.now_ms : lapse_clock_now_ms());
    }
    budget_t budget = {.stop = c->stop,
                       .until = lapse__time_add(mono, CONSUMER_SWEEP_BUDGET_MS)};
    opts.progress = over_budget;
    opts.progress_opaque = &budget;
    lapse_sweep_report_t report = {0};
    lapse_error_t err = {0};
    lapse_status_t rc = LAPSE_OK;
    if (opts.cancel || opts.republish) {
        rc = lapse_sweep_run(c->cfg, c->store, &opts, &report, &err);
    }
    bool stopped = rc == LAPSE_ERR_STOPPED;
    lapse__metrics_sweep_cancelled(c->metrics, report.cancelled);
    /* More to do (a full chunk, or the budget ran out): again on the next pass, after
     * the deliveries that came meanwhile. */
    c->sweep_at = report.more && (rc == LAPSE_OK || stopped)
                      ? lapse__mono_ms()
                      : lapse__time_add(lapse__mono_ms(), c->cfg->sweep_every_ms);
    if (rc != LAPSE_OK && !stopped) {
        char text[sizeof err.text];
        snprintf(text, sizeof text, "%s", err.text);
        lapse__consumer_sanitize(text);
        lapse__log(c->cfg, LAPSE_LOG_WARN, "event=sweep_failed status=%s reason=\"%s\"",
                   lapse_status_name(rc), text);
    }
    if (report.republished + report.cancelled + report.failed > 0) {
        lapse__log(c->cfg, LAPSE_LOG_INFO,
                   "event=sweep republished=%llu cancelled=%llu failed=%llu more=%d "
                   "broker=%s",
                   (unsigned long long)report.republished,
                   (unsigned long long)report.cancelled,
                   (unsigned long long)report.failed, report.more ? 1 : 0,
                   broker_up ? "up" : "down");
    }
}

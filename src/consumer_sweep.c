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

/* Over this, a message says nothing of the queues' backlog (a replay by hand of an old
 * message, a forged deadline). */
#define LAG_BELIEVED_MS (INT64_C(7) * 86400 * 1000)

void lapse__consumer_arrived(lapse_consumer_t *c, int64_t lag_ms, int attempts) {
    if (attempts == 0 && lag_ms > c->lag_now && lag_ms <= LAG_BELIEVED_MS) {
        c->lag_now = lag_ms;
    }
}

/* How late messages arrive now: the larger of this period's lag and the last one's, so
 * that a new period starts knowing the backlog. Logged when it passes the grace (the
 * direct cancels are held back from a backlog the grace alone would call lost) and when
 * it falls below it again. */
static int64_t arrival_lag(lapse_consumer_t *c, int64_t mono) {
    int64_t period = c->cfg->sweep_every_ms > 1000 ? c->cfg->sweep_every_ms : 1000;
    if (c->lag_since == 0) {
        c->lag_since = mono;
    } else if (mono - c->lag_since >= period) {
        c->lag_prev = c->lag_now;
        c->lag_now = 0;
        c->lag_since = mono;
    }
    int64_t lag = c->lag_now > c->lag_prev ? c->lag_now : c->lag_prev;
    bool behind = lag > c->cfg->sweep_grace_ms;
    if (behind != c->sweep_behind) {
        c->sweep_behind = behind;
        if (behind) {
            lapse__log(
                c->cfg, LAPSE_LOG_WARN,
                "event=sweep_behind_backlog lag_ms=%lld grace_ms=%lld note=\"expiry "
                "messages arrive later than the grace; direct cancels wait that "
                "much longer, so a backlog is cancelled as expiries, not as lost\"",
                (long long)lag, (long long)c->cfg->sweep_grace_ms);
        } else {
            lapse__log(c->cfg, LAPSE_LOG_INFO, "event=sweep_caught_up lag_ms=%lld",
                       (long long)lag);
        }
    }
    return lag;
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
    /* While the broker is down nothing arrives: the grace alone decides. */
    opts.lag_ms = broker_up ? arrival_lag(c, mono) : 0;
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

/* SPDX-License-Identifier: MIT
 * The sweeper: the store-side safety net under the broker path. It publishes again what
 * was recorded but never confirmed, and cancels directly what is still pending a grace
 * period after its deadline (its message was lost). Reconcile re-publishes everything. */
#ifndef LAPSE_SWEEP_H
#define LAPSE_SWEEP_H

#include <lapse/config.h>
#include <lapse/store.h>

/** Counts of one sweep or reconcile run. */
typedef struct lapse_sweep_report {
    uint64_t republished;     /* published again, confirmed, marked scheduled */
    uint64_t cancelled;       /* cancelled directly: deadline + grace had passed */
    uint64_t would_republish; /* dry run: would have been published again */
    uint64_t would_cancel;    /* dry run: would have been cancelled */
    uint64_t skipped;         /* changed meanwhile (paid, cancelled): left alone */
    uint64_t failed;          /* left as they were by a failure (see the return code) */
    bool more; /* stopped at max_orders (or by progress): there may be more to do */
    uint64_t events_published; /* outbox events published at the end (opts.events) */
    int64_t events_waiting;    /* outbox events still unpublished after that; -1 when
                                  not counted (no events part, or the store failed) */
    uint64_t pruned_orders;    /* settled orders deleted (opts.retention_ms) */
    uint64_t pruned_events;    /* published outbox events deleted (opts.retention_ms) */
} lapse_sweep_report_t;

/** Called after every batch with the counts so far (borrowed for the call); a non-zero
 *  return stops the run, which then returns LAPSE_ERR_STOPPED. */
typedef int (*lapse_sweep_progress_cb)(void *opaque, const lapse_sweep_report_t *so_far);

/**
 * Options of a run. Caller-allocated; fill it with lapse_sweep_opts_init() first, so
 * fields added later get their defaults.
 */
typedef struct lapse_sweep_opts {
    int64_t grace_ms;     /* cancel directly once deadline + grace has passed (60 s) */
    int64_t in_flight_ms; /* re-publish only orders created longer ago than this, so a
                             publish still waiting for its confirm is left alone (30 s) */
    bool dry_run;         /* count only: no broker connection, no write (false) */
    bool republish;       /* run the re-publish part, which needs the broker (true) */
    bool cancel;          /* run the direct-cancel part, store only (true) */
    size_t max_orders;    /* per part and run; 0 (default): no limit. A periodic caller
                             bounds each call with it and calls again while report.more */
    bool events;          /* at the end, publish the outbox's events, those of the orders
                             just cancelled and any older ones (true); a consumer, which
                             publishes the outbox itself, turns it off */
    int64_t now_ms;       /* the time direct cancels are decided by, ms since the epoch;
                             0 (default): this host's wall clock. A consumer passes its
                             broker-clock bound (docs/design.md, "The clock rule").
                             Ignored by a store with its own clock
                             (lapse_store_has_clock), which decides by that */
    int64_t retention_ms; /* > 0: also delete settled orders and published events older
                             than this (lapse_store_prune), in batches; 0 (default):
                             keep everything */
    lapse_sweep_progress_cb progress; /* optional (NULL); also asked between busy-store
                                         retries, so a caller's stop or time budget is
                                         seen within one store wait */
    void *progress_opaque;
    int64_t lag_ms; /* how late expiry messages arrive now (>= 0): a direct
                       cancel waits deadline + grace + lag_ms, so that a backlog
                       (a holding queue the broker is slow to dead-letter, or an
                       expired queue behind its consumers) is cancelled by its
                       messages, not as lost. A consumer passes the lag it sees;
                       0 (default): none */
} lapse_sweep_opts_t;

/** Set the defaults above. */
LAPSE_API void lapse_sweep_opts_init(lapse_sweep_opts_t *opts);

/**
 * Sweep once. First (store only, so it runs whatever the broker's state) every pending
 * order whose deadline + grace_ms has passed is cancelled directly, in batches, with
 * lapse_store_cancel_batch (compare-and-set: holds released and one outbox event each),
 * each logged as
 * "event=sweep_cancel order_id=.. deadline_ms=.. lag_ms=..". Then every pending order
 * never confirmed as scheduled and created more than in_flight_ms ago is published again
 * with its recorded deadline (a publisher connection is opened only when there is such an
 * order, so a run with nothing to do costs two short indexed reads). A busy store is
 * retried with backoff. Last, with opts->events, the outbox is published (the events
 * relay: mandatory, confirmed, marked; stopped by progress like the rest) when there is
 * anything in it; a broker out of reach or no queue bound to the events exchange is one
 * warning line and leaves them in the outbox, without failing the run. With
 * retention_ms, settled orders and published events older than that are pruned last
 * (at most max_orders of each per run when that is set).
 *
 * @param cfg    borrowed (broker, prefix, classes, log sink).
 * @param store  borrowed; an already-open handle, used on the calling thread only.
 * @param opts   borrowed; NULL means the defaults.
 * @param report filled (zeroed first), also on failure.
 * @return LAPSE_OK; or the first failure, with err naming the part ("cancel: ..." or
 *         "republish: ..."): a failing part does not stop the other one.
 * LAPSE_ERR_STOPPED when progress asked to stop. Thread-safety: as the store handle's.
 */
LAPSE_API lapse_status_t lapse_sweep_run(const lapse_config_t *cfg, lapse_store_t *store,
                                         const lapse_sweep_opts_t *opts,
                                         lapse_sweep_report_t *report,
                                         lapse_error_t *err);

/**
 * Publish the expiry message of EVERY pending order again, with its recorded deadline
 * (for a new broker or vhost; duplicates on the old one are harmless no-ops). Uses
 * opts->dry_run, max_orders and progress; counts go to republished / would_republish /
 * skipped / failed. Same parameters and returns as lapse_sweep_run().
 */
LAPSE_API lapse_status_t lapse_sweep_reconcile(const lapse_config_t *cfg,
                                               lapse_store_t *store,
                                               const lapse_sweep_opts_t *opts,
                                               lapse_sweep_report_t *report,
                                               lapse_error_t *err);

#endif

/* SPDX-License-Identifier: MIT
 * The sweeper: cancel directly what the broker lost, publish again what it never
 * confirmed, and reconcile (publish every pending order again). */
#include <lapse/publisher.h>
#include <lapse/sweep.h>

#include "backoff_int.h"
#include "clock_int.h"
#include "config_int.h"
#include "events_int.h"
#include "topology_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CANCEL_BATCH   200 /* orders per cancel transaction */
#define STORE_ATTEMPTS 8
#define CONNECT_TRIES  3
#define PROGRESS_EVERY 200 /* orders between progress calls */
/* How long a sweep's claim on the unscheduled orders it re-publishes lasts (a store
 * shared by many hosts): a competing sweep skips them meanwhile. */
#define REPUBLISH_CLAIM_MS 60000
#define OWN_EVENTS_MAX     100000

typedef struct sweep sweep_t;
typedef int (*visit_fn)(sweep_t *s, const lapse_order_t *order);

struct sweep {
    const lapse_config_t *cfg;
    lapse_store_t *store;
    const lapse_sweep_opts_t *opts;
    lapse_sweep_report_t *report;

    /* The walk in progress: what to do per order, and the last order seen, from which a
     * walk interrupted by a busy store resumes. */
    visit_fn visit;
    const char *event; /* "sweep" or "reconcile": the run, in log lines */
    const char *part;  /* "cancel" or "republish": error prefix */
    size_t seen;
    int64_t last_deadline;
    char last_id[LAPSE_ORDER_ID_MAX + 1];
    size_t since_progress;
    bool stopped;

    /* The first failure of the run, and whether the current part already failed. */
    lapse_status_t rc;
    lapse_error_t err;
    bool part_failed;

    /* Direct cancellation: the batch being collected. */
    int64_t cancel_due_before; /* deadline < this: lost, cancelled directly */
    size_t n_cancel;
    char cancel_ids[CANCEL_BATCH][LAPSE_ORDER_ID_MAX + 1];
    lapse_cancel_item_t items[CANCEL_BATCH];
    /* The outbox rows of what this run cancelled, published first and by seq (a store
     * shared by many hosts hands them to no other relay for a while: they are ours). At
     * most OWN_EVENTS_MAX; the rest waits for the walk of the whole outbox. */
    int64_t *own_seqs;
    size_t n_own, cap_own;

    /* Re-publishing: opened on the first order that needs it. */
    lapse_publisher_t *pub;
    lapse_status_t pub_rc; /* not LAPSE_OK once the publisher failed: the rest is counted
                              as failed without being tried */
    bool skip_lost; /* leave orders the cancel part owns (deadline + grace passed) */
};

void lapse_sweep_opts_init(lapse_sweep_opts_t *opts) {
    if (opts == NULL) {
        return;
    }
    *opts = (lapse_sweep_opts_t){.grace_ms = 60000,
                                 .in_flight_ms = 30000,
                                 .republish = true,
                                 .cancel = true,
                                 .events = true};
}

/* Logs a failure of the current part and keeps the run's first one, as
 * "<part>: <detail>". */
static void part_fail(sweep_t *s, lapse_status_t rc, const char *detail) {
    lapse__log(s->cfg, LAPSE_LOG_ERROR, "event=%s_failed part=%s status=%s reason=\"%s\"",
               s->event, s->part, lapse_status_name(rc), detail);
    if (s->part_failed) {
        return;
    }
    s->part_failed = true;
    if (s->rc == LAPSE_OK || s->rc == LAPSE_ERR_STOPPED) {
        s->rc = lapse_error_set(&s->err, rc, "%s: %s", s->part, detail);
    }
}

static int progress(sweep_t *s) {
    if (s->opts->progress != NULL &&
        s->opts->progress(s->opts->progress_opaque, s->report) != 0) {
        s->stopped = true;
        s->report->more = true;
        if (s->rc == LAPSE_OK) {
            s->rc = lapse_error_set(&s->err, LAPSE_ERR_STOPPED, "%s: stopped", s->part);
        }
    }
    return s->stopped;
}

static int on_order(void *opaque, const lapse_order_t *order) {
    sweep_t *s = opaque;
    s->seen++;
    s->last_deadline = order->deadline_ms;
    memcpy(s->last_id, order->order_id, sizeof(s->last_id));
    if (s->visit(s, order) != 0) {
        return 1;
    }
    if (++s->since_progress >= PROGRESS_EVERY) {
        s->since_progress = 0;
        return progress(s);
    }
    return 0;
}

/* Walks the orders of filter through s->visit, resuming after the last order seen when
 * the store was busy, and honouring max_orders across resumptions. */
static void walk(sweep_t *s, lapse_pending_filter_t *filter) {
    s->seen = 0;
    s->since_progress = 0;
    size_t max = s->opts->max_orders;
    for (unsigned attempt = 0;; attempt++) {
        if (s->seen > 0) {
            filter->after_deadline_ms = s->last_deadline;
            filter->after_order_id = s->last_id;
        }
        filter->limit = max > 0 ? max - s->seen : 0;
        lapse_error_t err = {0};
        lapse_status_t rc = lapse_store_pending(s->store, filter, on_order, s, &err);
        if (rc == LAPSE_ERR_STORE_BUSY && attempt + 1 < STORE_ATTEMPTS && !s->stopped &&
            !progress(s) && (max == 0 || s->seen < max)) {
            lapse__log(s->cfg, LAPSE_LOG_WARN,
                       "event=store_retry op=%s_%s_read attempt=%u", s->event, s->part,
                       attempt + 1);
            lapse__sleep_ms(lapse__backoff_ms(attempt, 50, 2000), NULL);
            continue;
        }
        if (rc != LAPSE_OK) {
            char detail[sizeof(err.text) + 32];
            snprintf(detail, sizeof(detail), "reading pending orders: %s", err.text);
            part_fail(s, rc, detail);
        }
        break;
    }
    if (max > 0 && s->seen >= max) {
        s->report->more = true;
    }
}

/* ---- direct cancellation ---------------------------------------------------------- */

static void remember_event(sweep_t *s, int64_t seq) {
    if (seq <= 0 || s->n_own >= OWN_EVENTS_MAX) {
        return;
    }
    if (s->n_own == s->cap_own) {
        size_t cap = s->cap_own == 0 ? 256 : 2 * s->cap_own;
        int64_t *grown = realloc(s->own_seqs, cap * sizeof *grown);
        if (grown == NULL) {
            return; /* the walk of the whole outbox publishes it */
        }
        s->own_seqs = grown;
        s->cap_own = cap;
    }
    s->own_seqs[s->n_own++] = seq;
}

static lapse_status_t flush_cancels(sweep_t *s) {
    size_t n = s->n_cancel;
    if (n == 0) {
        return LAPSE_OK;
    }
    s->n_cancel = 0;
    lapse_status_t rc = LAPSE_OK;
    lapse_error_t err = {0};
    int64_t now = 0;
    for (unsigned attempt = 0; attempt < STORE_ATTEMPTS; attempt++) {
        for (size_t i = 0; i < n; i++) {
            s->items[i] = (lapse_cancel_item_t){.order_id = s->cancel_ids[i]};
        }
        /* Taken per attempt: the compare-and-set checks deadline <= now, and every
         * order here was due a grace period before the walk began. A caller's decision
         * clock (opts.now_ms, the consumer's broker-clock bound) is used as given: it is
         * the time the caller vouches for, and it is never later than the truth. A store
         * with its own clock decides by that one instead (lapse_store_has_clock). */
        now = s->opts->now_ms != 0 ? s->opts->now_ms : lapse_clock_now_ms();
        rc = lapse_store_cancel_batch(s->store, s->items, n, now, &err);
        if (rc != LAPSE_ERR_STORE_BUSY || progress(s)) {
            break;
        }
        lapse__log(s->cfg, LAPSE_LOG_WARN, "event=store_retry op=sweep_cancel attempt=%u",
                   attempt + 1);
        lapse__sleep_ms(lapse__backoff_ms(attempt, 50, 2000), NULL);
    }
    if (rc != LAPSE_OK) {
        s->report->failed += n;
        part_fail(s, rc, err.text);
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        const lapse_cancel_item_t *item = &s->items[i];
        if (item->outcome != LAPSE_CANCEL_DONE) {
            /* Paid or cancelled since the walk read it: exactly what should happen. */
            s->report->skipped++;
            continue;
        }
        s->report->cancelled++;
        remember_event(s, item->event_seq);
        lapse__log(s->cfg, LAPSE_LOG_WARN,
                   "event=sweep_cancel order_id=%s deadline_ms=%lld lag_ms=%lld "
                   "reason=message_lost",
                   item->order_id, (long long)item->deadline_ms,
                   (long long)(item->now_ms - item->deadline_ms));
    }
    return LAPSE_OK;
}

static int visit_cancel(sweep_t *s, const lapse_order_t *order) {
    if (s->opts->dry_run) {
        s->report->would_cancel++;
        return 0;
    }
    memcpy(s->cancel_ids[s->n_cancel++], order->order_id, LAPSE_ORDER_ID_MAX + 1);
    if (s->n_cancel == CANCEL_BATCH) {
        return flush_cancels(s) != LAPSE_OK;
    }
    return 0;
}

/* ---- pruning ---------------------------------------------------------------------- */

#define PRUNE_BATCH 1000 /* rows of each kind per prune transaction */

static void prune(sweep_t *s, int64_t now) {
    s->part = "prune";
    s->part_failed = false;
    int64_t before = lapse__time_add(now, -s->opts->retention_ms);
    size_t max = s->opts->max_orders;
    while (!s->stopped) {
        size_t done = (size_t)(s->report->pruned_orders > s->report->pruned_events
                                   ? s->report->pruned_orders
                                   : s->report->pruned_events);
        if (max > 0 && done >= max) {
            s->report->more = true;
            return;
        }
        size_t limit = max > 0 && max - done < PRUNE_BATCH ? max - done : PRUNE_BATCH;
        int64_t orders = 0, events = 0;
        lapse_error_t err = {0};
        lapse_status_t rc =
            lapse_store_prune(s->store, before, limit, &orders, &events, &err);
        if (rc == LAPSE_ERR_STORE_BUSY) {
            /* Never urgent: a later run prunes, and a busy store is not kept waiting. */
            lapse__log(s->cfg, LAPSE_LOG_INFO, "event=prune_deferred reason=store_busy");
            return;
        }
        if (rc != LAPSE_OK) {
            part_fail(s, rc, err.text);
            return;
        }
        s->report->pruned_orders += (uint64_t)orders;
        s->report->pruned_events += (uint64_t)events;
        if ((size_t)orders < limit && (size_t)events < limit) {
            return;
        }
        progress(s);
    }
}

static void cancel_lost(sweep_t *s) {
    s->part = "cancel";
    s->part_failed = false;
    s->visit = visit_cancel;
    lapse_pending_filter_t filter;
    lapse_pending_filter_init(&filter);
    filter.due_before_ms = s->cancel_due_before;
    walk(s, &filter);
    flush_cancels(s);
}

/* ---- re-publishing ---------------------------------------------------------------- */

static void on_published(void *opaque, uint64_t ref, const char *order_id,
                         lapse_status_t rc, const char *reason) {
    (void)ref;
    sweep_t *s = opaque;
    if (rc == LAPSE_OK) {
        s->report->republished++;
        lapse__log(s->cfg, LAPSE_LOG_INFO, "event=%s_republish order_id=%s", s->event,
                   order_id);
    } else if (rc == LAPSE_ERR_STORE_STATE) {
        s->report->skipped++; /* paid or cancelled since the walk read it */
    } else {
        s->report->failed++;
        char detail[sizeof(s->err.text) + LAPSE_ORDER_ID_MAX];
        snprintf(detail, sizeof(detail), "order %s: %s", order_id, reason);
        part_fail(s, rc, detail);
    }
}

static lapse_status_t open_publisher(sweep_t *s) {
    lapse_status_t rc = LAPSE_OK;
    lapse_error_t err = {0};
    for (unsigned attempt = 0; attempt < CONNECT_TRIES; attempt++) {
        s->pub = lapse_publisher_open(s->cfg, s->store, on_published, s, &rc, &err);
        if (s->pub != NULL || !lapse_status_is_retriable(rc)) {
            break;
        }
        if (attempt + 1 < CONNECT_TRIES) {
            lapse__sleep_ms(lapse__backoff_ms(attempt, 250, 1000), NULL);
        }
    }
    if (s->pub == NULL) {
        part_fail(s, rc, err.text);
    }
    return rc;
}

static int visit_republish(sweep_t *s, const lapse_order_t *order) {
    if (s->skip_lost && order->deadline_ms < s->cancel_due_before) {
        return 0;
    }
    if (s->opts->dry_run) {
        s->report->would_republish++;
        return 0;
    }
    if (s->pub_rc == LAPSE_OK && s->pub == NULL) {
        s->pub_rc = open_publisher(s);
    }
    if (s->pub_rc != LAPSE_OK) {
        /* The broker is out of reach: the order stays pending and unscheduled for the
         * next sweep. Counting the rest keeps the report honest about what is left. */
        s->report->failed++;
        return 0;
    }
    /* Timeout 0: the publisher routes the message for the recorded deadline. Re-inserting
     * the order with its own deadline is accepted as a re-publish and leaves its holds
     * alone; confirmed, it is marked scheduled. */
    lapse_new_order_t again = {.order_id = order->order_id,
                               .deadline_ms = order->deadline_ms,
                               .created_at_ms = order->created_at_ms};
    lapse_error_t err = {0};
    lapse_status_t rc = lapse_publisher_submit(s->pub, &again, 0, 0, &err);
    if (rc != LAPSE_OK) {
        /* Every order not yet settled has been reported failed to on_published. */
        s->pub_rc = rc;
        part_fail(s, rc, err.text);
    }
    return 0;
}

static void republish(sweep_t *s, lapse_pending_filter_t *filter) {
    s->part = "republish";
    s->part_failed = false;
    s->visit = visit_republish;
    s->pub = NULL;
    s->pub_rc = LAPSE_OK;
    walk(s, filter);
    if (s->pub != NULL) {
        lapse_error_t err = {0};
        lapse_status_t rc = LAPSE_OK;
        if (s->pub_rc == LAPSE_OK) {
            rc = lapse_publisher_flush(s->pub, &err);
        }
        if (rc != LAPSE_OK) {
            part_fail(s, rc, err.text);
        }
        lapse_publisher_close(s->pub);
        s->pub = NULL;
    }
}

/* ---- events ----------------------------------------------------------------------- */

static bool events_stop(void *opaque) {
    sweep_t *s = opaque;
    return s->stopped || progress(s) != 0;
}

/* One warning line that says why events stay in the outbox; the run does not fail for it:
 * the cancellations are done, and a consumer or the next sweep publishes them. */
static void events_left(sweep_t *s, const char *why, lapse_status_t rc,
                        const char *detail) {
    char text[sizeof s->err.text];
    snprintf(text, sizeof text, "%s", detail);
    for (char *p = text; *p; p++) {
        *p = *p == '"' || *p == '\n' ? '\'' : *p;
    }
    lapse__log(s->cfg, LAPSE_LOG_WARN,
               "event=%s_events_left reason=%s status=%s detail=\"%s\" waiting=%lld "
               "note=\"left in the outbox for a consumer or the next sweep\"",
               s->event, why, lapse_status_name(rc), text,
               (long long)s->report->events_waiting);
}

/* Publish the outbox (the events of the orders just cancelled, and any older ones) on a
 * connection of its own, through the same relay as the consumer. */
static void publish_events(sweep_t *s) {
    s->part = "events";
    lapse_error_t err = {0};
    lapse_status_t rc =
        lapse_store_events_count(s->store, &s->report->events_waiting, &err);
    if (rc != LAPSE_OK) {
        s->report->events_waiting = -1;
        events_left(s, "store", rc, err.text);
        return;
    }
    if (s->report->events_waiting == 0) {
        return; /* nothing to publish: no broker connection */
    }
    lapse__topology_t *topo = malloc(sizeof *topo);
    if (topo == NULL) {
        events_left(s, "memory", LAPSE_ERR_NOMEM, "topology");
        return;
    }
    lapse__topology_build(s->cfg, topo);
    lapse__broker_t broker;
    for (unsigned attempt = 0; attempt < CONNECT_TRIES; attempt++) {
        rc = lapse__broker_open(&broker, s->cfg, "lapse sweep events",
                                LAPSE__EVENTS_ROUND, NULL, NULL, &err);
        if (rc == LAPSE_OK || !lapse_status_is_retriable(rc)) {
            break;
        }
        if (attempt + 1 < CONNECT_TRIES) {
            lapse__sleep_ms(lapse__backoff_ms(attempt, 250, 1000), NULL);
        }
    }
    if (rc != LAPSE_OK) {
        events_left(s, "broker", rc, err.text);
        free(topo);
        return;
    }
    lapse__relay_report_t total = {0};
    /* What this run cancelled first, by seq, in rounds; then the rest of the outbox. */
    for (size_t k = 0;
         rc == LAPSE_OK && k < s->n_own && total.returned == 0 && !events_stop(s);
         k += LAPSE__EVENTS_ROUND) {
        size_t n =
            s->n_own - k < LAPSE__EVENTS_ROUND ? s->n_own - k : LAPSE__EVENTS_ROUND;
        lapse__relay_report_t one;
        rc =
            lapse__events_relay(&broker, s->store, topo->events_exchange, s->own_seqs + k,
                                n, n, LAPSE__EVENTS_WAIT_MS, &one, &err);
        lapse__relay_report_add(&total, &one);
    }
    if (rc == LAPSE_OK && total.returned == 0) {
        lapse__relay_report_t rest;
        rc = lapse__events_drain(&broker, s->store, topo->events_exchange, INT64_MAX,
                                 events_stop, s, &rest, &err);
        lapse__relay_report_add(&total, &rest);
    }
    lapse__broker_close(&broker);
    s->report->events_published = total.published;
    if (lapse_store_events_count(s->store, &s->report->events_waiting, NULL) !=
        LAPSE_OK) {
        s->report->events_waiting = -1;
    }
    if (total.published > 0) {
        lapse__log(s->cfg, LAPSE_LOG_INFO, "event=%s_events published=%zu waiting=%lld",
                   s->event, total.published, (long long)s->report->events_waiting);
    }
    if (rc != LAPSE_OK) {
        events_left(s, "publish", rc, err.text);
    } else if (total.returned > 0) {
        lapse__log(s->cfg, LAPSE_LOG_WARN,
                   "event=events_unroutable exchange=%s returned=%zu waiting=%lld "
                   "note=\"no queue is bound to the exchange; events stay in the outbox "
                   "for a consumer or the next sweep\"",
                   topo->events_exchange, total.returned,
                   (long long)s->report->events_waiting);
    }
    free(topo);
}

/* ---- runs ------------------------------------------------------------------------- */

static lapse_status_t start(sweep_t **out, const char *event, const lapse_config_t *cfg,
                            lapse_store_t *store, const lapse_sweep_opts_t *opts,
                            lapse_sweep_opts_t *defaults, lapse_sweep_report_t *report,
                            lapse_error_t *err) {
    lapse_error_clear(err);
    if (report != NULL) {
        *report = (lapse_sweep_report_t){.events_waiting = -1};
    }
    if (cfg == NULL || store == NULL || report == NULL) {
        return lapse_error_set(err, LAPSE_ERR_INVALID, "sweep: NULL argument");
    }
    if (opts == NULL) {
        lapse_sweep_opts_init(defaults);
        opts = defaults;
    }
    /* Bounded so that now - grace cannot overflow: a grace of a century is plenty. */
    const int64_t century = INT64_C(100) * 366 * 86400 * 1000;
    if (opts->grace_ms < 0 || opts->grace_ms > century || opts->in_flight_ms < 0 ||
        opts->in_flight_ms > century || opts->retention_ms < 0 ||
        opts->retention_ms > century || opts->lag_ms < 0 || opts->lag_ms > century) {
        return lapse_error_set(
            err, LAPSE_ERR_INVALID,
            "sweep: grace, in-flight margin, retention and lag must be 0..100 "
            "years");
    }
    sweep_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return lapse_error_set(err, LAPSE_ERR_NOMEM, "sweep");
    }
    s->event = event;
    s->cfg = cfg;
    s->store = store;
    s->opts = opts;
    s->report = report;
    *out = s;
    return LAPSE_OK;
}

static lapse_status_t finish(sweep_t *s, lapse_error_t *err) {
    const lapse_sweep_report_t *r = s->report;
    /* One summary line, only when something happened: a periodic caller's idle runs
     * stay quiet. */
    if (r->republished + r->cancelled + r->would_republish + r->would_cancel +
            r->skipped + r->failed + r->pruned_orders + r->pruned_events >
        0) {
        lapse__log(
            s->cfg, r->failed > 0 ? LAPSE_LOG_WARN : LAPSE_LOG_INFO,
            "event=%s republished=%llu cancelled=%llu would_republish=%llu "
            "would_cancel=%llu skipped=%llu failed=%llu dry_run=%d "
            "pruned_orders=%llu pruned_events=%llu",
            s->event, (unsigned long long)r->republished,
            (unsigned long long)r->cancelled, (unsigned long long)r->would_republish,
            (unsigned long long)r->would_cancel, (unsigned long long)r->skipped,
            (unsigned long long)r->failed, s->opts->dry_run ? 1 : 0,
            (unsigned long long)r->pruned_orders, (unsigned long long)r->pruned_events);
    }
    lapse_status_t rc = s->rc;
    if (rc != LAPSE_OK && err != NULL) {
        *err = s->err;
    }
    free(s->own_seqs);
    free(s);
    return rc;
}

lapse_status_t lapse_sweep_run(const lapse_config_t *cfg, lapse_store_t *store,
                               const lapse_sweep_opts_t *opts,
                               lapse_sweep_report_t *report, lapse_error_t *err) {
    lapse_sweep_opts_t defaults;
    sweep_t *s = NULL;
    lapse_status_t rc = start(&s, "sweep", cfg, store, opts, &defaults, report, err);
    if (rc != LAPSE_OK) {
        return rc;
    }
    opts = s->opts;
    /* The clock that decides: the store's own (PostgreSQL's server), else this host's. */
    int64_t now = 0;
    lapse_error_t cerr = {0};
    if (lapse_store_now(store, &now, &cerr) != LAPSE_OK) {
        lapse_error_set(&s->err, cerr.code, "%s", cerr.text);
        s->rc = cerr.code;
        return finish(s, err);
    }
    /* deadline + grace <= now, i.e. deadline < now - grace + 1: lost. Without a store
     * clock the direct cancels use the caller's decision clock when it gives one. */
    int64_t cancel_now =
        opts->now_ms != 0 && !lapse_store_has_clock(store) ? opts->now_ms : now;
    /* A message that arrives opts->lag_ms late is late, not lost: its consumer cancels
     * it when it gets there. */
    s->cancel_due_before =
        lapse__time_add(lapse__time_add(cancel_now, 1 - opts->grace_ms), -opts->lag_ms);
    /* The store-only part first: it needs no broker, and what it cancels need not be
     * published again. */
    if (opts->cancel) {
        cancel_lost(s);
    }
    if (opts->republish && !s->stopped) {
        s->skip_lost = opts->cancel;
        lapse_pending_filter_t filter;
        lapse_pending_filter_init(&filter);
        filter.only_unscheduled = true;
        filter.created_before_ms = lapse__time_add(now, -opts->in_flight_ms);
        filter.claim_ms = opts->dry_run ? 0 : REPUBLISH_CLAIM_MS;
        republish(s, &filter);
    }
    if (opts->events && !opts->dry_run && !s->stopped) {
        publish_events(s);
    }
    if (opts->retention_ms > 0 && !opts->dry_run && !s->stopped) {
        prune(s, now);
    }
    return finish(s, err);
}

lapse_status_t lapse_sweep_reconcile(const lapse_config_t *cfg, lapse_store_t *store,
                                     const lapse_sweep_opts_t *opts,
                                     lapse_sweep_report_t *report, lapse_error_t *err) {
    lapse_sweep_opts_t defaults;
    sweep_t *s = NULL;
    lapse_status_t rc = start(&s, "reconcile", cfg, store, opts, &defaults, report, err);
    if (rc != LAPSE_OK) {
        return rc;
    }
    lapse_pending_filter_t filter;
    lapse_pending_filter_init(&filter);
    republish(s, &filter);
    if (!s->stopped) {
        progress(s); /* the final count */
    }
    return finish(s, err);
}

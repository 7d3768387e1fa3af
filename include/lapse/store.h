/* SPDX-License-Identifier: MIT
 * The order store: orders, the resources they hold, and the outbox of events.
 * Orders move pending -> paid or pending -> cancelled, nothing else; every change is a
 * compare-and-set on status, so racing writers have exactly one winner. */
#ifndef LAPSE_STORE_H
#define LAPSE_STORE_H

#include <lapse/config.h>
#include <lapse/lapse.h>
#include <lapse/message.h>

#include <signal.h>

/** Opaque store handle. One handle per thread; several processes may share a store. */
typedef struct lapse_store lapse_store_t;

typedef enum lapse_order_status {
    LAPSE_ORDER_PENDING = 0,
    LAPSE_ORDER_PAID = 1,
    LAPSE_ORDER_CANCELLED = 2
} lapse_order_status_t;

/** "pending", "paid" or "cancelled"; static. */
LAPSE_API const char *lapse_order_status_name(lapse_order_status_t status);

/** An order as read from the store. Init with lapse_order_init, free with _clear. */
typedef struct lapse_order {
    char order_id[LAPSE_ORDER_ID_MAX + 1];
    lapse_order_status_t status;
    int64_t deadline_ms;
    int64_t created_at_ms;
    int64_t paid_at_ms;      /* -1 when not paid */
    int64_t cancelled_at_ms; /* -1 when not cancelled */
    bool scheduled;          /* the expiry message was confirmed by the broker */
    char **holds;            /* owned by the struct; n_holds NUL-terminated strings */
    size_t n_holds;
} lapse_order_t;

LAPSE_API void lapse_order_init(lapse_order_t *order);
/** Frees holds; accepts NULL; leaves the struct initialised. */
LAPSE_API void lapse_order_clear(lapse_order_t *order);

/** An order to record; every pointer is borrowed for the duration of the call. */
typedef struct lapse_new_order {
    const char *order_id;
    int64_t deadline_ms;
    int64_t created_at_ms;
    const char *const *holds;
    size_t n_holds;
} lapse_new_order_t;

/** What a cancellation attempt found, per order. */
typedef enum lapse_cancel_outcome {
    LAPSE_CANCEL_DONE = 0,       /* pending and due: now cancelled, holds released, event
                                    recorded */
    LAPSE_CANCEL_NOOP_PAID,      /* already paid: nothing changed */
    LAPSE_CANCEL_NOOP_CANCELLED, /* already cancelled: nothing changed */
    LAPSE_CANCEL_EARLY,          /* pending but its deadline is ahead: nothing changed */
    LAPSE_CANCEL_UNKNOWN,        /* no such order */
    LAPSE_CANCEL_BUSY            /* its row is locked by another transaction (PostgreSQL:
                                    a competing consumer, the shop's own code): nothing
                                    changed, try it again later */
} lapse_cancel_outcome_t;

/** "cancelled", "noop_paid", "noop_cancelled", "early", "unknown", "busy"; static. */
LAPSE_API const char *lapse_cancel_outcome_name(lapse_cancel_outcome_t outcome);

/** One cancellation in a batch. order_id is borrowed; the rest is written by the store.
 */
typedef struct lapse_cancel_item {
    const char *order_id;           /* in */
    lapse_cancel_outcome_t outcome; /* out */
    int64_t deadline_ms;            /* out: the stored deadline (0 when unknown) */
    int64_t event_seq;              /* out: outbox row of the event (DONE only), else 0 */
    int64_t now_ms;                 /* out: the clock the decision was made by (the
                                       caller's now_ms, or the store's own clock) */
} lapse_cancel_item_t;

/** An outbox event handed to a callback; strings borrowed for the callback's duration. */
typedef struct lapse_event {
    int64_t seq;
    const char *event_id; /* "order.cancelled:<order_id>" */
    const char *order_id;
    const char *body; /* JSON */
} lapse_event_t;

typedef int (*lapse_event_cb)(void *opaque, const lapse_event_t *event);

/** How long an outbox walk's claim on the events it hands out lasts (PostgreSQL). */
#define LAPSE_STORE_EVENT_CLAIM_MS 10000

/** Flags of lapse_store_open_flags(); or-ed together. */
typedef enum lapse_store_open_flag {
    /* Fail with LAPSE_ERR_STORE_MISSING instead of creating a store that does not exist
     * (commands that only read: a mistyped store must not look like an empty one). */
    LAPSE_STORE_MUST_EXIST = 1u << 0
} lapse_store_open_flag_t;

/** How to open a store; fill with lapse_store_options_init() first. Borrowed. */
typedef struct lapse_store_options {
    unsigned flags;         /* lapse_store_open_flag_t, or-ed */
    const char *schema;     /* PostgreSQL: the schema of lapse's tables (default "lapse");
                               ignored by SQLite */
    const char *orders_map; /* PostgreSQL: the path of an orders map (DESIGN.md, "The
                               shop's own orders table"): orders live in the shop's own
                               table, checked against the live schema at open. NULL
                               (default): lapse's own orders table */
    /* A caller's stop flag (a signal handler's), or NULL (default). A SQLite file that
     * is locked is opened again for up to about 100 s (20 tries of a 5 s busy wait, with
     * a backoff between them); once *stop is non-zero no further try is made and the
     * open ends with LAPSE_ERR_STORE_BUSY, within one busy wait (5 s) and one backoff
     * (1 s) of the flag. */
    const volatile sig_atomic_t *stop;
} lapse_store_options_t;

/** The defaults: no flags, schema "lapse", no orders map, no stop flag. */
LAPSE_API void lapse_store_options_init(lapse_store_options_t *opts);

/** The defaults, then cfg's store_schema and orders_map and these flags. opts borrows
 *  cfg's strings: cfg must outlive the open that uses opts. */
LAPSE_API void lapse_store_options_from_config(const lapse_config_t *cfg, unsigned flags,
                                               lapse_store_options_t *opts);

/**
 * Open a store by URI:
 * - "sqlite:PATH": a SQLite file in WAL mode, schema applied; a missing file is created
 *   with mode 0600 (and its -wal and -shm files with it) unless LAPSE_STORE_MUST_EXIST.
 * - "postgresql://..." or "postgres://...": a libpq connection URI (PG* variables,
 *   .pgpass and sslmode apply as in libpq). lapse's tables live in opts->schema, created
 *   and migrated on open under a transaction-level advisory lock; a schema newer than
 *   this lapse is refused. With LAPSE_STORE_MUST_EXIST a database without the schema is
 *   LAPSE_ERR_STORE_MISSING.
 * @param opts NULL: the defaults.
 * @return new handle, closed with lapse_store_close(); NULL on failure with *rc and err
 * set: LAPSE_ERR_STORE_MISSING, LAPSE_ERR_STORE_OPEN, LAPSE_ERR_STORE_BUSY (retriable:
 * a locked file, a server that is down or refuses connections), LAPSE_ERR_CONFIG_STORE
 * (a URI this build cannot open), LAPSE_ERR_CONFIG_MAP (an orders map that is wrong, or
 * one given with a SQLite store).
 */
LAPSE_API lapse_store_t *lapse_store_open_opts(const char *uri,
                                               const lapse_store_options_t *opts,
                                               lapse_status_t *rc, lapse_error_t *err);

/** lapse_store_open_opts() with these flags and the default schema. */
LAPSE_API lapse_store_t *lapse_store_open_flags(const char *uri, unsigned flags,
                                                lapse_status_t *rc, lapse_error_t *err);

/**
 * lapse_store_open_opts() with cfg's settings: the store URI (with its password, which
 * lapse_config_get("store") masks), store_schema and orders_map, and these flags. cfg is
 * only read during the call.
 */
LAPSE_API lapse_store_t *lapse_store_open_config(const lapse_config_t *cfg,
                                                 unsigned flags, lapse_status_t *rc,
                                                 lapse_error_t *err);

/** lapse_store_open_flags(uri, 0, rc, err): creates the store when it is missing. */
LAPSE_API lapse_store_t *lapse_store_open(const char *uri, lapse_status_t *rc,
                                          lapse_error_t *err);
/** Close and free; accepts NULL. */
LAPSE_API void lapse_store_close(lapse_store_t *store);

/**
 * Whether orders live in the shop's own table (an orders map): then an order must exist
 * there before it is published, lapse_store_get() gives its deadline, and orders carry
 * no holds (the map's on_cancel statements release what an order held).
 */
LAPSE_API bool lapse_store_orders_mapped(const lapse_store_t *store);

/** A line for the operator from opening the store (e.g. an index an orders map would
 *  need), or NULL. Borrowed from the handle. */
LAPSE_API const char *lapse_store_warning(const lapse_store_t *store);

/**
 * Whether the store has a clock of its own that decides (PostgreSQL: the database
 * server's). Then lapse_store_pay() and lapse_store_cancel_batch() compare deadlines with
 * that clock and ignore the caller's now_ms (except a now_ms of 0 in a cancel, which
 * always means "nothing is due"). SQLite has none: the caller's clock decides.
 */
LAPSE_API bool lapse_store_has_clock(const lapse_store_t *store);

/**
 * The clock that decides, in ms since the epoch: the store's own (PostgreSQL: the
 * server's, tracked on this host's monotonic clock between reads at most a second
 * apart) or this host's wall clock. Deadlines computed from a timeout start here.
 * @return LAPSE_OK, or a store error (LAPSE_ERR_STORE_BUSY is retriable).
 */
LAPSE_API lapse_status_t lapse_store_now(lapse_store_t *store, int64_t *now_ms,
                                         lapse_error_t *err);

/**
 * Record orders as pending and unscheduled, with their holds, in one transaction.
 * results[i] per order: LAPSE_OK (new, or exists with the same deadline: a re-publish),
 * LAPSE_ERR_STORE_CONFLICT (exists with another deadline), LAPSE_ERR_STORE_STATE
 * (exists but is no longer pending). Those per-order refusals don't fail the batch.
 * @return LAPSE_OK when the transaction committed, else the failure (nothing written).
 */
LAPSE_API lapse_status_t lapse_store_insert_orders(lapse_store_t *store,
                                                   const lapse_new_order_t *orders,
                                                   size_t n, lapse_status_t *results,
                                                   lapse_error_t *err);

/** Mark orders' expiry messages as confirmed by the broker, in one transaction. */
LAPSE_API lapse_status_t lapse_store_mark_scheduled(lapse_store_t *store,
                                                    const char *const *order_ids,
                                                    size_t n, lapse_error_t *err);

/**
 * Pay an order: pending and now < deadline -> paid, where now is the store's clock when
 * it has one (lapse_store_has_clock), else now_ms.
 * @return LAPSE_OK (also when already paid), LAPSE_ERR_STORE_NOT_FOUND,
 *         LAPSE_ERR_STORE_STATE (cancelled), LAPSE_ERR_STORE_LAPSED (past deadline).
 */
LAPSE_API lapse_status_t lapse_store_pay(lapse_store_t *store, const char *order_id,
                                         int64_t now_ms, lapse_error_t *err);

/**
 * In ONE transaction, for each item: cancel it if pending and deadline <= now
 * (compare-and-set), release its holds and record an order.cancelled outbox event. now
 * is the store's clock when it has one (lapse_store_has_clock), else now_ms; a now_ms of
 * 0 makes nothing due on every store. Each item's now_ms receives the clock used. A row
 * another transaction holds locked is not waited for (PostgreSQL): that item alone is
 * LAPSE_CANCEL_BUSY.
 * @return LAPSE_OK when committed (outcomes filled); on failure nothing was written.
 */
LAPSE_API lapse_status_t lapse_store_cancel_batch(lapse_store_t *store,
                                                  lapse_cancel_item_t *items, size_t n,
                                                  int64_t now_ms, lapse_error_t *err);

/**
 * Read one order. @param out initialised by the caller; filled on LAPSE_OK (caller
 * clears it). @return LAPSE_OK or LAPSE_ERR_STORE_NOT_FOUND or a store error.
 */
LAPSE_API lapse_status_t lapse_store_get(lapse_store_t *store, const char *order_id,
                                         lapse_order_t *out, lapse_error_t *err);

/** counts[status] = number of orders with that status (3 entries). */
LAPSE_API lapse_status_t lapse_store_count(lapse_store_t *store, int64_t counts[3],
                                           lapse_error_t *err);

/* Seqs read at a time by lapse_store_events_pending with only_seqs: a page of events
 * (body, ids) weighs about 150 KB. */
#define LAPSE_STORE_EVENTS_PAGE 512

/**
 * Call cb for unpublished outbox events, oldest first, at most limit of them; when
 * only_seqs is not NULL, only those with a seq in only_seqs[0..n_seqs). Without only_seqs
 * a store shared by many hosts (PostgreSQL) claims what it hands out for a few seconds
 * (LAPSE_STORE_EVENT_CLAIM_MS), so competing relays do not publish the same event twice;
 * an event that was not marked published comes back after that. A non-zero
 * return from cb stops the walk. limit 0, or only_seqs with n_seqs 0, matches nothing.
 * The events are read in pages (with only_seqs, LAPSE_STORE_EVENTS_PAGE seqs at a
 * time), each before cb sees its first event, so cb may use this same handle and memory
 * holds one page, however many seqs are asked for.
 */
LAPSE_API lapse_status_t lapse_store_events_pending(lapse_store_t *store, size_t limit,
                                                    const int64_t *only_seqs,
                                                    size_t n_seqs, lapse_event_cb cb,
                                                    void *opaque, lapse_error_t *err);

/**
 * Which pending orders lapse_store_pending() visits. Caller-allocated; fill it with
 * lapse_pending_filter_init() first, so fields added later get their defaults.
 */
typedef struct lapse_pending_filter {
    int64_t due_before_ms;     /* only deadline_ms < this (default INT64_MAX: any) */
    int64_t created_before_ms; /* only created_at_ms < this (default INT64_MAX: any) */
    bool only_unscheduled;     /* only orders whose message was never confirmed */
    bool with_holds;           /* fill each order's holds (default false: n_holds 0) */
    size_t limit;              /* at most this many orders; 0 (default): all */
    /* Keyset cursor: start strictly after (after_deadline_ms, after_order_id) in
     * (deadline, order id) order. after_order_id NULL (default): from the start.
     * Borrowed for the call. A caller that was stopped resumes from the last order it
     * saw. */
    int64_t after_deadline_ms;
    const char *after_order_id;
    /* With only_unscheduled: claim what is returned for this long (PostgreSQL), so that
     * a competing walk with a claim skips those orders until then (two sweeps on two
     * machines never re-publish the same order). 0 (default): no claim. SQLite, one
     * host, ignores it. */
    int64_t claim_ms;
} lapse_pending_filter_t;

/** Set the defaults: every pending order, no holds, no limit, from the start. */
LAPSE_API void lapse_pending_filter_init(lapse_pending_filter_t *filter);

/** Called per order by lapse_store_pending(); order is borrowed for the call. A
 *  non-zero return stops the walk. */
typedef int (*lapse_order_cb)(void *opaque, const lapse_order_t *order);

/**
 * Call cb for every pending order that matches filter, by deadline, then order id.
 * Orders are read a page at a time (each page in one read transaction, keyset paging on
 * (deadline, order id)) and the page's read is finished before cb runs, so cb may use
 * this same handle, for example to cancel or re-publish what it is shown; memory does
 * not grow with the number of orders. An order that changes while the walk runs is seen
 * as it was when its page was read, or not at all. filter is borrowed; NULL means the
 * defaults.
 * @return LAPSE_OK when the walk ended (also when cb stopped it), else the read's
 *         failure (LAPSE_ERR_STORE_BUSY is retriable: resume with the cursor).
 * Thread-safety: like every call on the handle, one thread at a time.
 */
LAPSE_API lapse_status_t lapse_store_pending(lapse_store_t *store,
                                             const lapse_pending_filter_t *filter,
                                             lapse_order_cb cb, void *opaque,
                                             lapse_error_t *err);

/**
 * The outbox backlog: how many events are not yet published (confirmed by the broker
 * and taken by a queue). Read-only.
 * @param pending receives the count on LAPSE_OK.
 * @return LAPSE_OK or a store error (LAPSE_ERR_STORE_BUSY is retriable).
 */
LAPSE_API lapse_status_t lapse_store_events_count(lapse_store_t *store, int64_t *pending,
                                                  lapse_error_t *err);

/**
 * Give back the claim on events a walk handed out that were not published (returned by
 * the broker, refused, never sent), so that the next walk, any relay's, takes them at
 * once instead of after LAPSE_STORE_EVENT_CLAIM_MS. Events the callback of
 * lapse_store_events_pending() never saw (it stopped the walk) are given back by the walk
 * itself. A no-op on a store that claims nothing (SQLite).
 */
LAPSE_API lapse_status_t lapse_store_events_release(lapse_store_t *store,
                                                    const int64_t *seqs, size_t n,
                                                    lapse_error_t *err);

/**
 * Keep the tables from growing without bound: in one short transaction, delete at most
 * limit settled orders (paid or cancelled) whose deadline and settlement both lie before
 * before_ms and whose event, if any, is published, with their holds; and at most limit
 * outbox events published before before_ms. Pending orders and unpublished events are
 * never touched. An expiry message that arrives for a pruned order finds no order and is
 * parked as unknown, so before_ms should lie well behind anything still in flight (the
 * consumer uses now - retention).
 * @param orders, events receive how many rows went (both may be NULL).
 * @return LAPSE_OK or a store error (LAPSE_ERR_STORE_BUSY is retriable).
 */
LAPSE_API lapse_status_t lapse_store_prune(lapse_store_t *store, int64_t before_ms,
                                           size_t limit, int64_t *orders, int64_t *events,
                                           lapse_error_t *err);

/** Mark outbox events as published (confirmed by the broker), in one transaction. */
LAPSE_API lapse_status_t lapse_store_events_mark_published(lapse_store_t *store,
                                                           const int64_t *seqs, size_t n,
                                                           int64_t now_ms,
                                                           lapse_error_t *err);

#endif

/* SPDX-License-Identifier: MIT
 * Internal view of lapse_store_t: the backend v-table that store.c dispatches through. */
#ifndef LAPSE_STORE_INT_H
#define LAPSE_STORE_INT_H

#include <lapse/store.h>

/* Unpublished outbox events read out of a backend. Each event's strings live either in
 * one block owned by event_id (lapse__event_list_add), or, in a list with an owner, in
 * the owner (lapse__event_list_borrow): the backend's own result, which
 * lapse__event_list_free releases with owner_free. One list is filled one way only. */
typedef struct lapse__event_list {
    lapse_event_t *items;
    size_t n, cap;
    void *owner;
    void (*owner_free)(void *owner);
} lapse__event_list_t;

/** Append a copy of the strings (lengths in bytes, without NUL). false: out of memory. */
bool lapse__event_list_add(lapse__event_list_t *list, int64_t seq, const char *event_id,
                           size_t event_id_len, const char *order_id, size_t order_id_len,
                           const char *body, size_t body_len);
/** Append an event whose NUL-terminated strings live in list->owner (set by the caller
 *  before the first call, and freed by lapse__event_list_free even when this fails).
 *  false: out of memory. */
bool lapse__event_list_borrow(lapse__event_list_t *list, int64_t seq,
                              const char *event_id, const char *order_id,
                              const char *body);
void lapse__event_list_free(lapse__event_list_t *list);

/* Orders per page of lapse_store_pending(): the most a walk holds in memory at once. */
#define LAPSE__PENDING_PAGE 256

/* One page of pending orders read by a backend: cap initialised entries, n filled. */
typedef struct lapse__order_page {
    lapse_order_t *items;
    size_t n, cap;
} lapse__order_page_t;

/** A schema name lapse accepts: [a-z_][a-z0-9_]{0,62}, not pg_*, so that it reads the
 *  same quoted or not. */
bool lapse__store_schema_valid(const char *name);

/** "pending", "paid", "cancelled" -> status; LAPSE_ERR_STORE_SQL for anything else. */
lapse_status_t lapse__order_status_parse(const char *text, lapse_order_status_t *out);

/**
 * The order.cancelled event body, compact JSON, the same for every backend.
 * @return new string (free()), or NULL when out of memory.
 */
char *lapse__event_body(const char *order_id, int64_t deadline_ms,
                        int64_t cancelled_at_ms, char *const *holds, size_t n_holds);

/** What s takes as a JSON string, quotes included, escaped as jansson escapes it; 0 when
 *  s is not UTF-8 (jansson refuses it too). */
size_t lapse__json_string_size(const char *s);

/** Write s (UTF-8: lapse__json_string_size said so) at out as a JSON string, exactly
 *  lapse__json_string_size(s) bytes, no NUL; returns the byte after it. */
char *lapse__json_put_string(char *out, const char *s);

/* The decisions every backend shares, as plain functions over the row it read back after
 * a compare-and-set that changed nothing, so they are made the same way everywhere. */

/** Re-inserting an order that exists: LAPSE_OK (same deadline, still pending),
 *  LAPSE_ERR_STORE_CONFLICT (other deadline) or LAPSE_ERR_STORE_STATE. */
lapse_status_t lapse__insert_verdict(const lapse_order_t *existing, int64_t deadline_ms);

/** Why a payment changed nothing; existing is NULL when there is no such order.
 *  LAPSE_OK when already paid, else the refusal, explained in err. */
lapse_status_t lapse__pay_verdict(const char *order_id, const lapse_order_t *existing,
                                  lapse_error_t *err);

/** Why a cancellation changed nothing, from the order's status. */
lapse_cancel_outcome_t lapse__cancel_verdict(lapse_order_status_t status);

/*
 * One function per public store operation, plus close. store.c checks arguments and
 * clears err before calling, so a backend may assume non-NULL pointers wherever the
 * public contract requires them and valid order ids in insert_orders.
 */
typedef struct lapse__store_class {
    const char *name; /* "sqlite", used in messages */
    /* Orders and their deadlines are the shop's (an orders map): lapse_store_get gives
     * the deadline to publish, and orders carry no holds (on_cancel releases). */
    bool orders_mapped;
    /* The store's own clock (lapse_store_has_clock); NULL: the host's wall clock, and
     * pay and cancel_batch decide by the now_ms they are given. */
    lapse_status_t (*now)(lapse_store_t *store, int64_t *now_ms, lapse_error_t *err);
    lapse_status_t (*insert_orders)(lapse_store_t *store, const lapse_new_order_t *orders,
                                    size_t n, lapse_status_t *results,
                                    lapse_error_t *err);
    lapse_status_t (*mark_scheduled)(lapse_store_t *store, const char *const *order_ids,
                                     size_t n, lapse_error_t *err);
    lapse_status_t (*pay)(lapse_store_t *store, const char *order_id, int64_t now_ms,
                          lapse_error_t *err);
    lapse_status_t (*cancel_batch)(lapse_store_t *store, lapse_cancel_item_t *items,
                                   size_t n, int64_t now_ms, lapse_error_t *err);
    lapse_status_t (*get)(lapse_store_t *store, const char *order_id, lapse_order_t *out,
                          lapse_error_t *err);
    lapse_status_t (*count)(lapse_store_t *store, int64_t counts[3], lapse_error_t *err);
    /* Appends up to limit unpublished events to out, oldest first; when seqs is not
     * NULL (sorted ascending, no duplicates) only those. store.c runs the callback
     * afterwards, outside any transaction. */
    lapse_status_t (*events_pending)(lapse_store_t *store, size_t limit,
                                     const int64_t *seqs, size_t n_seqs,
                                     lapse__event_list_t *out, lapse_error_t *err);
    lapse_status_t (*events_mark_published)(lapse_store_t *store, const int64_t *seqs,
                                            size_t n, int64_t now_ms, lapse_error_t *err);
    /* Drop the claims on these events (lapse_store_events_release); NULL: the store
     * claims nothing. */
    lapse_status_t (*events_release)(lapse_store_t *store, const int64_t *seqs, size_t n,
                                     lapse_error_t *err);
    /* The number of unpublished events, in one read. */
    lapse_status_t (*events_count)(lapse_store_t *store, int64_t *pending,
                                   lapse_error_t *err);
    /* Fills page (up to page->cap) with the pending orders that match filter, strictly
     * after (after_deadline_ms, after_id) in (deadline, order id) order, in that order,
     * with their holds when filter->with_holds; filter->limit and the filter's own cursor
     * are store.c's business. One read, finished before returning. */
    lapse_status_t (*pending_page)(lapse_store_t *store,
                                   const lapse_pending_filter_t *filter,
                                   int64_t after_deadline_ms, const char *after_id,
                                   lapse__order_page_t *page, lapse_error_t *err);
    /* Deletes at most limit settled orders and limit published events older than
     * before_ms (lapse_store_prune); counts written to *orders, *events. */
    lapse_status_t (*prune)(lapse_store_t *store, int64_t before_ms, int64_t limit,
                            int64_t *orders, int64_t *events, lapse_error_t *err);
    /* Releases everything, including the handle's memory. */
    void (*close)(lapse_store_t *store);
} lapse__store_class_t;

/* The common head of every backend's handle; a backend embeds it as its first member
 * (rabbitmq-c's amqp_socket_t), so a lapse_store_t * converts to the backend's type. */
struct lapse_store {
    const lapse__store_class_t *cls;
    const char *warning; /* lapse_store_warning(); owned by the backend, NULL: none */
};

/**
 * Open the SQLite backend on path; flags as lapse_store_open_flags() (created with mode
 * 0600 if missing, unless LAPSE_STORE_MUST_EXIST).
 * @return new handle, or NULL with *rc and err set (LAPSE_ERR_STORE_MISSING, _OPEN,
 * _BUSY, LAPSE_ERR_NOMEM).
 */
lapse_store_t *lapse__store_sqlite_open(const char *path, unsigned flags,
                                        lapse_status_t *rc, lapse_error_t *err);

/**
 * Open the PostgreSQL backend on a libpq connection URI, with lapse's tables in schema
 * (created or migrated under an advisory lock; a newer one is refused). orders_map: the
 * path of an orders map (the shop's own table holds the orders), or NULL. flags as
 * lapse_store_open_flags().
 * @return new handle, or NULL with *rc and err set (LAPSE_ERR_STORE_MISSING, _OPEN,
 * _BUSY when the server is unreachable or shutting down, LAPSE_ERR_NOMEM).
 */
lapse_store_t *lapse__store_pg_open(const char *uri, const char *schema,
                                    const char *orders_map, unsigned flags,
                                    lapse_status_t *rc, lapse_error_t *err);

#endif

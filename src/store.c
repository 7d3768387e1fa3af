/* SPDX-License-Identifier: MIT
 * Store front: URI dispatch, argument checks, forwarding through the backend v-table. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "backoff_int.h"
#include "config_int.h"
#include "store_int.h"

#define OPEN_ATTEMPTS 20

const char *lapse_order_status_name(lapse_order_status_t status) {
    switch (status) {
        case LAPSE_ORDER_PENDING:
            return "pending";
        case LAPSE_ORDER_PAID:
            return "paid";
        case LAPSE_ORDER_CANCELLED:
            return "cancelled";
    }
    return "unknown";
}

const char *lapse_cancel_outcome_name(lapse_cancel_outcome_t outcome) {
    switch (outcome) {
        case LAPSE_CANCEL_DONE:
            return "cancelled";
        case LAPSE_CANCEL_NOOP_PAID:
            return "noop_paid";
        case LAPSE_CANCEL_NOOP_CANCELLED:
            return "noop_cancelled";
        case LAPSE_CANCEL_EARLY:
            return "early";
        case LAPSE_CANCEL_UNKNOWN:
            return "unknown";
        case LAPSE_CANCEL_BUSY:
            return "busy";
    }
    return "unknown";
}

lapse_status_t lapse__order_status_parse(const char *text, lapse_order_status_t *out) {
    static const lapse_order_status_t all[] = {LAPSE_ORDER_PENDING, LAPSE_ORDER_PAID,
                                               LAPSE_ORDER_CANCELLED};
    for (size_t i = 0; text != NULL && i < sizeof(all) / sizeof(all[0]); i++) {
        if (strcmp(text, lapse_order_status_name(all[i])) == 0) {
            *out = all[i];
            return LAPSE_OK;
        }
    }
    return LAPSE_ERR_STORE_SQL;
}

lapse_status_t lapse__insert_verdict(const lapse_order_t *existing, int64_t deadline_ms) {
    if (existing->deadline_ms != deadline_ms) {
        return LAPSE_ERR_STORE_CONFLICT;
    }
    return existing->status == LAPSE_ORDER_PENDING ? LAPSE_OK : LAPSE_ERR_STORE_STATE;
}

lapse_status_t lapse__pay_verdict(const char *order_id, const lapse_order_t *existing,
                                  lapse_error_t *err) {
    if (existing == NULL) {
        return lapse_error_set(err, LAPSE_ERR_STORE_NOT_FOUND, "order %s not found",
                               order_id);
    }
    switch (existing->status) {
        case LAPSE_ORDER_PAID:
            return LAPSE_OK;
        case LAPSE_ORDER_CANCELLED:
            return lapse_error_set(err, LAPSE_ERR_STORE_STATE,
                                   "order %s is already cancelled", order_id);
        case LAPSE_ORDER_PENDING:
            break;
    }
    /* Still pending, so the CAS failed on the deadline: the window has closed. */
    char deadline[LAPSE_RFC3339_LEN];
    lapse_time_format_rfc3339(existing->deadline_ms, deadline);
    return lapse_error_set(err, LAPSE_ERR_STORE_LAPSED,
                           "order %s: payment window closed at %s", order_id, deadline);
}

lapse_cancel_outcome_t lapse__cancel_verdict(lapse_order_status_t status) {
    switch (status) {
        case LAPSE_ORDER_PAID:
            return LAPSE_CANCEL_NOOP_PAID;
        case LAPSE_ORDER_CANCELLED:
            return LAPSE_CANCEL_NOOP_CANCELLED;
        case LAPSE_ORDER_PENDING:
            break;
    }
    /* Still pending, so the CAS failed on the deadline: it is ahead. */
    return LAPSE_CANCEL_EARLY;
}

void lapse_order_init(lapse_order_t *order) {
    if (order == NULL) {
        return;
    }
    memset(order, 0, sizeof(*order));
    order->status = LAPSE_ORDER_PENDING;
    order->paid_at_ms = -1;
    order->cancelled_at_ms = -1;
}

void lapse_order_clear(lapse_order_t *order) {
    if (order == NULL) {
        return;
    }
    for (size_t i = 0; i < order->n_holds; i++) {
        free(order->holds[i]);
    }
    free(order->holds);
    lapse_order_init(order);
}

static lapse_status_t invalid(lapse_error_t *err, const char *what);

static bool has_prefix(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

lapse_store_t *lapse_store_open(const char *uri, lapse_status_t *rc, lapse_error_t *err) {
    return lapse_store_open_opts(uri, NULL, rc, err);
}

lapse_store_t *lapse_store_open_flags(const char *uri, unsigned flags, lapse_status_t *rc,
                                      lapse_error_t *err) {
    lapse_store_options_t opts;
    lapse_store_options_init(&opts);
    opts.flags = flags;
    return lapse_store_open_opts(uri, &opts, rc, err);
}

lapse_store_t *lapse_store_open_config(const lapse_config_t *cfg, unsigned flags,
                                       lapse_status_t *rc, lapse_error_t *err) {
    lapse_store_options_t opts;
    lapse_store_options_from_config(cfg, flags, &opts);
    return lapse_store_open_opts(cfg->store, &opts, rc, err);
}

void lapse_store_options_init(lapse_store_options_t *opts) {
    if (opts != NULL) {
        *opts = (lapse_store_options_t){.flags = 0, .schema = "lapse"};
    }
}

void lapse_store_options_from_config(const lapse_config_t *cfg, unsigned flags,
                                     lapse_store_options_t *opts) {
    lapse_store_options_init(opts);
    opts->flags = flags;
    opts->schema = lapse_config_get(cfg, "store_schema");
    const char *map = lapse_config_get(cfg, "orders_map");
    opts->orders_map = map != NULL && map[0] != '\0' ? map : NULL;
}

/* Opening is retried while it fails as busy: a new SQLite file is switched to WAL by
 * whoever opens it first (the others find it locked, briefly), and several consumers
 * starting at once wait on each other's schema migration. The caller's stop flag ends
 * the retries (a SIGTERM while another process holds the file locked). */
static lapse_store_t *open_retrying(const char *uri, const lapse_store_options_t *opts,
                                    bool pg, lapse_status_t *rc, lapse_error_t *err) {
    lapse_store_t *store = NULL;
    for (unsigned attempt = 0; attempt < OPEN_ATTEMPTS; attempt++) {
        store =
            pg ? lapse__store_pg_open(uri, opts->schema, opts->orders_map, opts->flags,
                                      rc, err)
               : lapse__store_sqlite_open(uri + strlen("sqlite:"), opts->flags, rc, err);
        /* A PostgreSQL server that is down is not waited for here: the caller decides
         * (the consumer retries with backoff, a CLI command reports it). */
        if (store != NULL || *rc != LAPSE_ERR_STORE_BUSY || pg) {
            break;
        }
        if ((opts->stop != NULL && *opts->stop) ||
            !lapse__sleep_ms(lapse__backoff_ms(attempt, 20, 1000), opts->stop)) {
            break;
        }
    }
    return store;
}

bool lapse__store_schema_valid(const char *name) {
    size_t n = name != NULL ? strlen(name) : 0;
    bool ok = n > 0 && n <= 63 && !(name[0] >= '0' && name[0] <= '9') &&
              strncmp(name, "pg_", 3) != 0;
    for (size_t i = 0; ok && i < n; i++) {
        char c = name[i];
        ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    }
    return ok;
}

lapse_store_t *lapse_store_open_opts(const char *uri, const lapse_store_options_t *opts,
                                     lapse_status_t *rc, lapse_error_t *err) {
    lapse_status_t ignored;
    lapse_store_options_t defaults;
    if (rc == NULL) {
        rc = &ignored;
    }
    if (opts == NULL) {
        lapse_store_options_init(&defaults);
        opts = &defaults;
    }
    lapse_error_clear(err);
    if (uri == NULL) {
        *rc = lapse_error_set(err, LAPSE_ERR_CONFIG_STORE, "no store URI");
        return NULL;
    }
    if (has_prefix(uri, "sqlite:")) {
        if (opts->orders_map != NULL) {
            *rc = lapse_error_set(
                err, LAPSE_ERR_CONFIG_MAP,
                "an orders map needs a PostgreSQL store (postgresql://...)");
            return NULL;
        }
        if (uri[strlen("sqlite:")] == '\0') {
            *rc = lapse_error_set(err, LAPSE_ERR_CONFIG_STORE,
                                  "store URI \"sqlite:\" needs a path");
            return NULL;
        }
        return open_retrying(uri, opts, false, rc, err);
    }
    if (has_prefix(uri, "postgres://") || has_prefix(uri, "postgresql://")) {
        if (!lapse__store_schema_valid(opts->schema)) {
            *rc = lapse_error_set(err, LAPSE_ERR_CONFIG_STORE,
                                  "store schema must be 1..63 bytes of [a-z0-9_], not "
                                  "starting with a digit or pg_");
            return NULL;
        }
        return open_retrying(uri, opts, true, rc, err);
    }
    /* The URI may carry a password, so only its scheme goes into the message. */
    size_t scheme = strcspn(uri, ":");
    *rc = lapse_error_set(err, LAPSE_ERR_CONFIG_STORE,
                          "unsupported store URI scheme \"%.*s\" (want sqlite:PATH or "
                          "postgresql://...)",
                          (int)(scheme < 32 ? scheme : 32), uri);
    return NULL;
}

bool lapse_store_orders_mapped(const lapse_store_t *store) {
    return store != NULL && store->cls->orders_mapped;
}

const char *lapse_store_warning(const lapse_store_t *store) {
    return store != NULL ? store->warning : NULL;
}

bool lapse_store_has_clock(const lapse_store_t *store) {
    return store != NULL && store->cls->now != NULL;
}

lapse_status_t lapse_store_now(lapse_store_t *store, int64_t *now_ms,
                               lapse_error_t *err) {
    lapse_error_clear(err);
    if (store == NULL || now_ms == NULL) {
        return invalid(err, "now: NULL argument");
    }
    if (store->cls->now == NULL) {
        *now_ms = lapse_clock_now_ms();
        return LAPSE_OK;
    }
    return store->cls->now(store, now_ms, err);
}

void lapse_store_close(lapse_store_t *store) {
    if (store != NULL) {
        store->cls->close(store);
    }
}

static lapse_status_t invalid(lapse_error_t *err, const char *what) {
    return lapse_error_set(err, LAPSE_ERR_INVALID, "%s", what);
}

/* Hold names end up in the JSON of the order.cancelled event. One that jansson refuses
 * would make the order impossible to cancel, so it is refused here, before it is stored.
 * jansson's own check is used so the two can never disagree. */
static bool hold_is_valid(const char *name) {
    if (name == NULL || name[0] == '\0') {
        return false;
    }
    json_t *probe = json_string(name);
    bool ok = probe != NULL;
    json_decref(probe);
    return ok;
}

lapse_status_t lapse_store_insert_orders(lapse_store_t *store,
                                         const lapse_new_order_t *orders, size_t n,
                                         lapse_status_t *results, lapse_error_t *err) {
    lapse_error_clear(err);
    if (store == NULL || (n > 0 && (orders == NULL || results == NULL))) {
        return invalid(err, "insert_orders: NULL argument");
    }
    /* Checked up front so that a bad order refuses the whole batch before anything is
     * written, and so every stored id fits lapse_order_t.order_id. */
    for (size_t i = 0; i < n; i++) {
        const lapse_new_order_t *order = &orders[i];
        if (order->order_id == NULL ||
            !lapse_order_id_is_valid(order->order_id, strlen(order->order_id))) {
            return lapse_error_set(err, LAPSE_ERR_INVALID, "order %zu: invalid order id",
                                   i);
        }
        if (order->n_holds > 0 && store->cls->orders_mapped) {
            return lapse_error_set(err, LAPSE_ERR_INVALID,
                                   "order %s: holds are not kept with an orders map (its "
                                   "on_cancel statements release what an order held)",
                                   order->order_id);
        }
        if (order->n_holds > 0 && order->holds == NULL) {
            return lapse_error_set(err, LAPSE_ERR_INVALID, "order %s: holds is NULL",
                                   order->order_id);
        }
        for (size_t h = 0; h < order->n_holds; h++) {
            if (!hold_is_valid(order->holds[h])) {
                return lapse_error_set(err, LAPSE_ERR_INVALID,
                                       "order %s: hold %zu is empty or not UTF-8",
                                       order->order_id, h);
            }
        }
    }
    if (n == 0) {
        return LAPSE_OK;
    }
    return store->cls->insert_orders(store, orders, n, results, err);
}

lapse_status_t lapse_store_mark_scheduled(lapse_store_t *store,
                                          const char *const *order_ids, size_t n,
                                          lapse_error_t *err) {
    lapse_error_clear(err);
    if (store == NULL || (n > 0 && order_ids == NULL)) {
        return invalid(err, "mark_scheduled: NULL argument");
    }
    for (size_t i = 0; i < n; i++) {
        if (order_ids[i] == NULL) {
            return invalid(err, "mark_scheduled: NULL order id");
        }
    }
    if (n == 0) {
        return LAPSE_OK;
    }
    return store->cls->mark_scheduled(store, order_ids, n, err);
}

lapse_status_t lapse_store_pay(lapse_store_t *store, const char *order_id, int64_t now_ms,
                               lapse_error_t *err) {
    lapse_error_clear(err);
    if (store == NULL || order_id == NULL) {
        return invalid(err, "pay: NULL argument");
    }
    return store->cls->pay(store, order_id, now_ms, err);
}

lapse_status_t lapse_store_cancel_batch(lapse_store_t *store, lapse_cancel_item_t *items,
                                        size_t n, int64_t now_ms, lapse_error_t *err) {
    lapse_error_clear(err);
    if (store == NULL || (n > 0 && items == NULL)) {
        return invalid(err, "cancel_batch: NULL argument");
    }
    for (size_t i = 0; i < n; i++) {
        if (items[i].order_id == NULL) {
            return invalid(err, "cancel_batch: NULL order id");
        }
    }
    if (n == 0) {
        return LAPSE_OK;
    }
    return store->cls->cancel_batch(store, items, n, now_ms, err);
}

lapse_status_t lapse_store_get(lapse_store_t *store, const char *order_id,
                               lapse_order_t *out, lapse_error_t *err) {
    lapse_error_clear(err);
    if (store == NULL || order_id == NULL || out == NULL) {
        return invalid(err, "get: NULL argument");
    }
    return store->cls->get(store, order_id, out, err);
}

lapse_status_t lapse_store_count(lapse_store_t *store, int64_t counts[3],
                                 lapse_error_t *err) {
    lapse_error_clear(err);
    if (store == NULL || counts == NULL) {
        return invalid(err, "count: NULL argument");
    }
    return store->cls->count(store, counts, err);
}

lapse_status_t lapse_store_events_release(lapse_store_t *store, const int64_t *seqs,
                                          size_t n, lapse_error_t *err) {
    lapse_error_clear(err);
    if (store == NULL || (n > 0 && seqs == NULL)) {
        return invalid(err, "events_release: NULL argument");
    }
    if (n == 0 || store->cls->events_release == NULL) {
        return LAPSE_OK;
    }
    return store->cls->events_release(store, seqs, n, err);
}

lapse_status_t lapse_store_prune(lapse_store_t *store, int64_t before_ms, size_t limit,
                                 int64_t *orders, int64_t *events, lapse_error_t *err) {
    int64_t ignored[2];
    lapse_error_clear(err);
    if (store == NULL) {
        return invalid(err, "prune: NULL argument");
    }
    *(orders != NULL ? orders : &ignored[0]) = 0;
    *(events != NULL ? events : &ignored[1]) = 0;
    if (limit == 0) {
        return LAPSE_OK;
    }
    int64_t bound = limit > (size_t)INT64_MAX ? INT64_MAX : (int64_t)limit;
    return store->cls->prune(store, before_ms, bound,
                             orders != NULL ? orders : &ignored[0],
                             events != NULL ? events : &ignored[1], err);
}

/* Room for one more item. */
static bool event_list_room(lapse__event_list_t *list) {
    if (list->n == list->cap) {
        size_t cap = list->cap == 0 ? 16 : list->cap * 2;
        lapse_event_t *grown = realloc(list->items, cap * sizeof(*grown));
        if (grown == NULL) {
            return false;
        }
        list->items = grown;
        list->cap = cap;
    }
    return true;
}

bool lapse__event_list_borrow(lapse__event_list_t *list, int64_t seq,
                              const char *event_id, const char *order_id,
                              const char *body) {
    if (!event_list_room(list)) {
        return false;
    }
    list->items[list->n++] = (lapse_event_t){
        .seq = seq, .event_id = event_id, .order_id = order_id, .body = body};
    return true;
}

bool lapse__event_list_add(lapse__event_list_t *list, int64_t seq, const char *event_id,
                           size_t event_id_len, const char *order_id, size_t order_id_len,
                           const char *body, size_t body_len) {
    if (!event_list_room(list)) {
        return false;
    }
    char *block = malloc(event_id_len + order_id_len + body_len + 3);
    if (block == NULL) {
        return false;
    }
    char *id = block;
    char *order = id + event_id_len + 1;
    char *text = order + order_id_len + 1;
    memcpy(id, event_id, event_id_len);
    id[event_id_len] = '\0';
    memcpy(order, order_id, order_id_len);
    order[order_id_len] = '\0';
    memcpy(text, body, body_len);
    text[body_len] = '\0';
    list->items[list->n++] =
        (lapse_event_t){.seq = seq, .event_id = id, .order_id = order, .body = text};
    return true;
}

void lapse__event_list_free(lapse__event_list_t *list) {
    if (list->owner != NULL) {
        list->owner_free(list->owner);
    } else {
        for (size_t i = 0; i < list->n; i++) {
            free((char *)list->items[i].event_id);
        }
    }
    free(list->items);
    *list = (lapse__event_list_t){0};
}

static int compare_seq(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

lapse_status_t lapse_store_events_pending(lapse_store_t *store, size_t limit,
                                          const int64_t *only_seqs, size_t n_seqs,
                                          lapse_event_cb cb, void *opaque,
                                          lapse_error_t *err) {
    lapse_error_clear(err);
    if (store == NULL || cb == NULL || (n_seqs > 0 && only_seqs == NULL)) {
        return invalid(err, "events_pending: NULL argument");
    }
    /* An explicit empty filter matches nothing, as does a zero limit. */
    if (limit == 0 || (only_seqs != NULL && n_seqs == 0)) {
        return LAPSE_OK;
    }
    int64_t *seqs = NULL;
    size_t n_unique = 0;
    if (only_seqs != NULL) {
        /* Sorted and deduplicated, so a backend can return rows oldest first, once. */
        if ((seqs = malloc(n_seqs * sizeof(*seqs))) == NULL) {
            return lapse_error_set(err, LAPSE_ERR_NOMEM, "events_pending");
        }
        memcpy(seqs, only_seqs, n_seqs * sizeof(*seqs));
        qsort(seqs, n_seqs, sizeof(*seqs), compare_seq);
        for (size_t k = 0; k < n_seqs; k++) {
            if (n_unique == 0 || seqs[n_unique - 1] != seqs[k]) {
                seqs[n_unique++] = seqs[k];
            }
        }
    }
    /* The events are copied out and the backend's read finished before cb runs, so the
     * callback may take its time publishing, or use this very handle, without holding
     * a snapshot open. With seqs, a page at a time: a round of 8192 owed events held
     * whole weighed 1.4 MB of a consumer's peak RSS (issue 14). */
    lapse_status_t rc = LAPSE_OK;
    bool stopped = false;
    size_t handed = 0;
    for (size_t at = 0; rc == LAPSE_OK && !stopped && handed < limit &&
                        (seqs == NULL ? at == 0 : at < n_unique);) {
        size_t page = seqs == NULL ? n_unique : n_unique - at;
        page = seqs != NULL && page > LAPSE_STORE_EVENTS_PAGE ? LAPSE_STORE_EVENTS_PAGE
                                                              : page;
        lapse__event_list_t list = {0};
        rc = store->cls->events_pending(
            store, limit - handed, seqs != NULL ? seqs + at : NULL, page, &list, err);
        at += seqs != NULL ? page : 1;
        size_t passed = 0;
        while (rc == LAPSE_OK && passed < list.n) {
            if (cb(opaque, &list.items[passed++]) != 0) {
                stopped = true;
                break;
            }
        }
        handed += passed;
        /* What the callback never saw goes back at once (a claim is for events in
         * hand). */
        if (passed < list.n && store->cls->events_release != NULL) {
            int64_t *rest = malloc((list.n - passed) * sizeof *rest);
            for (size_t i = passed; rest != NULL && i < list.n; i++) {
                rest[i - passed] = list.items[i].seq;
            }
            if (rest != NULL) {
                store->cls->events_release(store, rest, list.n - passed, NULL);
            }
            free(rest);
        }
        lapse__event_list_free(&list);
    }
    free(seqs);
    return rc;
}

lapse_status_t lapse_store_events_mark_published(lapse_store_t *store,
                                                 const int64_t *seqs, size_t n,
                                                 int64_t now_ms, lapse_error_t *err) {
    lapse_error_clear(err);
    if (store == NULL || (n > 0 && seqs == NULL)) {
        return invalid(err, "events_mark_published: NULL argument");
    }
    if (n == 0) {
        return LAPSE_OK;
    }
    return store->cls->events_mark_published(store, seqs, n, now_ms, err);
}

lapse_status_t lapse_store_events_count(lapse_store_t *store, int64_t *pending,
                                        lapse_error_t *err) {
    lapse_error_clear(err);
    if (store == NULL || pending == NULL) {
        return invalid(err, "events_count: NULL argument");
    }
    return store->cls->events_count(store, pending, err);
}

void lapse_pending_filter_init(lapse_pending_filter_t *filter) {
    if (filter == NULL) {
        return;
    }
    *filter = (lapse_pending_filter_t){.due_before_ms = INT64_MAX,
                                       .created_before_ms = INT64_MAX,
                                       .after_deadline_ms = INT64_MIN};
}

lapse_status_t lapse_store_pending(lapse_store_t *store,
                                   const lapse_pending_filter_t *filter,
                                   lapse_order_cb cb, void *opaque, lapse_error_t *err) {
    lapse_error_clear(err);
    if (store == NULL || cb == NULL) {
        return invalid(err, "pending: NULL argument");
    }
    lapse_pending_filter_t defaults;
    if (filter == NULL) {
        lapse_pending_filter_init(&defaults);
        filter = &defaults;
    }
    /* The cursor: the first page starts after the caller's, every next page after the
     * last order of the one before. "" sorts before every valid order id. */
    int64_t after_deadline = filter->after_deadline_ms;
    char after_id[LAPSE_ORDER_ID_MAX + 1] = "";
    if (filter->after_order_id != NULL) {
        size_t len = strlen(filter->after_order_id);
        if (len > LAPSE_ORDER_ID_MAX) {
            return invalid(err, "pending: cursor order id too long");
        }
        memcpy(after_id, filter->after_order_id, len + 1);
    } else {
        after_deadline = INT64_MIN;
    }
    /* On the heap: a page is some 50 KiB, and callers may run on small stacks. */
    lapse_order_t *items = malloc(LAPSE__PENDING_PAGE * sizeof(*items));
    if (items == NULL) {
        return lapse_error_set(err, LAPSE_ERR_NOMEM, "pending");
    }
    for (size_t i = 0; i < LAPSE__PENDING_PAGE; i++) {
        lapse_order_init(&items[i]);
    }
    size_t left = filter->limit; /* 0: no limit */
    lapse_status_t rc = LAPSE_OK;
    bool stopped = false;
    while (!stopped) {
        lapse__order_page_t page = {.items = items, .cap = LAPSE__PENDING_PAGE};
        if (filter->limit > 0 && left < page.cap) {
            page.cap = left;
        }
        rc =
            store->cls->pending_page(store, filter, after_deadline, after_id, &page, err);
        /* The page is complete and its read finished: cb may use the handle now. */
        for (size_t i = 0; rc == LAPSE_OK && !stopped && i < page.n; i++) {
            stopped = cb(opaque, &items[i]) != 0;
        }
        if (page.n > 0) {
            const lapse_order_t *last = &items[page.n - 1];
            after_deadline = last->deadline_ms;
            memcpy(after_id, last->order_id, sizeof(after_id));
        }
        for (size_t i = 0; i < page.n; i++) {
            lapse_order_clear(&items[i]);
        }
        if (filter->limit > 0) {
            left -= page.n;
        }
        /* A short page is the last one. */
        if (rc != LAPSE_OK || page.n < page.cap || (filter->limit > 0 && left == 0)) {
            break;
        }
    }
    free(items);
    return rc;
}

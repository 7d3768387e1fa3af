/* SPDX-License-Identifier: MIT
 * The SQLite store backend: WAL file, statements prepared once per handle, CAS writes. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sqlite_api_int.h"
#include "sqlite_vfs_int.h"
#include "store_int.h"

#include "store_sqlite_sql.h"

#define BUSY_TIMEOUT_MS 5000
#define EVENT_ID_PREFIX LAPSE_EVENT_CANCELLED ":"

/* A cancel batch records its events with multi-row INSERTs of these many rows, the
 * largest that fits what is left first (see record_events). */
static const size_t EVENT_CHUNK[] = {32, 8, 1};
#define EVENT_CHUNKS    (sizeof EVENT_CHUNK / sizeof EVENT_CHUNK[0])
#define EVENT_CHUNK_MAX 32

typedef struct sqlite_store {
    lapse_store_t base; /* first: a lapse_store_t * is a sqlite_store_t * */
    sqlite3 *db;
    sqlite3_stmt *stmt[ST_COUNT_];
    sqlite3_stmt *event_insert[EVENT_CHUNKS]; /* EVENT_CHUNK[k] rows each */
} sqlite_store_t;

static sqlite_store_t *as_sqlite(lapse_store_t *store) {
    return (sqlite_store_t *)store;
}

static lapse_status_t status_of(int src) {
    switch (src & 0xff) {
        case SQLITE_BUSY:
        case SQLITE_LOCKED:
            return LAPSE_ERR_STORE_BUSY;
        case SQLITE_NOMEM:
            return LAPSE_ERR_NOMEM;
        default:
            return LAPSE_ERR_STORE_SQL;
    }
}

/* Records why src failed, under code. Must run before the statement is reset or a
 * ROLLBACK runs, both of which replace lapse__sq.sqlite3_errmsg(). */
static lapse_status_t fail_as(sqlite_store_t *s, lapse_status_t code, int src,
                              const char *what, lapse_error_t *err) {
    const char *msg =
        s->db != NULL ? lapse__sq.sqlite3_errmsg(s->db) : lapse__sq.sqlite3_errstr(src);
    return lapse_error_set(err, code, "%s: %s", what, msg);
}

static lapse_status_t fail(sqlite_store_t *s, int src, const char *what,
                           lapse_error_t *err) {
    return fail_as(s, status_of(src), src, what, err);
}

/* Binds ?1, ?2, ... in order: 't' takes a const char * (SQLITE_STATIC: the caller keeps
 * it alive until the statement is released), 'i' takes an int64_t, exactly. */
static int bind_va(sqlite3_stmt *st, const char *types, va_list ap) {
    int src = SQLITE_OK;
    for (int i = 0; src == SQLITE_OK && types[i] != '\0'; i++) {
        if (types[i] == 't') {
            src = lapse__sq.sqlite3_bind_text(st, i + 1, va_arg(ap, const char *), -1,
                                              SQLITE_STATIC);
        } else {
            src = lapse__sq.sqlite3_bind_int64(st, i + 1, va_arg(ap, int64_t));
        }
    }
    return src;
}

static int bind(sqlite3_stmt *st, const char *types, ...) {
    va_list ap;
    va_start(ap, types);
    int src = bind_va(st, types, ap);
    va_end(ap);
    return src;
}

/* Every use of a statement ends here, so none stays active (holding a read snapshot)
 * and no binding outlives the strings it points to. */
static void release(sqlite3_stmt *st) {
    lapse__sq.sqlite3_reset(st);
    lapse__sq.sqlite3_clear_bindings(st);
}

/* Runs a statement that returns no rows; *changes (optional) gets the rows changed. */
static lapse_status_t run(sqlite_store_t *s, stmt_id_t id, int *changes,
                          lapse_error_t *err, const char *types, ...) {
    sqlite3_stmt *st = s->stmt[id];
    va_list ap;
    va_start(ap, types);
    int src = bind_va(st, types, ap);
    va_end(ap);
    if (src == SQLITE_OK) {
        src = lapse__sq.sqlite3_step(st);
    }
    lapse_status_t rc = LAPSE_OK;
    if (src != SQLITE_DONE) {
        rc = fail(s, src == SQLITE_ROW ? SQLITE_MISUSE : src, STMT_NAME[id], err);
    } else if (changes != NULL) {
        *changes = lapse__sq.sqlite3_changes(s->db);
    }
    release(st);
    return rc;
}

static void rollback(sqlite_store_t *s) {
    /* Some errors (SQLITE_FULL, SQLITE_IOERR, ...) have rolled back by themselves. */
    if (!lapse__sq.sqlite3_get_autocommit(s->db)) {
        run(s, ST_ROLLBACK, NULL, NULL, "");
    }
}

/* Ends a transaction: commits when rc is LAPSE_OK, else (or when the commit fails)
 * rolls back. Returns the outcome. */
static lapse_status_t end(sqlite_store_t *s, lapse_status_t rc, lapse_error_t *err) {
    if (rc == LAPSE_OK && (rc = run(s, ST_COMMIT, NULL, err, "")) == LAPSE_OK) {
        return LAPSE_OK;
    }
    rollback(s);
    return rc;
}

static int64_t column_time(sqlite3_stmt *st, int col) {
    return lapse__sq.sqlite3_column_type(st, col) == SQLITE_NULL
               ? -1
               : lapse__sq.sqlite3_column_int64(st, col);
}

/* Reads the order row (not its holds) into out; *found tells whether it exists. */
static lapse_status_t read_order(sqlite_store_t *s, const char *order_id,
                                 lapse_order_t *out, bool *found, lapse_error_t *err) {
    sqlite3_stmt *st = s->stmt[ST_ORDER_READ];
    int src = bind(st, "t", order_id);
    if (src == SQLITE_OK) {
        src = lapse__sq.sqlite3_step(st);
    }
    lapse_status_t rc = LAPSE_OK;
    *found = src == SQLITE_ROW;
    if (src == SQLITE_ROW) {
        const char *status = (const char *)lapse__sq.sqlite3_column_text(st, 0);
        if (lapse__order_status_parse(status, &out->status) != LAPSE_OK) {
            rc = lapse_error_set(err, LAPSE_ERR_STORE_SQL, "order %s: unknown status",
                                 order_id);
        }
        out->deadline_ms = lapse__sq.sqlite3_column_int64(st, 1);
        out->created_at_ms = lapse__sq.sqlite3_column_int64(st, 2);
        out->paid_at_ms = column_time(st, 3);
        out->cancelled_at_ms = column_time(st, 4);
        out->scheduled = lapse__sq.sqlite3_column_int(st, 5) != 0;
    } else if (src != SQLITE_DONE) {
        rc = fail(s, src, STMT_NAME[ST_ORDER_READ], err);
    }
    release(st);
    return rc;
}

/* Reads the order's hold names, sorted, into out->holds (owned by out, also on failure:
 * lapse_order_clear frees what was read). */
static lapse_status_t read_holds(sqlite_store_t *s, const char *order_id,
                                 lapse_order_t *out, lapse_error_t *err) {
    sqlite3_stmt *st = s->stmt[ST_HOLDS_READ];
    size_t cap = 0;
    lapse_status_t rc = LAPSE_OK;
    int src = bind(st, "t", order_id);
    while (src == SQLITE_OK && (src = lapse__sq.sqlite3_step(st)) == SQLITE_ROW) {
        src = SQLITE_OK;
        if (out->n_holds == cap) {
            cap = cap == 0 ? 4 : cap * 2;
            char **grown = realloc(out->holds, cap * sizeof(*grown));
            if (grown == NULL) {
                rc = lapse_error_set(err, LAPSE_ERR_NOMEM, "reading holds");
                break;
            }
            out->holds = grown;
        }
        const char *name = (const char *)lapse__sq.sqlite3_column_text(st, 0);
        if (name == NULL || (out->holds[out->n_holds] = strdup(name)) == NULL) {
            rc = lapse_error_set(err, LAPSE_ERR_NOMEM, "reading holds");
            break;
        }
        out->n_holds++;
    }
    if (rc == LAPSE_OK && src != SQLITE_DONE) {
        rc = fail(s, src, STMT_NAME[ST_HOLDS_READ], err);
    }
    release(st);
    return rc;
}

static lapse_status_t sq_insert_orders(lapse_store_t *store,
                                       const lapse_new_order_t *orders, size_t n,
                                       lapse_status_t *results, lapse_error_t *err) {
    sqlite_store_t *s = as_sqlite(store);
    lapse_status_t rc = run(s, ST_BEGIN_WRITE, NULL, err, "");
    if (rc != LAPSE_OK) {
        return rc;
    }
    for (size_t i = 0; rc == LAPSE_OK && i < n; i++) {
        const lapse_new_order_t *order = &orders[i];
        int changes = 0;
        rc = run(s, ST_ORDER_INSERT, &changes, err, "tii", order->order_id,
                 order->deadline_ms, order->created_at_ms);
        if (rc != LAPSE_OK) {
            break;
        }
        if (changes == 0) {
            lapse_order_t existing;
            bool found = false;
            lapse_order_init(&existing);
            rc = read_order(s, order->order_id, &existing, &found, err);
            if (rc == LAPSE_OK && !found) {
                rc = lapse_error_set(err, LAPSE_ERR_STORE_SQL,
                                     "order %s: insert ignored but no row",
                                     order->order_id);
            }
            results[i] = lapse__insert_verdict(&existing, order->deadline_ms);
            continue;
        }
        /* Holds go in with a new order only: a re-publish never changes them. */
        for (size_t h = 0; rc == LAPSE_OK && h < order->n_holds; h++) {
            rc =
                run(s, ST_HOLD_INSERT, NULL, err, "tt", order->order_id, order->holds[h]);
        }
        results[i] = LAPSE_OK;
    }
    return end(s, rc, err);
}

static lapse_status_t sq_pay(lapse_store_t *store, const char *order_id, int64_t now_ms,
                             lapse_error_t *err) {
    sqlite_store_t *s = as_sqlite(store);
    lapse_status_t rc = run(s, ST_BEGIN_WRITE, NULL, err, "");
    if (rc != LAPSE_OK) {
        return rc;
    }
    /* The compare-and-set alone decides a race with a cancellation. Reading the row
     * afterwards only explains a refusal, under the same write lock, so it agrees. */
    int changes = 0;
    lapse_order_t order;
    bool found = false;
    lapse_order_init(&order);
    rc = run(s, ST_ORDER_PAY, &changes, err, "it", now_ms, order_id);
    if (rc == LAPSE_OK && changes == 0) {
        rc = read_order(s, order_id, &order, &found, err);
    }
    lapse_status_t verdict = LAPSE_OK;
    if (rc == LAPSE_OK && changes == 0) {
        verdict = lapse__pay_verdict(order_id, found ? &order : NULL, err);
    }
    rc = end(s, rc, err);
    return rc == LAPSE_OK ? verdict : rc;
}

/* A growable text, for the JSON arrays that batch statements read with json_each. A
 * failed allocation sticks (failed) and is checked once, at the end. */
typedef struct text {
    char *p;
    size_t n, cap;
    bool failed;
} text_t;

/* Room for len more bytes and a NUL; false (and failed) when there is none. */
static bool text_reserve(text_t *t, size_t len) {
    if (t->failed) {
        return false;
    }
    if (t->n + len + 1 > t->cap) {
        size_t cap = t->cap != 0 ? t->cap : 1024;
        while (cap < t->n + len + 1) {
            cap *= 2;
        }
        char *grown = realloc(t->p, cap);
        if (grown == NULL) {
            t->failed = true;
            return false;
        }
        t->p = grown;
        t->cap = cap;
    }
    return true;
}

static void text_put(text_t *t, const char *s, size_t len) {
    if (text_reserve(t, len)) {
        memcpy(t->p + t->n, s, len);
        t->n += len;
        t->p[t->n] = '\0';
    }
}

static void text_char(text_t *t, char c) {
    text_put(t, &c, 1);
}

/* sep, then v in decimal. By hand: snprintf was 2 % of a consumer's instructions. */
static void text_uint(text_t *t, char sep, uint64_t v) {
    char num[24];
    char *end = num + sizeof num, *at = end;
    do {
        *--at = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    *--at = sep;
    text_put(t, at, (size_t)(end - at));
}

/* seqs (n > 0) as a JSON array, for the statements that read it with json_each; check
 * .failed, free .p. */
static text_t seq_list(const int64_t *seqs, size_t n) {
    text_t list = {0};
    for (size_t i = 0; i < n; i++) {
        text_uint(&list, i == 0 ? '[' : ',', (uint64_t)seqs[i]); /* a seq is > 0 */
    }
    text_char(&list, ']');
    return list;
}

/* Whether seqs (n > 0) are one run, seqs[0], seqs[0] + 1, ...: what a round of events
 * mostly is (a consumer's cancellations are recorded one after the other). Such a set
 * is read and marked with a range of rowids instead of a JSON array through json_each,
 * which parsed the array and built an ephemeral index of it first (issue 14). */
static bool is_run(const int64_t *seqs, size_t n) {
    for (size_t i = 1; i < n; i++) {
        if (seqs[i] != seqs[0] + (int64_t)i) {
            return false;
        }
    }
    return true;
}

/* Runs a statement and hands each row it returns to row (which may fail the run). */
typedef lapse_status_t (*row_fn)(void *ctx, sqlite3_stmt *st, lapse_error_t *err);

static lapse_status_t each_row(sqlite_store_t *s, stmt_id_t id, row_fn row, void *ctx,
                               lapse_error_t *err, const char *types, ...) {
    sqlite3_stmt *st = s->stmt[id];
    va_list ap;
    va_start(ap, types);
    int src = bind_va(st, types, ap);
    va_end(ap);
    lapse_status_t rc = LAPSE_OK;
    while (src == SQLITE_OK && (src = lapse__sq.sqlite3_step(st)) == SQLITE_ROW) {
        src = SQLITE_OK;
        if ((rc = row(ctx, st, err)) != LAPSE_OK) {
            break;
        }
    }
    if (rc == LAPSE_OK && src != SQLITE_DONE) {
        rc = fail(s, src, STMT_NAME[id], err);
    }
    release(st);
    return rc;
}

/* A cancel batch, inside one write transaction: one SELECT reads the batch's orders
 * (ORDERS_LOOK) and decides each item, one UPDATE cancels the due pending ones by rowid
 * (ORDERS_CANCEL, which checks again), one SELECT reads their unreleased holds
 * (HOLDS_LOOK) and one UPDATE releases them by rowid (HOLDS_RELEASE, skipped when there
 * are none), and multi-row INSERTs record the events (record_events); the orders go in as
 * JSON arrays of their ids (rowids for the updates). The items are found again by
 * id through refs, sorted by (id, position), so that an id given twice is decided for its
 * first item, as if the items were cancelled one after the other: the first cancelled,
 * the next ones noop_cancelled. */
typedef struct id_ref {
    const char *id;
    size_t item;
} id_ref_t;

/* A hold HOLDS_RELEASE returned: its item, and its name at off in names (name is set
 * by group_holds, once names no longer grows). */
typedef struct hold_ref {
    size_t item;
    size_t off;
    const char *name;
} hold_ref_t;

typedef struct cancel_batch {
    lapse_cancel_item_t *items;
    size_t n;
    id_ref_t *refs; /* the items whose id could be stored, sorted */
    size_t n_refs;
    size_t n_done;
    int64_t now_ms;
    text_t ids;    /* scratch: a JSON array of ids */
    text_t rowids; /* scratch: the rowids to update (orders, then holds), a JSON array */
    /* The holds released for the cancelled orders: names one after the other in
     * names; once group_holds sorted them, each item's from its hold_at (index into
     * holds), hold_n of them. */
    text_t names;
    hold_ref_t *holds;
    size_t n_holds, cap_holds;
    size_t *hold_at, *hold_n; /* by item */
} cancel_batch_t;

static int compare_refs(const void *a, const void *b) {
    const id_ref_t *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c != 0 ? c : (x->item > y->item) - (x->item < y->item);
}

/* The first ref with this id, or n_refs. */
static size_t find_ref(const cancel_batch_t *c, const char *id) {
    size_t lo = 0, hi = c->n_refs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(c->refs[mid].id, id) < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < c->n_refs && strcmp(c->refs[lo].id, id) == 0 ? lo : c->n_refs;
}

static bool first_of_its_id(const cancel_batch_t *c, size_t r) {
    return r == 0 || strcmp(c->refs[r - 1].id, c->refs[r].id) != 0;
}

/* The JSON array of the distinct ids whose first item has (done) or has not (!done)
 * been cancelled. @return how many ids, or SIZE_MAX when out of memory. */
static size_t ids_json(cancel_batch_t *c, bool done) {
    size_t count = 0;
    c->ids.n = 0;
    text_char(&c->ids, '[');
    for (size_t r = 0; r < c->n_refs; r++) {
        bool is_done = c->items[c->refs[r].item].outcome == LAPSE_CANCEL_DONE;
        if (first_of_its_id(c, r) && is_done == done) {
            if (count++ > 0) {
                text_char(&c->ids, ',');
            }
            /* Stored ids are [A-Za-z0-9._:-] (lapse_order_id_is_valid): no escaping. */
            text_char(&c->ids, '"');
            text_put(&c->ids, c->refs[r].id, strlen(c->refs[r].id));
            text_char(&c->ids, '"');
        }
    }
    text_char(&c->ids, ']');
    return c->ids.failed ? SIZE_MAX : count;
}

static lapse_status_t row_id(const cancel_batch_t *c, sqlite3_stmt *st, size_t *ref,
                             lapse_error_t *err) {
    const char *id = (const char *)lapse__sq.sqlite3_column_text(st, 0);
    *ref = id != NULL ? find_ref(c, id) : c->n_refs;
    return *ref < c->n_refs ? LAPSE_OK
                            : lapse_error_set(err, LAPSE_ERR_STORE_SQL,
                                              "cancel: an order not asked for");
}

/* A row of ORDERS_LOOK (order id, status, deadline, rowid): every item of that id
 * decided. A pending order that is due is cancelled by its first item; the others with
 * its id find it cancelled, as if they came after it. */
static lapse_status_t on_looked(void *ctx, sqlite3_stmt *st, lapse_error_t *err) {
    cancel_batch_t *c = ctx;
    size_t r;
    lapse_order_status_t status;
    lapse_status_t rc = row_id(c, st, &r, err);
    if (rc == LAPSE_OK &&
        lapse__order_status_parse((const char *)lapse__sq.sqlite3_column_text(st, 1),
                                  &status) != LAPSE_OK) {
        rc = lapse_error_set(err, LAPSE_ERR_STORE_SQL, "order %s: unknown status",
                             c->refs[r].id);
    }
    if (rc != LAPSE_OK) {
        return rc;
    }
    int64_t deadline_ms = lapse__sq.sqlite3_column_int64(st, 2);
    bool due = status == LAPSE_ORDER_PENDING && deadline_ms <= c->now_ms;
    for (size_t k = r;
         k < c->n_refs && (k == r || strcmp(c->refs[k].id, c->refs[r].id) == 0); k++) {
        lapse_cancel_item_t *item = &c->items[c->refs[k].item];
        item->outcome = !due     ? lapse__cancel_verdict(status)
                        : k == r ? LAPSE_CANCEL_DONE
                                 : LAPSE_CANCEL_NOOP_CANCELLED;
        item->deadline_ms = deadline_ms;
    }
    if (due) {
        text_uint(&c->rowids, c->n_done++ == 0 ? '[' : ',',
                  (uint64_t)lapse__sq.sqlite3_column_int64(st, 3));
    }
    return c->rowids.failed ? lapse_error_set(err, LAPSE_ERR_NOMEM, "cancel: rowids")
                            : LAPSE_OK;
}

/* A row of HOLDS_LOOK (order id, resource, rowid), in no promised order: its name kept
 * for the event, its rowid added to rowids for HOLDS_RELEASE. */
static lapse_status_t on_hold(void *ctx, sqlite3_stmt *st, lapse_error_t *err) {
    cancel_batch_t *c = ctx;
    size_t r;
    lapse_status_t rc = row_id(c, st, &r, err);
    const char *name = (const char *)lapse__sq.sqlite3_column_text(st, 1);
    if (rc != LAPSE_OK) {
        return rc;
    }
    if (c->n_holds == c->cap_holds) {
        size_t cap = c->cap_holds != 0 ? c->cap_holds * 2 : 64;
        hold_ref_t *grown = realloc(c->holds, cap * sizeof(*grown));
        if (grown == NULL) {
            return lapse_error_set(err, LAPSE_ERR_NOMEM, "reading holds");
        }
        c->holds = grown;
        c->cap_holds = cap;
    }
    c->holds[c->n_holds++] = (hold_ref_t){.item = c->refs[r].item, .off = c->names.n};
    text_put(&c->names, name != NULL ? name : "",
             (size_t)lapse__sq.sqlite3_column_bytes(st, 1) + 1);
    text_uint(&c->rowids, c->n_holds == 1 ? '[' : ',',
              (uint64_t)lapse__sq.sqlite3_column_int64(st, 2));
    return c->names.failed || c->rowids.failed
               ? lapse_error_set(err, LAPSE_ERR_NOMEM, "reading holds")
               : LAPSE_OK;
}

static int compare_holds(const void *a, const void *b) {
    const hold_ref_t *x = a, *y = b;
    if (x->item != y->item) {
        return (x->item > y->item) - (x->item < y->item);
    }
    return strcmp(x->name, y->name);
}

/* The released holds by item, each item's names sorted (as the event body lists them):
 * RETURNING promises no order. */
static void group_holds(cancel_batch_t *c) {
    for (size_t h = 0; h < c->n_holds; h++) {
        c->holds[h].name = c->names.p + c->holds[h].off;
    }
    if (c->n_holds > 1) {
        qsort(c->holds, c->n_holds, sizeof(*c->holds), compare_holds);
    }
    for (size_t h = 0; h < c->n_holds; h++) {
        size_t item = c->holds[h].item;
        if (c->hold_n[item]++ == 0) {
            c->hold_at[item] = h;
        }
    }
}

/* The SQL of an INSERT of rows events with the seqs given (?1: created_at_ms; ?4k+2,
 * ?4k+3, ?4k+4, ?4k+5: row k's seq, order id, body and deadline); malloc'd, NULL when out
 * of memory. */
static char *event_insert_sql(size_t rows) {
    static const char head[] = "INSERT INTO events (seq, event_id, order_id, body,"
                               " created_at_ms, deadline_ms) VALUES ";
    size_t cap = sizeof head + rows * 80;
    char *sql = malloc(cap);
    if (sql == NULL) {
        return NULL;
    }
    size_t n = (size_t)snprintf(sql, cap, "%s", head);
    for (size_t k = 0; k < rows; k++) {
        n += (size_t)snprintf(
            sql + n, cap - n,
            "%s(?%zu, '" EVENT_ID_PREFIX "' || ?%zu, ?%zu, ?%zu, ?1, ?%zu)",
            k > 0 ? ", " : "", 4 * k + 2, 4 * k + 3, 4 * k + 3, 4 * k + 4, 4 * k + 5);
    }
    return sql;
}

/* One chunk of record_events: the events of items[at[0..rows)] in one INSERT, with the
 * seqs first_seq, first_seq + 1, ... */
static lapse_status_t insert_event_chunk(sqlite_store_t *s, cancel_batch_t *c,
                                         const size_t *at, size_t rows, sqlite3_stmt *st,
                                         char **names, int64_t first_seq, int64_t now_ms,
                                         lapse_error_t *err) {
    char *bodies[EVENT_CHUNK_MAX] = {0};
    lapse_status_t rc = LAPSE_OK;
    int src = lapse__sq.sqlite3_bind_int64(st, 1, now_ms);
    for (size_t k = 0; src == SQLITE_OK && k < rows; k++) {
        lapse_cancel_item_t *item = &c->items[at[k]];
        /* An order that held nothing: its body is built again when the event is read
         * (store_sqlite_sql.h, EVENT_BODY_DERIVED). */
        if (c->hold_n[at[k]] > 0) {
            bodies[k] = lapse__event_body(item->order_id, item->deadline_ms, now_ms,
                                          names + c->hold_at[at[k]], c->hold_n[at[k]]);
            if (bodies[k] == NULL) {
                rc = lapse_error_set(err, LAPSE_ERR_NOMEM, "order %s: cannot build event",
                                     item->order_id);
                break;
            }
        }
        int p = (int)(4 * k + 2);
        src = lapse__sq.sqlite3_bind_int64(st, p, first_seq + (int64_t)k);
        if (src == SQLITE_OK) {
            src =
                lapse__sq.sqlite3_bind_text(st, p + 1, item->order_id, -1, SQLITE_STATIC);
        }
        if (src == SQLITE_OK) {
            src = lapse__sq.sqlite3_bind_text(
                st, p + 2, bodies[k] != NULL ? bodies[k] : EVENT_BODY_DERIVED, -1,
                SQLITE_STATIC);
        }
        if (src == SQLITE_OK) {
            src = lapse__sq.sqlite3_bind_int64(st, p + 3, item->deadline_ms);
        }
    }
    if (rc == LAPSE_OK && src == SQLITE_OK) {
        src = lapse__sq.sqlite3_step(st);
    }
    if (rc == LAPSE_OK && src != SQLITE_DONE) {
        rc = fail(s, src, "EVENT_INSERT", err);
    }
    release(st);
    for (size_t k = 0; k < rows; k++) {
        free(bodies[k]);
        if (rc == LAPSE_OK) {
            c->items[at[k]].event_seq = first_seq + (int64_t)k;
        }
    }
    return rc;
}

/* The events of the cancelled items, in item order, each body bound as
 * lapse__event_body wrote it: multi-row INSERTs of EVENT_CHUNK rows, the largest that
 * fits what is left first, with the seqs given. One INSERT per event paid for a
 * statement (its cursors, and AUTOINCREMENT's read and write of sqlite_sequence) per
 * row: issue 14, 20k orders drained with the events persisted, 72.9k -> 65.2k
 * instructions per order (chunks of 128: 64.7k, and 0.3 MB more peak RSS). One
 * INSERT ... SELECT over a JSON object of the batch's bodies took as many instructions
 * as one per event, and the object and SQLite's parse of it weighed about 0.5 MB of a
 * draining consumer's peak RSS; a chunk holds at most EVENT_CHUNK_MAX bodies at once. */
static lapse_status_t record_events(sqlite_store_t *s, cancel_batch_t *c, int64_t now_ms,
                                    lapse_error_t *err) {
    char **names = malloc((c->n_holds > 0 ? c->n_holds : 1) * sizeof(*names));
    size_t *at = malloc((c->n_done > 0 ? c->n_done : 1) * sizeof(*at));
    lapse_status_t rc = LAPSE_OK;
    if (names == NULL || at == NULL) {
        rc = lapse_error_set(err, LAPSE_ERR_NOMEM, "cancel: events");
    }
    for (size_t h = 0; rc == LAPSE_OK && h < c->n_holds; h++) {
        names[h] = c->names.p + c->holds[h].off;
    }
    size_t n_at = 0;
    for (size_t i = 0; rc == LAPSE_OK && i < c->n && n_at < c->n_done; i++) {
        if (c->items[i].outcome == LAPSE_CANCEL_DONE) {
            at[n_at++] = i;
        }
    }
    /* The seqs AUTOINCREMENT would give, one after the other, chosen here so that no
     * RETURNING is needed to learn them: the write lock is held, nobody else inserts. */
    int64_t next = 0;
    if (rc == LAPSE_OK && n_at > 0) {
        sqlite3_stmt *st = s->stmt[ST_EVENTS_NEXT_SEQ];
        int src = lapse__sq.sqlite3_step(st);
        if (src == SQLITE_ROW) {
            next = lapse__sq.sqlite3_column_int64(st, 0);
        } else {
            rc =
                fail(s, src == SQLITE_DONE ? SQLITE_MISUSE : src, "EVENTS_NEXT_SEQ", err);
        }
        release(st);
    }
    for (size_t pos = 0; rc == LAPSE_OK && pos < n_at;) {
        size_t k = 0;
        while (EVENT_CHUNK[k] > n_at - pos) {
            k++;
        }
        rc = insert_event_chunk(s, c, at + pos, EVENT_CHUNK[k], s->event_insert[k], names,
                                next + (int64_t)pos, now_ms, err);
        pos += EVENT_CHUNK[k];
    }
    free(at);
    free(names);
    return rc;
}

/* Inside the write transaction: the statements of the batch, in order. */
static lapse_status_t cancel_in_transaction(sqlite_store_t *s, cancel_batch_t *c,
                                            int64_t now_ms, lapse_error_t *err) {
    const lapse_status_t nomem = LAPSE_ERR_NOMEM;
    if (ids_json(c, false) == SIZE_MAX) {
        return lapse_error_set(err, nomem, "cancel: ids");
    }
    /* Looked up, then cancelled by rowid: a single UPDATE ... FROM json_each ...
     * RETURNING (and a SELECT for the rest) cost 18.9k instructions per order against
     * 16.1k (store_sqlite_sql.h, ORDERS_LOOK). No order not yet read (an unknown id)
     * can appear, nor a read one change, before the commit: the write lock is held. */
    lapse_status_t rc = each_row(s, ST_ORDERS_LOOK, on_looked, c, err, "t", c->ids.p);
    if (rc != LAPSE_OK || c->n_done == 0) {
        return rc;
    }
    text_char(&c->rowids, ']');
    int changed = 0;
    rc = c->rowids.failed
             ? lapse_error_set(err, nomem, "cancel: rowids")
             : run(s, ST_ORDERS_CANCEL, &changed, err, "it", now_ms, c->rowids.p);
    if (rc == LAPSE_OK && (size_t)changed != c->n_done) {
        /* Read under the same write lock, so this cannot happen; should it ever, nothing
         * is written rather than an event for an order that was not cancelled. */
        return lapse_error_set(err, LAPSE_ERR_STORE_SQL, "cancel: %d of %zu rows changed",
                               changed, c->n_done);
    }
    if (rc != LAPSE_OK) {
        return rc;
    }
    if (ids_json(c, true) == SIZE_MAX) {
        return lapse_error_set(err, nomem, "cancel: ids");
    }
    /* The holds released are the ones read for the events, by rowid (as the orders). */
    c->rowids.n = 0;
    rc = each_row(s, ST_HOLDS_LOOK, on_hold, c, err, "t", c->ids.p);
    if (rc == LAPSE_OK && c->n_holds > 0) {
        text_char(&c->rowids, ']');
        rc = c->rowids.failed
                 ? lapse_error_set(err, nomem, "cancel: holds")
                 : run(s, ST_HOLDS_RELEASE, &changed, err, "it", now_ms, c->rowids.p);
        if (rc == LAPSE_OK && (size_t)changed != c->n_holds) {
            rc = lapse_error_set(err, LAPSE_ERR_STORE_SQL,
                                 "cancel: %d of %zu holds released", changed, c->n_holds);
        }
    }
    if (rc == LAPSE_OK) {
        group_holds(c);
    }
    /* One event per order cancelled here: ORDERS_CANCEL changed from pending exactly
     * the rows read as due, under the write lock (no UNIQUE index repeats that check
     * since schema version 5; store_sqlite_sql.h, EVENTS_COLUMNS). */
    if (rc == LAPSE_OK) {
        rc = record_events(s, c, now_ms, err);
    }
    return rc;
}

static lapse_status_t sq_cancel_batch(lapse_store_t *store, lapse_cancel_item_t *items,
                                      size_t n, int64_t now_ms, lapse_error_t *err) {
    sqlite_store_t *s = as_sqlite(store);
    cancel_batch_t c = {.items = items, .n = n, .now_ms = now_ms};
    c.refs = malloc(n * sizeof(*c.refs));
    c.hold_at = calloc(n, sizeof(*c.hold_at));
    c.hold_n = calloc(n, sizeof(*c.hold_n));
    lapse_status_t rc = LAPSE_OK;
    if (c.refs == NULL || c.hold_at == NULL || c.hold_n == NULL) {
        rc = lapse_error_set(err, LAPSE_ERR_NOMEM, "cancel batch");
    }
    for (size_t i = 0; rc == LAPSE_OK && i < n; i++) {
        items[i].outcome = LAPSE_CANCEL_UNKNOWN;
        items[i].deadline_ms = 0;
        items[i].event_seq = 0;
        items[i].now_ms = now_ms;
        /* An id that could not have been stored is unknown without asking. */
        if (lapse_order_id_is_valid(items[i].order_id, strlen(items[i].order_id))) {
            c.refs[c.n_refs++] = (id_ref_t){.id = items[i].order_id, .item = i};
        }
    }
    if (rc == LAPSE_OK && c.n_refs > 0) {
        qsort(c.refs, c.n_refs, sizeof(*c.refs), compare_refs);
        rc = run(s, ST_BEGIN_WRITE, NULL, err, "");
        if (rc == LAPSE_OK) {
            rc = end(s, cancel_in_transaction(s, &c, now_ms, err), err);
        }
    }
    if (rc != LAPSE_OK) {
        /* Nothing was written, so no outcome may claim otherwise. */
        for (size_t i = 0; i < n; i++) {
            items[i].outcome = LAPSE_CANCEL_UNKNOWN;
            items[i].deadline_ms = 0;
            items[i].event_seq = 0;
        }
    }
    free(c.refs);
    free(c.hold_at);
    free(c.hold_n);
    free(c.holds);
    free(c.ids.p);
    free(c.rowids.p);
    free(c.names.p);
    return rc;
}

/* One UPDATE for the whole set, its ids as a JSON array. */
static lapse_status_t sq_mark_scheduled(lapse_store_t *store,
                                        const char *const *order_ids, size_t n,
                                        lapse_error_t *err) {
    sqlite_store_t *s = as_sqlite(store);
    text_t ids = {0};
    size_t count = 0;
    text_char(&ids, '[');
    for (size_t i = 0; i < n; i++) {
        /* An id that could not have been stored marks nothing; the others need no
         * escaping. */
        if (lapse_order_id_is_valid(order_ids[i], strlen(order_ids[i]))) {
            if (count++ > 0) {
                text_char(&ids, ',');
            }
            text_char(&ids, '"');
            text_put(&ids, order_ids[i], strlen(order_ids[i]));
            text_char(&ids, '"');
        }
    }
    text_char(&ids, ']');
    lapse_status_t rc = LAPSE_OK;
    if (ids.failed) {
        rc = lapse_error_set(err, LAPSE_ERR_NOMEM, "mark_scheduled");
    } else if (count > 0 && (rc = run(s, ST_BEGIN_WRITE, NULL, err, "")) == LAPSE_OK) {
        rc = end(s, run(s, ST_ORDERS_SCHEDULE, NULL, err, "t", ids.p), err);
    }
    free(ids.p);
    return rc;
}

static lapse_status_t sq_get(lapse_store_t *store, const char *order_id,
                             lapse_order_t *out, lapse_error_t *err) {
    sqlite_store_t *s = as_sqlite(store);
    size_t id_len = strlen(order_id);
    if (id_len > LAPSE_ORDER_ID_MAX) {
        return lapse_error_set(err, LAPSE_ERR_STORE_NOT_FOUND, "order id too long");
    }
    lapse_order_t order;
    lapse_order_init(&order);
    memcpy(order.order_id, order_id, id_len + 1);

    /* One read transaction, so the row and its holds come from the same snapshot. */
    bool found = false;
    lapse_status_t rc = run(s, ST_BEGIN_READ, NULL, err, "");
    if (rc == LAPSE_OK) {
        rc = read_order(s, order_id, &order, &found, err);
    }
    if (rc == LAPSE_OK && !found) {
        rc = lapse_error_set(err, LAPSE_ERR_STORE_NOT_FOUND, "order %s not found",
                             order_id);
    }
    if (rc == LAPSE_OK) {
        rc = read_holds(s, order_id, &order, err);
    }
    if ((rc = end(s, rc, err)) != LAPSE_OK) {
        lapse_order_clear(&order);
        return rc;
    }
    lapse_order_clear(out);
    *out = order;
    return LAPSE_OK;
}

static lapse_status_t sq_count(lapse_store_t *store, int64_t counts[3],
                               lapse_error_t *err) {
    sqlite_store_t *s = as_sqlite(store);
    sqlite3_stmt *st = s->stmt[ST_ORDER_COUNT];
    lapse_status_t rc = LAPSE_OK;
    int src;
    counts[0] = counts[1] = counts[2] = 0;
    while ((src = lapse__sq.sqlite3_step(st)) == SQLITE_ROW) {
        lapse_order_status_t status;
        const char *name = (const char *)lapse__sq.sqlite3_column_text(st, 0);
        if (lapse__order_status_parse(name, &status) == LAPSE_OK) {
            counts[status] = lapse__sq.sqlite3_column_int64(st, 1);
        }
    }
    if (src != SQLITE_DONE) {
        rc = fail(s, src, STMT_NAME[ST_ORDER_COUNT], err);
    }
    release(st);
    return rc;
}

static lapse_status_t sq_events_count(lapse_store_t *store, int64_t *pending,
                                      lapse_error_t *err) {
    sqlite_store_t *s = as_sqlite(store);
    sqlite3_stmt *st = s->stmt[ST_EVENTS_COUNT];
    lapse_status_t rc = LAPSE_OK;
    int src = lapse__sq.sqlite3_step(st);
    if (src == SQLITE_ROW) {
        *pending = lapse__sq.sqlite3_column_int64(st, 0);
    } else {
        rc = fail(s, src, STMT_NAME[ST_EVENTS_COUNT], err);
    }
    release(st);
    return rc;
}

/* The body of the event row st is on (seq, event_id, order_id, body, deadline_ms,
 * created_at_ms) into *body: the stored one, or, stored as EVENT_BODY_DERIVED, the one
 * built again into *built (free()). */
static lapse_status_t event_row_body(sqlite3_stmt *st, const char **body, size_t *len,
                                     char **built, lapse_error_t *err) {
    *body = (const char *)lapse__sq.sqlite3_column_text(st, 3);
    *len = (size_t)lapse__sq.sqlite3_column_bytes(st, 3);
    *built = NULL;
    if (*body == NULL || *len > 0) {
        return *body != NULL ? LAPSE_OK
                             : lapse_error_set(err, LAPSE_ERR_NOMEM, "reading events");
    }
    const char *order_id = (const char *)lapse__sq.sqlite3_column_text(st, 2);
    if (order_id == NULL || lapse__sq.sqlite3_column_type(st, 4) != SQLITE_INTEGER) {
        return lapse_error_set(err, LAPSE_ERR_STORE_SQL,
                               "event %lld: an empty body and no deadline",
                               (long long)lapse__sq.sqlite3_column_int64(st, 0));
    }
    *built = lapse__event_body(order_id, lapse__sq.sqlite3_column_int64(st, 4),
                               lapse__sq.sqlite3_column_int64(st, 5), NULL, 0);
    *body = *built;
    *len = *built != NULL ? strlen(*built) : 0;
    return *built != NULL ? LAPSE_OK
                          : lapse_error_set(err, LAPSE_ERR_NOMEM, "reading events");
}

/* Appends the rows of statement id, bound to the parameters types says (as in run),
 * until out holds limit events. */
static lapse_status_t collect_events(sqlite_store_t *s, stmt_id_t id, size_t limit,
                                     lapse__event_list_t *out, lapse_error_t *err,
                                     const char *types, ...) {
    sqlite3_stmt *st = s->stmt[id];
    lapse_status_t rc = LAPSE_OK;
    va_list ap;
    va_start(ap, types);
    int src = bind_va(st, types, ap);
    va_end(ap);
    while (src == SQLITE_OK && out->n < limit &&
           (src = lapse__sq.sqlite3_step(st)) == SQLITE_ROW) {
        src = SQLITE_OK;
        const char *text[3];
        size_t len[3];
        char *built = NULL;
        for (int c = 0; c < 2; c++) {
            text[c] = (const char *)lapse__sq.sqlite3_column_text(st, c + 1);
            len[c] = (size_t)lapse__sq.sqlite3_column_bytes(st, c + 1);
        }
        rc = event_row_body(st, &text[2], &len[2], &built, err);
        if (rc == LAPSE_OK &&
            (text[0] == NULL || text[1] == NULL ||
             !lapse__event_list_add(out, lapse__sq.sqlite3_column_int64(st, 0), text[0],
                                    len[0], text[1], len[1], text[2], len[2]))) {
            rc = lapse_error_set(err, LAPSE_ERR_NOMEM, "reading events");
        }
        free(built);
        if (rc != LAPSE_OK) {
            break;
        }
    }
    if (rc == LAPSE_OK && src != SQLITE_OK && src != SQLITE_DONE) {
        rc = fail(s, src, STMT_NAME[id], err);
    }
    release(st);
    return rc;
}

static lapse_status_t sq_events_pending(lapse_store_t *store, size_t limit,
                                        const int64_t *seqs, size_t n_seqs,
                                        lapse__event_list_t *out, lapse_error_t *err) {
    sqlite_store_t *s = as_sqlite(store);
    if (seqs == NULL) {
        int64_t bound = limit > (size_t)INT64_MAX ? INT64_MAX : (int64_t)limit;
        return collect_events(s, ST_EVENTS_PENDING, limit, out, err, "i", bound);
    }
    if (n_seqs == 0) {
        return LAPSE_OK;
    }
    if (is_run(seqs, n_seqs)) {
        return collect_events(s, ST_EVENTS_BY_RANGE, limit, out, err, "ii", seqs[0],
                              seqs[n_seqs - 1]);
    }
    text_t list = seq_list(seqs, n_seqs);
    lapse_status_t rc =
        list.failed ? lapse_error_set(err, LAPSE_ERR_NOMEM, "events: seqs")
                    : collect_events(s, ST_EVENTS_BY_SEQ, limit, out, err, "t", list.p);
    free(list.p);
    return rc;
}

static lapse_status_t sq_events_mark_published(lapse_store_t *store, const int64_t *seqs,
                                               size_t n, int64_t now_ms,
                                               lapse_error_t *err) {
    sqlite_store_t *s = as_sqlite(store);
    if (n == 0) {
        return LAPSE_OK;
    }
    /* One statement for the round: a range when the seqs are one run. */
    bool range = is_run(seqs, n);
    text_t list = range ? (text_t){0} : seq_list(seqs, n);
    lapse_status_t rc = LAPSE_OK;
    if (list.failed) {
        rc = lapse_error_set(err, LAPSE_ERR_NOMEM, "events: mark published");
    } else if ((rc = run(s, ST_BEGIN_WRITE, NULL, err, "")) == LAPSE_OK) {
        /* A run from events_published_below's seq on moves that seq past it, and writes
         * none of its rows (store_sqlite_sql.h, UNPUBLISHED). */
        int jumped = 0;
        if (range) {
            rc = run(s, ST_EVENTS_BELOW_JUMP, &jumped, err, "ii", seqs[0], seqs[n - 1]);
        }
        if (rc == LAPSE_OK && jumped == 0) {
            rc = range ? run(s, ST_EVENTS_PUBLISHED_RANGE, NULL, err, "iii", now_ms,
                             seqs[0], seqs[n - 1])
                       : run(s, ST_EVENTS_PUBLISHED, NULL, err, "it", now_ms, list.p);
        }
        if (rc == LAPSE_OK) {
            rc = run(s, ST_EVENTS_BELOW_ADVANCE, NULL, err, "");
        }
        rc = end(s, rc, err);
    }
    free(list.p);
    return rc;
}

/* Copies the page's rows out; the statement is released before any hold is read. */
static lapse_status_t read_page(sqlite_store_t *s, const lapse_pending_filter_t *filter,
                                int64_t after_deadline_ms, const char *after_id,
                                lapse__order_page_t *page, lapse_error_t *err) {
    stmt_id_t id = filter->only_unscheduled ? ST_UNSCHEDULED_PAGE : ST_PENDING_PAGE;
    sqlite3_stmt *st = s->stmt[id];
    lapse_status_t rc = LAPSE_OK;
    int src = bind(st, "itiii", after_deadline_ms, after_id, filter->due_before_ms,
                   filter->created_before_ms, (int64_t)page->cap);
    while (src == SQLITE_OK && page->n < page->cap &&
           (src = lapse__sq.sqlite3_step(st)) == SQLITE_ROW) {
        src = SQLITE_OK;
        lapse_order_t *order = &page->items[page->n];
        const char *order_id = (const char *)lapse__sq.sqlite3_column_text(st, 0);
        size_t len = (size_t)lapse__sq.sqlite3_column_bytes(st, 0);
        if (order_id == NULL || len > LAPSE_ORDER_ID_MAX) {
            rc = lapse_error_set(err, LAPSE_ERR_STORE_SQL, "pending: bad order id");
            break;
        }
        memcpy(order->order_id, order_id, len + 1);
        order->status = LAPSE_ORDER_PENDING;
        order->deadline_ms = lapse__sq.sqlite3_column_int64(st, 1);
        order->created_at_ms = lapse__sq.sqlite3_column_int64(st, 2);
        order->scheduled = lapse__sq.sqlite3_column_int(st, 3) != 0;
        page->n++;
    }
    if (rc == LAPSE_OK && src != SQLITE_OK && src != SQLITE_DONE) {
        rc = fail(s, src, STMT_NAME[id], err);
    }
    release(st);
    return rc;
}

static lapse_status_t sq_pending_page(lapse_store_t *store,
                                      const lapse_pending_filter_t *filter,
                                      int64_t after_deadline_ms, const char *after_id,
                                      lapse__order_page_t *page, lapse_error_t *err) {
    sqlite_store_t *s = as_sqlite(store);
    /* One read transaction, so the orders and their holds come from the same snapshot.
     */
    lapse_status_t rc = run(s, ST_BEGIN_READ, NULL, err, "");
    if (rc == LAPSE_OK) {
        rc = read_page(s, filter, after_deadline_ms, after_id, page, err);
    }
    for (size_t i = 0; rc == LAPSE_OK && filter->with_holds && i < page->n; i++) {
        rc = read_holds(s, page->items[i].order_id, &page->items[i], err);
    }
    return end(s, rc, err);
}

static lapse_status_t sq_prune(lapse_store_t *store, int64_t before_ms, int64_t limit,
                               int64_t *orders, int64_t *events, lapse_error_t *err) {
    sqlite_store_t *s = as_sqlite(store);
    int n_orders = 0, n_events = 0;
    lapse_status_t rc = run(s, ST_BEGIN_WRITE, NULL, err, "");
    if (rc != LAPSE_OK) {
        return rc;
    }
    /* The ids first, so that holds and orders go by the same list. */
    rc = run(s, ST_PRUNE_PICK, &n_orders, err, "ii", before_ms, limit);
    if (rc == LAPSE_OK && n_orders > 0) {
        rc = run(s, ST_PRUNE_HOLDS, NULL, err, "");
        if (rc == LAPSE_OK) {
            rc = run(s, ST_PRUNE_ORDERS, &n_orders, err, "");
        }
    }
    if (rc == LAPSE_OK) {
        rc = run(s, ST_PRUNE_CLEAR, NULL, err, "");
    }
    if (rc == LAPSE_OK) {
        rc = run(s, ST_PRUNE_EVENTS, &n_events, err, "ii", before_ms, limit);
    }
    if ((rc = end(s, rc, err)) == LAPSE_OK) {
        *orders = n_orders;
        *events = n_events;
    }
    return rc;
}

static void sq_close(lapse_store_t *store) {
    sqlite_store_t *s = as_sqlite(store);
    for (int i = 0; i < ST_COUNT_; i++) {
        lapse__sq.sqlite3_finalize(s->stmt[i]);
    }
    for (size_t k = 0; k < EVENT_CHUNKS; k++) {
        lapse__sq.sqlite3_finalize(s->event_insert[k]);
    }
    lapse__sq.sqlite3_close(s->db);
    free(s);
}

static const lapse__store_class_t sqlite_class = {
    .name = "sqlite",
    .now = NULL, /* one host: its wall clock decides */
    .insert_orders = sq_insert_orders,
    .mark_scheduled = sq_mark_scheduled,
    .pay = sq_pay,
    .cancel_batch = sq_cancel_batch,
    .get = sq_get,
    .count = sq_count,
    .events_pending = sq_events_pending,
    .events_mark_published = sq_events_mark_published,
    .events_count = sq_events_count,
    .pending_page = sq_pending_page,
    .prune = sq_prune,
    .close = sq_close,
};

/* Failures while opening are LAPSE_ERR_STORE_OPEN, except a busy or locked file, which
 * stays retriable. */
static lapse_status_t open_fail(sqlite_store_t *s, int src, const char *what,
                                lapse_error_t *err) {
    lapse_status_t code = status_of(src);
    if (code == LAPSE_ERR_STORE_SQL) {
        code = LAPSE_ERR_STORE_OPEN;
    }
    return fail_as(s, code, src, what, err);
}

static lapse_status_t set_wal(sqlite_store_t *s, lapse_error_t *err) {
    sqlite3_stmt *st = NULL;
    int src =
        lapse__sq.sqlite3_prepare_v2(s->db, "PRAGMA journal_mode = WAL", -1, &st, NULL);
    if (src == SQLITE_OK && (src = lapse__sq.sqlite3_step(st)) == SQLITE_ROW) {
        const char *mode = (const char *)lapse__sq.sqlite3_column_text(st, 0);
        /* An in-memory database reports "memory" and has nobody to share with. */
        const char *file = lapse__sq.sqlite3_db_filename(s->db, "main");
        bool ok = (mode != NULL && strcasecmp(mode, "wal") == 0) || file == NULL ||
                  file[0] == '\0';
        lapse__sq.sqlite3_finalize(st);
        return ok ? LAPSE_OK
                  : lapse_error_set(err, LAPSE_ERR_STORE_OPEN,
                                    "journal_mode WAL refused (got %s)",
                                    mode != NULL ? mode : "nothing");
    }
    lapse_status_t rc = open_fail(s, src, "journal_mode", err);
    lapse__sq.sqlite3_finalize(st);
    return rc;
}

/* PRAGMA foreign_key_check of the open transaction: LAPSE_OK when it finds nothing. */
static lapse_status_t foreign_keys_hold(sqlite_store_t *s, lapse_error_t *err) {
    sqlite3_stmt *st = NULL;
    int src =
        lapse__sq.sqlite3_prepare_v2(s->db, "PRAGMA foreign_key_check", -1, &st, NULL);
    if (src == SQLITE_OK) {
        src = lapse__sq.sqlite3_step(st);
    }
    lapse__sq.sqlite3_finalize(st);
    if (src == SQLITE_ROW) {
        return lapse_error_set(
            err, LAPSE_ERR_STORE_OPEN,
            "schema upgrade: a hold names no order (foreign_key_check)");
    }
    return src == SQLITE_DONE ? LAPSE_OK : open_fail(s, src, "foreign_key_check", err);
}

/* Brings the file to SCHEMA_VERSION in one write transaction. Foreign keys are off
 * meanwhile (a no-op inside a transaction, hence here): MIGRATE_V4_SQL drops and
 * renames the table holds references. MIGRATE_V5_SQL copies the whole outbox once:
 * on a file with a month of published events that is the one slow open. */
static lapse_status_t apply_schema(sqlite_store_t *s, lapse_error_t *err) {
    int src =
        lapse__sq.sqlite3_exec(s->db, "PRAGMA foreign_keys = OFF", NULL, NULL, NULL);
    if (src == SQLITE_OK) {
        src = lapse__sq.sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    }
    if (src != SQLITE_OK) {
        return open_fail(s, src, "schema", err);
    }
    sqlite3_stmt *st = NULL;
    int version = -1;
    src = lapse__sq.sqlite3_prepare_v2(s->db, "PRAGMA user_version", -1, &st, NULL);
    if (src == SQLITE_OK && (src = lapse__sq.sqlite3_step(st)) == SQLITE_ROW) {
        version = lapse__sq.sqlite3_column_int(st, 0);
        src = SQLITE_OK;
    }
    lapse__sq.sqlite3_finalize(st);
    lapse_status_t rc = LAPSE_OK;
    if (src != SQLITE_OK) {
        rc = open_fail(s, src, "user_version", err);
    } else if (version > SCHEMA_VERSION) {
        rc = lapse_error_set(err, LAPSE_ERR_STORE_OPEN,
                             "store schema version %d is newer than this lapse (%d)",
                             version, SCHEMA_VERSION);
    } else if (version >= 1 && version < 4 &&
               (src = lapse__sq.sqlite3_exec(s->db, MIGRATE_V4_SQL, NULL, NULL, NULL)) !=
                   SQLITE_OK) {
        rc = open_fail(s, src, "schema upgrade to version 4", err);
    } else if (version >= 1 && version < 5 &&
               (src = lapse__sq.sqlite3_exec(s->db, MIGRATE_V5_SQL, NULL, NULL, NULL)) !=
                   SQLITE_OK) {
        rc = open_fail(s, src, "schema upgrade to version 5", err);
    } else if (version == 5 && (src = lapse__sq.sqlite3_exec(s->db, MIGRATE_V6_SQL, NULL,
                                                             NULL, NULL)) != SQLITE_OK) {
        rc = open_fail(s, src, "schema upgrade to version 6", err);
    } else if (version < SCHEMA_VERSION &&
               (src = lapse__sq.sqlite3_exec(s->db, SCHEMA_SQL, NULL, NULL, NULL)) !=
                   SQLITE_OK) {
        rc = open_fail(s, src, "schema", err);
    } else if (version >= 1 && version < 4 &&
               (rc = foreign_keys_hold(s, err)) != LAPSE_OK) {
        /* rolled back below */
    } else if ((src = lapse__sq.sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL)) !=
               SQLITE_OK) {
        rc = open_fail(s, src, "schema commit", err);
    }
    if (rc != LAPSE_OK && !lapse__sq.sqlite3_get_autocommit(s->db)) {
        lapse__sq.sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    }
    src = lapse__sq.sqlite3_exec(s->db, "PRAGMA foreign_keys = ON", NULL, NULL, NULL);
    if (rc == LAPSE_OK && src != SQLITE_OK) {
        rc = open_fail(s, src, "foreign_keys", err);
    }
    return rc;
}

/* ":memory:" and "" (a private temporary database) name no file of their own. */
static bool names_a_file(const char *path) {
    return path[0] != '\0' && strcmp(path, ":memory:") != 0;
}

/* SQLite creates a new database file with mode 0644 less the umask, so under the usual
 * umask 022 anyone on the host can read it, and it gives the -wal and -shm files the
 * database file's mode. Orders and holds are nobody else's business, so a missing store
 * file is created here first, empty and exactly 0600 whatever the umask: SQLite takes an
 * empty file for a new database, and its -wal and -shm then follow 0600 too. O_EXCL: a
 * file that appeared meanwhile (another process creating the same store) is left as it
 * is. */
static lapse_status_t create_private(const char *path, lapse_error_t *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        return errno == EEXIST ? LAPSE_OK
                               : lapse_error_set(err, LAPSE_ERR_STORE_OPEN,
                                                 "sqlite:%s: cannot create: %s", path,
                                                 strerror(errno));
    }
    /* The umask may have taken the owner's bits too; exactly 0600 keeps it writable. */
    int rc = fchmod(fd, 0600);
    int saved = errno;
    close(fd);
    if (rc != 0) {
        unlink(path);
        return lapse_error_set(err, LAPSE_ERR_STORE_OPEN, "sqlite:%s: chmod 0600: %s",
                               path, strerror(saved));
    }
    return LAPSE_OK;
}

static lapse_status_t missing(const char *path, lapse_error_t *err) {
    return lapse_error_set(err, LAPSE_ERR_STORE_MISSING, "store not found: sqlite:%s",
                           path);
}

lapse_store_t *lapse__store_sqlite_open(const char *path, unsigned open_flags,
                                        lapse_status_t *rc, lapse_error_t *err) {
    bool must_exist = (open_flags & LAPSE_STORE_MUST_EXIST) != 0;
    struct stat st;
    /* Loaded before anything is created: without it, no file is made. */
    if ((*rc = lapse__sqlite_load(err)) != LAPSE_OK) {
        return NULL;
    }
    if (names_a_file(path)) {
        if (must_exist && stat(path, &st) != 0 && errno == ENOENT) {
            *rc = missing(path, err);
            return NULL;
        }
        if (!must_exist && (*rc = create_private(path, err)) != LAPSE_OK) {
            return NULL;
        }
    }
    sqlite_store_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        *rc = lapse_error_set(err, LAPSE_ERR_NOMEM, "opening the store");
        return NULL;
    }
    s->base.cls = &sqlite_class;
    /* NOMUTEX: a handle belongs to one thread at a time (see store.h). Without CREATE,
     * a store removed since the check above is still not created. */
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX |
                (must_exist ? 0 : SQLITE_OPEN_CREATE);
    int src = lapse__sq.sqlite3_open_v2(path, &s->db, flags, lapse__sqlite_vfs());
    if (src != SQLITE_OK && must_exist && (src & 0xff) == SQLITE_CANTOPEN &&
        stat(path, &st) != 0 && errno == ENOENT) {
        *rc = missing(path, err);
        goto fail;
    }
    if (src != SQLITE_OK) {
        *rc = lapse_error_set(err, LAPSE_ERR_STORE_OPEN, "sqlite:%s: %s", path,
                              s->db != NULL ? lapse__sq.sqlite3_errmsg(s->db)
                                            : lapse__sq.sqlite3_errstr(src));
        goto fail;
    }
    lapse__sq.sqlite3_extended_result_codes(s->db, 1);
    lapse__sq.sqlite3_busy_timeout(s->db, BUSY_TIMEOUT_MS);
    /* FULL: a commit survives power loss too. sqlite_vfs.c relies on it: a WAL commit
     * is synced, and the sync writes the frames it gathered, before SQLite publishes
     * the commit in the WAL index (with NORMAL another connection could read frames
     * still in the gathering buffer). With NORMAL, WAL mode may roll back the
     * last commits after an OS crash, and a payment the caller was told succeeded could
     * come back pending and then be cancelled (law 2). Batched writers pay one fsync per
     * batch, not per order. temp_store = MEMORY: a batch statement that changes many
     * rows keeps a statement journal, which past 64 KiB went to a temporary file
     * (created, written and unlinked once per cancel batch); in memory it is a few
     * hundred KiB for a batch of a thousand. cache_size = -512: a page cache of 512 KiB
     * per connection instead of SQLite's 2 MiB (1.5 MB less RSS per process). Cancels
     * come in deadline order and the outbox is appended, so their pages are few and
     * recent; a page the cache lacks is one pread from the OS's cache (ids that do not
     * grow with time miss a 2 MiB cache too: a million orders' id index is ~30 MB).
     * Measured (bench_cancel, 300,000 orders, batches of 500): 6.8-7.6 us of CPU per
     * cancel with either cache. */
    if ((*rc = set_wal(s, err)) != LAPSE_OK) {
        goto fail;
    }
    src = lapse__sq.sqlite3_exec(s->db,
                                 "PRAGMA synchronous = FULL; PRAGMA temp_store = MEMORY; "
                                 "PRAGMA cache_size = -512",
                                 NULL, NULL, NULL);
    if (src != SQLITE_OK) {
        *rc = open_fail(s, src, "pragmas", err);
        goto fail;
    }
    if ((*rc = apply_schema(s, err)) != LAPSE_OK) {
        goto fail;
    }
    /* The scratch list of sq_prune, private to this connection. */
    src = lapse__sq.sqlite3_exec(s->db,
                                 "CREATE TEMP TABLE IF NOT EXISTS prune_ids"
                                 " (order_id TEXT NOT NULL PRIMARY KEY)",
                                 NULL, NULL, NULL);
    if (src != SQLITE_OK) {
        *rc = open_fail(s, src, "prune list", err);
        goto fail;
    }
    for (int i = 0; i < ST_COUNT_; i++) {
        src = lapse__sq.sqlite3_prepare_v3(s->db, STMT_SQL[i], -1,
                                           SQLITE_PREPARE_PERSISTENT, &s->stmt[i], NULL);
        if (src != SQLITE_OK) {
            *rc = open_fail(s, src, STMT_NAME[i], err);
            goto fail;
        }
    }
    for (size_t k = 0; k < EVENT_CHUNKS; k++) {
        char *sql = event_insert_sql(EVENT_CHUNK[k]);
        src = sql == NULL ? SQLITE_NOMEM
                          : lapse__sq.sqlite3_prepare_v3(s->db, sql, -1,
                                                         SQLITE_PREPARE_PERSISTENT,
                                                         &s->event_insert[k], NULL);
        free(sql);
        if (src != SQLITE_OK) {
            *rc = open_fail(s, src, "EVENT_INSERT", err);
            goto fail;
        }
    }
    *rc = LAPSE_OK;
    return &s->base;
fail:
    sq_close(&s->base);
    return NULL;
}

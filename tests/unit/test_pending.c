/* SPDX-License-Identifier: MIT
 * Walking pending orders by deadline on a temporary SQLite file, or a database of its
 * own on the test cluster (LAPSE_TEST_STORE=postgresql, see store_fixture.h): order,
 * filters, keyset pages, limits, the cursor, callbacks that write, the indexes the pages
 * read, and the schema upgrade it needs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include <lapse/store.h>

#include "pq_api_int.h"
#include "store_fixture.h"
#include "store_int.h"
#include "store_pg_map_int.h"
#include "store_pg_sql.h"
#include "store_sqlite_sql.h"

/* The orders' times. On SQLite, whose caller's clock decides, 2027-01-15T08:00:00Z; on
 * PostgreSQL, whose server's clock decides, an hour before it, so that every deadline
 * the tests use (T0 + less than a minute) is due when a test cancels an order. */
static int64_t t0_ms = INT64_C(1800000000000);
#define T0 t0_ms

typedef struct fixture {
    sf_store_t sf;
    const char *path; /* SQLite: the store file */
    const char *uri;
    lapse_store_t *store;
} fixture_t;

/* A fresh store, not opened yet. */
static fixture_t *make_store(void) {
    fixture_t *f = calloc(1, sizeof(*f));
    if (f == NULL || sf_create(&f->sf, "pending", NULL, NULL) != 0) {
        free(f);
        return NULL;
    }
    f->path = f->sf.path;
    f->uri = f->sf.uri;
    return f;
}

static int setup(void **state) {
    fixture_t *f = make_store();
    if (f == NULL) {
        return -1;
    }
    lapse_status_t rc;
    lapse_error_t err;
    f->store = lapse_store_open(f->uri, &rc, &err);
    if (f->store == NULL) {
        fprintf(stderr, "open %s: %s\n", f->uri, err.text);
        sf_drop(&f->sf);
        free(f);
        return -1;
    }
    t0_ms = INT64_C(1800000000000);
    if (f->sf.backend == SF_PG) {
        int64_t now = 0;
        if (lapse_store_now(f->store, &now, &err) != LAPSE_OK) {
            fprintf(stderr, "store clock: %s\n", err.text);
            return -1;
        }
        t0_ms = now - 60 * 60 * 1000;
    }
    *state = f;
    return 0;
}

/* The store only: the test opens it itself. */
static int setup_dir(void **state) {
    fixture_t *f = make_store();
    *state = f;
    return f == NULL ? -1 : 0;
}

static int teardown(void **state) {
    fixture_t *f = *state;
    lapse_store_close(f->store);
    int rc = sf_drop(&f->sf);
    free(f);
    return rc;
}

static void insert_full(lapse_store_t *store, const char *order_id, int64_t deadline_ms,
                        int64_t created_at_ms, const char *const *holds, size_t n_holds) {
    lapse_new_order_t order = {.order_id = order_id,
                               .deadline_ms = deadline_ms,
                               .created_at_ms = created_at_ms,
                               .holds = holds,
                               .n_holds = n_holds};
    lapse_status_t result = LAPSE_ERR_INVALID;
    lapse_error_t err;
    assert_int_equal(lapse_store_insert_orders(store, &order, 1, &result, &err),
                     LAPSE_OK);
    assert_int_equal(result, LAPSE_OK);
}

static void insert(lapse_store_t *store, const char *order_id, int64_t deadline_ms) {
    insert_full(store, order_id, deadline_ms, T0, NULL, 0);
}

static void mark_scheduled(lapse_store_t *store, const char *order_id) {
    lapse_error_t err;
    assert_int_equal(lapse_store_mark_scheduled(store, &order_id, 1, &err), LAPSE_OK);
}

/* What a walk saw: ids joined by ' ', and the orders' fields for checks. */
typedef struct seen {
    char ids[8192];
    size_t n;
    size_t stop_after; /* 0: never stop */
    int64_t last_deadline;
    char last_id[LAPSE_ORDER_ID_MAX + 1];
    bool out_of_order;
    lapse_order_t first;      /* a copy of the first order, holds included */
    lapse_store_t *cancel_in; /* when set, cb cancels each order it sees through it */
} seen_t;

static int collect(void *opaque, const lapse_order_t *order) {
    seen_t *s = opaque;
    if (s->n > 0 && (order->deadline_ms < s->last_deadline ||
                     (order->deadline_ms == s->last_deadline &&
                      strcmp(order->order_id, s->last_id) <= 0))) {
        s->out_of_order = true;
    }
    if (s->n == 0) {
        s->first = *order;
        s->first.holds = NULL;
        s->first.n_holds = 0;
        for (size_t i = 0; i < order->n_holds; i++) {
            s->first.holds = realloc(s->first.holds, (i + 1) * sizeof(char *));
            s->first.holds[i] = strdup(order->holds[i]);
            s->first.n_holds++;
        }
    }
    s->last_deadline = order->deadline_ms;
    snprintf(s->last_id, sizeof(s->last_id), "%s", order->order_id);
    size_t len = strlen(s->ids);
    if (len + strlen(order->order_id) + 2 < sizeof(s->ids)) {
        snprintf(s->ids + len, sizeof(s->ids) - len, "%s%s", len ? " " : "",
                 order->order_id);
    }
    assert_int_equal(order->status, LAPSE_ORDER_PENDING);
    if (s->cancel_in != NULL) {
        lapse_cancel_item_t item = {.order_id = order->order_id};
        lapse_error_t err;
        assert_int_equal(
            lapse_store_cancel_batch(s->cancel_in, &item, 1, order->deadline_ms, &err),
            LAPSE_OK);
        assert_int_equal(item.outcome, LAPSE_CANCEL_DONE);
    }
    s->n++;
    return s->stop_after > 0 && s->n == s->stop_after;
}

static void walk(lapse_store_t *store, const lapse_pending_filter_t *filter, seen_t *s) {
    lapse_error_t err;
    assert_int_equal(lapse_store_pending(store, filter, collect, s, &err), LAPSE_OK);
    assert_false(s->out_of_order);
}

static void seen_clear(seen_t *s) {
    lapse_order_clear(&s->first);
}

static void test_filter_defaults(void **state) {
    (void)state;
    lapse_pending_filter_t filter;
    memset(&filter, 0x5a, sizeof(filter));
    lapse_pending_filter_init(&filter);
    assert_true(filter.due_before_ms == INT64_MAX);
    assert_true(filter.created_before_ms == INT64_MAX);
    assert_false(filter.only_unscheduled);
    assert_false(filter.with_holds);
    assert_int_equal(filter.limit, 0);
    assert_null(filter.after_order_id);
    lapse_pending_filter_init(NULL); /* accepted */
}

static void test_pending_rejects_null_arguments(void **state) {
    fixture_t *f = *state;
    lapse_error_t err;
    assert_int_equal(lapse_store_pending(NULL, NULL, collect, NULL, &err),
                     LAPSE_ERR_INVALID);
    assert_int_equal(lapse_store_pending(f->store, NULL, NULL, NULL, &err),
                     LAPSE_ERR_INVALID);
}

static void test_pending_by_deadline_then_order_id(void **state) {
    fixture_t *f = *state;
    insert(f->store, "late", T0 + 3000);
    insert(f->store, "tie-b", T0 + 2000);
    insert(f->store, "first", T0 + 1000);
    insert(f->store, "tie-a", T0 + 2000);
    /* Paid in its window: on PostgreSQL the window must still be open by the server's
     * clock. */
    insert(f->store, "paid",
           f->sf.backend == SF_PG ? T0 + 2 * 60 * 60 * 1000 : T0 + 1500);
    insert(f->store, "gone", T0 + 500);
    lapse_error_t err;
    assert_int_equal(lapse_store_pay(f->store, "paid", T0, &err), LAPSE_OK);
    lapse_cancel_item_t item = {.order_id = "gone"};
    assert_int_equal(lapse_store_cancel_batch(f->store, &item, 1, T0 + 600, &err),
                     LAPSE_OK);

    seen_t s = {0};
    walk(f->store, NULL, &s);
    assert_string_equal(s.ids, "first tie-a tie-b late");
    assert_int_equal(s.first.deadline_ms, T0 + 1000);
    assert_int_equal(s.first.created_at_ms, T0);
    assert_false(s.first.scheduled);
    seen_clear(&s);
}

static void test_pending_empty_store_calls_nothing(void **state) {
    fixture_t *f = *state;
    seen_t s = {0};
    walk(f->store, NULL, &s);
    assert_int_equal(s.n, 0);
}

static void test_pending_due_before_is_strict(void **state) {
    fixture_t *f = *state;
    insert(f->store, "a", T0 + 1000);
    insert(f->store, "b", T0 + 2000);
    insert(f->store, "c", T0 + 2001);
    lapse_pending_filter_t filter;
    lapse_pending_filter_init(&filter);
    filter.due_before_ms = T0 + 2000;
    seen_t s = {0};
    walk(f->store, &filter, &s);
    assert_string_equal(s.ids, "a");
    seen_clear(&s);

    filter.due_before_ms = T0 + 2001;
    seen_t t = {0};
    walk(f->store, &filter, &t);
    assert_string_equal(t.ids, "a b");
    seen_clear(&t);
}

static void test_pending_only_unscheduled_created_before(void **state) {
    fixture_t *f = *state;
    insert_full(f->store, "old-sched", T0 + 1000, T0 - 60000, NULL, 0);
    insert_full(f->store, "old", T0 + 2000, T0 - 60000, NULL, 0);
    insert_full(f->store, "fresh", T0 + 3000, T0 - 1000, NULL, 0);
    insert_full(f->store, "old-late", T0 + 9000, T0 - 60000, NULL, 0);
    mark_scheduled(f->store, "old-sched");

    lapse_pending_filter_t filter;
    lapse_pending_filter_init(&filter);
    filter.only_unscheduled = true;
    seen_t s = {0};
    walk(f->store, &filter, &s);
    assert_string_equal(s.ids, "old fresh old-late");
    seen_clear(&s);

    /* In flight: created within the last 30 s, left alone. */
    filter.created_before_ms = T0 - 30000;
    seen_t t = {0};
    walk(f->store, &filter, &t);
    assert_string_equal(t.ids, "old old-late");
    seen_clear(&t);

    /* All three filters at once, and created_before alone. */
    filter.due_before_ms = T0 + 5000;
    seen_t u = {0};
    walk(f->store, &filter, &u);
    assert_string_equal(u.ids, "old");
    seen_clear(&u);
    lapse_pending_filter_init(&filter);
    filter.created_before_ms = T0 - 30000;
    seen_t v = {0};
    walk(f->store, &filter, &v);
    assert_string_equal(v.ids, "old-sched old old-late");
    seen_clear(&v);
}

static void test_pending_holds_only_when_asked(void **state) {
    fixture_t *f = *state;
    const char *holds[] = {"seat-2", "seat-1"};
    insert_full(f->store, "h", T0 + 1000, T0, holds, 2);
    seen_t s = {0};
    walk(f->store, NULL, &s);
    assert_int_equal(s.first.n_holds, 0);
    seen_clear(&s);

    lapse_pending_filter_t filter;
    lapse_pending_filter_init(&filter);
    filter.with_holds = true;
    seen_t t = {0};
    walk(f->store, &filter, &t);
    assert_int_equal(t.first.n_holds, 2);
    assert_string_equal(t.first.holds[0], "seat-1");
    assert_string_equal(t.first.holds[1], "seat-2");
    seen_clear(&t);
}

/* Enough orders for several pages, many sharing a deadline, so that pages break inside
 * runs of equal deadlines and the order id decides. */
#define MANY (3 * LAPSE__PENDING_PAGE + 7)

static void insert_many(lapse_store_t *store, size_t n) {
    lapse_new_order_t *orders = calloc(n, sizeof(*orders));
    lapse_status_t *results = calloc(n, sizeof(*results));
    char(*ids)[32] = calloc(n, sizeof(*ids));
    assert_non_null(orders);
    assert_non_null(results);
    assert_non_null(ids);
    for (size_t i = 0; i < n; i++) {
        /* Inserted in an order unlike the deadline order. */
        size_t k = (i * 7919) % n;
        snprintf(ids[i], sizeof(ids[i]), "m-%04zu", k);
        orders[i] = (lapse_new_order_t){.order_id = ids[i],
                                        .deadline_ms = T0 + (int64_t)(k % 50) * 1000,
                                        .created_at_ms = T0};
    }
    lapse_error_t err;
    assert_int_equal(lapse_store_insert_orders(store, orders, n, results, &err),
                     LAPSE_OK);
    free(ids);
    free(results);
    free(orders);
}

static void test_pending_pages_past_page_size(void **state) {
    fixture_t *f = *state;
    insert_many(f->store, MANY);
    seen_t s = {0};
    walk(f->store, NULL, &s); /* checks strictly increasing (deadline, id): no repeats */
    assert_int_equal(s.n, MANY);
    seen_clear(&s);

    /* A limit inside a page, at a page boundary, and beyond the orders there are. */
    const size_t limits[] = {1, 300, LAPSE__PENDING_PAGE, 2 * LAPSE__PENDING_PAGE,
                             MANY + 10};
    for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++) {
        lapse_pending_filter_t filter;
        lapse_pending_filter_init(&filter);
        filter.limit = limits[i];
        seen_t t = {0};
        walk(f->store, &filter, &t);
        assert_int_equal(t.n, limits[i] < MANY ? limits[i] : MANY);
        seen_clear(&t);
    }
}

static void test_pending_cursor_resumes_after_last_seen(void **state) {
    fixture_t *f = *state;
    insert_many(f->store, MANY);
    seen_t first = {.stop_after = 300};
    walk(f->store, NULL, &first);
    assert_int_equal(first.n, 300);

    lapse_pending_filter_t filter;
    lapse_pending_filter_init(&filter);
    filter.after_deadline_ms = first.last_deadline;
    filter.after_order_id = first.last_id;
    seen_t rest = {0};
    walk(f->store, &filter, &rest);
    assert_int_equal(first.n + rest.n, MANY);
    assert_true(rest.first.deadline_ms > first.last_deadline ||
                (rest.first.deadline_ms == first.last_deadline &&
                 strcmp(rest.first.order_id, first.last_id) > 0));
    seen_clear(&first);
    seen_clear(&rest);

    /* A cursor id that is too long for an order id is refused. */
    char long_id[LAPSE_ORDER_ID_MAX + 2];
    memset(long_id, 'x', sizeof(long_id) - 1);
    long_id[sizeof(long_id) - 1] = '\0';
    filter.after_order_id = long_id;
    lapse_error_t err;
    assert_int_equal(lapse_store_pending(f->store, &filter, collect, &rest, &err),
                     LAPSE_ERR_INVALID);
}

static void test_pending_stops_when_callback_says_so(void **state) {
    fixture_t *f = *state;
    insert_many(f->store, MANY);
    seen_t s = {.stop_after = LAPSE__PENDING_PAGE + 3};
    walk(f->store, NULL, &s);
    assert_int_equal(s.n, LAPSE__PENDING_PAGE + 3);
    seen_clear(&s);
}

/* The callback cancels every order it is shown, through the same handle, across pages:
 * each is seen once and the walk still reaches the end. */
static void test_pending_callback_may_write_through_the_same_handle(void **state) {
    fixture_t *f = *state;
    insert_many(f->store, MANY);
    seen_t s = {.cancel_in = f->store};
    walk(f->store, NULL, &s);
    assert_int_equal(s.n, MANY);
    seen_clear(&s);
    int64_t counts[3];
    lapse_error_t err;
    assert_int_equal(lapse_store_count(f->store, counts, &err), LAPSE_OK);
    assert_int_equal(counts[LAPSE_ORDER_PENDING], 0);
    assert_int_equal(counts[LAPSE_ORDER_CANCELLED], MANY);
}

static int64_t query_int(const fixture_t *f, const char *sql) {
    char err[1024];
    int64_t value = -1;
    sf_conn_t *c = sf_connect(&f->sf, false, err, sizeof(err));
    if (c == NULL || sf_query_int(c, sql, &value, err, sizeof(err)) != 0) {
        fail_msg("%s", err);
    }
    sf_close(c);
    return value;
}

/* The plan of a page read, as one string of its detail lines. */
static void query_plan(lapse_store_t *store, const char *path, stmt_id_t id, char *out,
                       size_t cap) {
    (void)store;
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    char sql[1024];
    snprintf(sql, sizeof(sql), "EXPLAIN QUERY PLAN %s", STMT_SQL[id]);
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    /* PRUNE_PICK's scratch list, which each store handle creates for itself. */
    assert_int_equal(sqlite3_exec(db,
                                  "CREATE TEMP TABLE prune_ids"
                                  " (order_id TEXT NOT NULL PRIMARY KEY)",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    out[0] = '\0';
    while (sqlite3_step(st) == SQLITE_ROW) {
        size_t len = strlen(out);
        snprintf(out + len, cap - len, "%s; ", (const char *)sqlite3_column_text(st, 3));
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
}

/* The plan of statement id holds every string of has and none of lacks (NULL-ended). */
static void expect_plan(const fixture_t *f, stmt_id_t id, const char *const *has,
                        const char *const *lacks) {
    char plan[1024];
    query_plan(f->store, f->path, id, plan, sizeof(plan));
    print_message("%s: %s\n", STMT_NAME[id], plan);
    for (; *has != NULL; has++) {
        if (strstr(plan, *has) == NULL) {
            fail_msg("%s: no \"%s\" in %s", STMT_NAME[id], *has, plan);
        }
    }
    for (; *lacks != NULL; lacks++) {
        if (strstr(plan, *lacks) != NULL) {
            fail_msg("%s: \"%s\" in %s", STMT_NAME[id], *lacks, plan);
        }
    }
}

#define STRINGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Each page is one index range, already in (deadline, id) order: no scan of paid and
 * cancelled orders, no sort. */
static void test_pending_pages_read_their_partial_index(void **state) {
    fixture_t *f = *state;
    SF_SKIP_ON_PG("EXPLAIN QUERY PLAN and SQLite's statements (test_pg_plans_use_indexes "
                  "checks PostgreSQL's)");
    insert_many(f->store, 50);
    expect_plan(f, ST_PENDING_PAGE, STRINGS("USING INDEX orders_pending_deadline"),
                STRINGS("TEMP B-TREE"));
    expect_plan(f, ST_UNSCHEDULED_PAGE,
                STRINGS("USING INDEX orders_unscheduled_deadline"),
                STRINGS("TEMP B-TREE"));
    /* Pruning walks settled orders by deadline, and reads the unpublished events once,
     * from the oldest unpublished seq on (events_published_below), not the whole
     * outbox. */
    expect_plan(f, ST_PRUNE_PICK,
                STRINGS("USING INDEX orders_settled_deadline", "LIST SUBQUERY",
                        "SEARCH events USING INTEGER PRIMARY KEY (rowid>?)"),
                STRINGS("SCAN events; ", "CORRELATED"));
    /* So do the outbox's backlog walk and its count, in seq order with no sort; and
     * the mark's move of that seq reads from where it was to the first unpublished
     * event, and the last seq by rowid. */
    static const stmt_id_t from_below[] = {ST_EVENTS_PENDING, ST_EVENTS_COUNT};
    for (size_t i = 0; i < sizeof from_below / sizeof from_below[0]; i++) {
        expect_plan(f, from_below[i],
                    STRINGS("SEARCH events USING INTEGER PRIMARY KEY (rowid>?)"),
                    STRINGS("SCAN events; ", "SCAN e; ", "TEMP B-TREE"));
    }
    expect_plan(f, ST_EVENTS_BELOW_ADVANCE,
                STRINGS("SEARCH e USING INTEGER PRIMARY KEY (rowid>?)"),
                STRINGS("SCAN events; ", "SCAN e; ", "TEMP B-TREE"));
    /* A round of seqs read and marked: the range from the larger of its first seq and
     * events_published_below's, by rowid. */
    static const stmt_id_t ranges[] = {ST_EVENTS_BY_RANGE, ST_EVENTS_PUBLISHED_RANGE};
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        expect_plan(
            f, ranges[i],
            STRINGS("SEARCH events USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)"),
            STRINGS("SCAN events; ", "TEMP B-TREE"));
    }
    expect_plan(f, ST_EVENTS_BELOW_JUMP,
                STRINGS("SEARCH events_published_below USING INTEGER PRIMARY KEY"),
                STRINGS("SCAN events; "));
    /* The outbox's prune: a range of seqs up to the first young event, no sort. */
    expect_plan(f, ST_PRUNE_EVENTS,
                STRINGS("SEARCH events USING INTEGER PRIMARY KEY (rowid<?)"),
                STRINGS("TEMP B-TREE"));
    /* A cancel batch: its ids are the outer loop, each order found by its id, never a
     * walk of the orders; then the due ones are changed by rowid. Their holds alike:
     * found by the order id (the primary key's first column). */
    expect_plan(f, ST_ORDERS_LOOK,
                STRINGS("SCAN batch VIRTUAL TABLE",
                        "SEARCH o USING INDEX sqlite_autoindex_orders_1"),
                STRINGS("SCAN o"));
    expect_plan(f, ST_ORDERS_CANCEL,
                STRINGS("SEARCH orders USING INTEGER PRIMARY KEY (rowid=?)"),
                STRINGS("SCAN orders"));
    expect_plan(f, ST_HOLDS_LOOK,
                STRINGS("SCAN batch VIRTUAL TABLE",
                        "SEARCH h USING INDEX sqlite_autoindex_holds_1 (order_id=?)"),
                STRINGS("SCAN h"));
    expect_plan(f, ST_HOLDS_RELEASE,
                STRINGS("SEARCH holds USING INTEGER PRIMARY KEY (rowid=?)"),
                STRINGS("SCAN holds"));
}

typedef struct plan_text {
    char text[8192];
} plan_text_t;

static void plan_row(void *opaque, int n_cols, const char *const *values) {
    plan_text_t *p = opaque;
    size_t len = strlen(p->text);
    if (n_cols > 0 && values[0] != NULL) {
        snprintf(p->text + len, sizeof(p->text) - len, "%s\n", values[0]);
    }
}

/* PostgreSQL's plan of statement text (store_pg_sql.h's, "@." being the schema),
 * prepared with the parameter types given ("" to let the server infer them) and
 * explained with the given arguments: the plan the server would run for them, the
 * planner free to choose (no enable_* setting is touched). name is for the output. */
static void pg_plan_text(sf_conn_t *c, const char *name, const char *text,
                         const char *types, const char *args, plan_text_t *out) {
    char sql[8192], err[1024];
    size_t n = 0;
    n += (size_t)snprintf(sql, sizeof(sql), "PREPARE lapse_plan %s AS ", types);
    for (const char *p = text; *p != '\0' && n + 16 < sizeof(sql); p++) {
        if (p[0] == '@' && p[1] == '.') {
            n += (size_t)snprintf(sql + n, sizeof(sql) - n, "lapse.");
            p++;
        } else {
            sql[n++] = *p;
        }
    }
    sql[n] = '\0';
    if (sf_exec(c, sql, err, sizeof(err)) != 0) {
        fail_msg("%s", err);
    }
    snprintf(sql, sizeof(sql), "EXPLAIN EXECUTE lapse_plan (%s)", args);
    out->text[0] = '\0';
    if (sf_query_rows(c, sql, plan_row, out, err, sizeof(err)) < 0) {
        fail_msg("%s", err);
    }
    if (sf_exec(c, "DEALLOCATE lapse_plan", err, sizeof(err)) != 0) {
        fail_msg("%s", err);
    }
    print_message("%s (%s):\n%s", name, args, out->text);
}

/* pg_plan_text of one of the backend's own statements. */
static void pg_plan(sf_conn_t *c, pg_stmt_id_t id, const char *args, plan_text_t *out) {
    pg_plan_text(c, PG_STMT_NAME[id], PG_STMT_SQL[id], "", args, out);
}

/* A connection to the PostgreSQL store of the fixture; on SQLite the test is skipped,
 * saying WHY. Closed with sf_close(). */
static sf_conn_t *pg_conn_or_skip(fixture_t *f, const char *why) {
    if (f->sf.backend != SF_PG) {
        print_message("skip on SQLite: %s\n", why);
        skip();
    }
    char err[1024];
    sf_conn_t *c = sf_connect(&f->sf, false, err, sizeof(err));
    if (c == NULL) {
        fail_msg("%s", err);
    }
    return c;
}

/* The hot statements of the PostgreSQL backend read through their indexes on a table of
 * realistic size (20,000 orders, most of them settled, as a store that has run for a
 * while holds, and analyzed), not by a scan of every order or event. */
static void test_pg_plans_use_indexes(void **state) {
    fixture_t *f = *state;
    sf_conn_t *c = pg_conn_or_skip(f, "PostgreSQL's plans (SQLite's: "
                                      "test_pending_pages_read_their_partial_index)");
    char err[1024];
    /* 20,000 orders: 1 in 20 pending (half of those never scheduled), the rest paid or
     * cancelled; an event for each cancelled one, all but 1 in 50 published. */
    static const char fill[] =
        "INSERT INTO orders (order_id, status, deadline_ms, created_at_ms, paid_at_ms,"
        " cancelled_at_ms, scheduled)"
        " SELECT 'p-' || lpad(i::text, 6, '0'),"
        " CASE WHEN i % 20 = 0 THEN 'pending' WHEN i % 2 = 0 THEN 'paid'"
        " ELSE 'cancelled' END,"
        " 1800000000000 + i * 1000, 1800000000000 - 3600000 + i * 1000,"
        " CASE WHEN i % 20 <> 0 AND i % 2 = 0 THEN 1800000000000 + i * 1000 - 1 END,"
        " CASE WHEN i % 2 = 1 THEN 1800000000000 + i * 1000 END,"
        " CASE WHEN i % 40 = 0 THEN 0 ELSE 1 END"
        " FROM generate_series(1, 20000) AS i;"
        "INSERT INTO holds (order_id, resource)"
        " SELECT order_id, 'seat-' || order_id FROM orders;"
        "INSERT INTO events (event_id, order_id, body, created_at_ms, published_at_ms)"
        " SELECT 'order.cancelled:' || order_id, order_id, '{}', cancelled_at_ms,"
        " CASE WHEN right(order_id, 2) <> '01' THEN cancelled_at_ms + 5 END"
        " FROM orders WHERE status = 'cancelled';"
        "ANALYZE orders; ANALYZE holds; ANALYZE events";
    if (sf_exec(c, fill, err, sizeof(err)) != 0) {
        fail_msg("%s", err);
    }
    int64_t n = -1;
    assert_int_equal(sf_query_int(c, "SELECT count(*) FROM orders", &n, err, sizeof(err)),
                     0);
    assert_int_equal(n, 20000);

    /* A page of the pending walk from the start, and one from the middle. */
    plan_text_t plan;
    static const char *const page_args[] = {
        "-9223372036854775808, '', 9223372036854775807, 9223372036854775807, 257, false",
        "1800010000000, 'p-010000', 9223372036854775807, 9223372036854775807, 257, true",
    };
    for (size_t i = 0; i < sizeof(page_args) / sizeof(page_args[0]); i++) {
        pg_plan(c, PS_PENDING_PAGE, page_args[i], &plan);
        assert_non_null(strstr(plan.text, "Index Scan using orders_pending_deadline"));
        assert_null(strstr(plan.text, "Seq Scan on orders"));
        assert_null(strstr(plan.text, "Sort"));
        pg_plan(c, PS_UNSCHEDULED_PAGE, page_args[i], &plan);
        assert_non_null(
            strstr(plan.text, "Index Scan using orders_unscheduled_deadline"));
        assert_null(strstr(plan.text, "Seq Scan on orders"));
        assert_null(strstr(plan.text, "Sort"));
    }
    /* The sweep's claim on unscheduled orders walks the same index. */
    pg_plan(c, PS_UNSCHEDULED_CLAIM,
            "-9223372036854775808, '', 1800020000000, 1800020000000, 257, true, 60000",
            &plan);
    assert_non_null(strstr(plan.text, "orders_unscheduled_deadline"));
    assert_null(strstr(plan.text, "Seq Scan on orders"));
    /* The outbox relay's read of unpublished events: the claim's CTE finds them through
     * the partial index. (Joining the claimed rows back for the UPDATE is the planner's
     * choice by size: a hash join over all events on 10,000, the primary key on many
     * more.) */
    pg_plan(c, PS_EVENTS_CLAIM, "100, 10000", &plan);
    char *cte = strstr(plan.text, "CTE c");
    assert_non_null(cte);
    char *cte_end = strstr(cte, "\n  ->  ");
    if (cte_end != NULL) {
        *cte_end = '\0';
    }
    assert_non_null(strstr(cte, "Index Scan using events_unpublished"));
    assert_null(strstr(cte, "Seq Scan"));
    /* One order by id, its holds with it. */
    pg_plan(c, PS_ORDER_GET, "'p-012345'", &plan);
    assert_non_null(strstr(plan.text, "Index Scan using orders_pkey"));
    assert_null(strstr(plan.text, "Seq Scan"));
    /* A consumer's batch, locked by id. */
    pg_plan(c, PS_CANCEL_LOCK, "'{p-000020,p-000040,p-000060}'", &plan);
    assert_non_null(strstr(plan.text, "orders_pkey"));
    assert_null(strstr(plan.text, "Seq Scan on orders"));
    sf_close(c);
}

/* A consumer draining a backlog: orders fell due after the table was last analyzed, so
 * the statistics say hardly any pending order is due (as they do of any store analyzed
 * in steady state). The cancel of a batch still finds its orders by id; reading
 * orders_pending_deadline instead visited every due pending order once per batch,
 * quadratic in the backlog. */
static void test_pg_cancel_of_a_backlog_goes_by_key(void **state) {
    fixture_t *f = *state;
    sf_conn_t *c = pg_conn_or_skip(f, "PostgreSQL's plan (SQLite's statement keeps its "
                                      "guards off the indexes with unary +)");
    char err[1024];
    /* 20,000 pending orders due in the future, analyzed; then 5,000 due ones, which
     * autovacuum would soon analyze (and the old plan would pass): not in the test. */
    static const char fill[] =
        "ALTER TABLE orders SET (autovacuum_enabled = false);"
        "INSERT INTO orders (order_id, status, deadline_ms, created_at_ms, scheduled)"
        " SELECT 'f-' || lpad(i::text, 6, '0'), 'pending', 1800000000000 + i * 1000,"
        " 1790000000000, 1 FROM generate_series(1, 20000) AS i;"
        "ANALYZE orders;"
        "INSERT INTO orders (order_id, status, deadline_ms, created_at_ms, scheduled)"
        " SELECT 'b-' || lpad(i::text, 6, '0'), 'pending', 1700000000000 + i,"
        " 1690000000000, 1 FROM generate_series(1, 5000) AS i";
    if (sf_exec(c, fill, err, sizeof(err)) != 0) {
        fail_msg("%s", err);
    }
    /* A batch of 20 of the backlog, cancelled at 1750000000000. (With a batch of more
     * than about one order in a hundred of the table, a scan of the table is the
     * planner's cheaper choice, and a bounded one; the pending index is neither.) */
    char args[400] = "'{";
    size_t len = strlen(args);
    for (int i = 1; i <= 20; i++) {
        len += (size_t)snprintf(args + len, sizeof(args) - len, "%sb-%06d",
                                i > 1 ? "," : "", i * 7);
    }
    snprintf(args + len, sizeof(args) - len, "}', 1750000000000");
    plan_text_t plan;
    pg_plan(c, PS_ORDERS_CANCEL, args, &plan);
    assert_non_null(strstr(plan.text, "orders_pkey"));
    assert_null(strstr(plan.text, "orders_pending_deadline"));
    assert_null(strstr(plan.text, "Seq Scan on orders"));
    sf_close(c);
}

/* pg_plan_text of one of the backend's statements as the orders map m makes it (the
 * statement's own parameters own_types and own_args, then the map's values: pending
 * 'unpaid', paid 'paid', cancelled 'cancelled', no window, no cursor). */
static void pg_map_plan(sf_conn_t *c, const lapse__pg_map_t *m, pg_stmt_id_t id,
                        const char *own_types, const char *own_args, plan_text_t *out) {
    int n_own = 0; /* as store_pg.c counts them */
    for (const char *p = strchr(PG_STMT_SQL[id], '$'); p != NULL;
         p = strchr(p + 1, '$')) {
        int k = atoi(p + 1);
        n_own = k > n_own ? k : n_own;
    }
    char *text = lapse__pg_map_expand(m, PG_MAP_SQL[id], n_own);
    assert_non_null(text);
    char types[256], args[4096], name[64];
    snprintf(types, sizeof(types), "(%s, text[], text, text, bigint, timestamptz)",
             own_types);
    snprintf(args, sizeof(args), "%s, '{unpaid}', 'paid', 'cancelled', 0, NULL",
             own_args);
    snprintf(name, sizeof(name), "%s (orders map)", PG_STMT_NAME[id]);
    pg_plan_text(c, name, text, types, args, out);
    free(text);
}

/* The orders map's statements over a set of the shop's orders find them by the shop's
 * key, with an index on the shop's status column and statistics that say hardly any
 * order is pending (a shop of 30,000 paid orders analyzed, then a backlog of 10,000
 * unpaid ones past their deadline, as after an outage): reading the status index
 * instead walked every pending order once per batch (dc4a94d, 06b6e50), and the prune,
 * which compared the id as text, read them all once per round. The prune of lapse's
 * bookkeeping (a row for each of the 40,000 orders, and three that are no id of an
 * integer table) then keeps exactly the rows of the pending orders. The key is an int4,
 * so the statements compare across integer types too. */
static void test_pg_map_statements_go_by_the_shops_key(void **state) {
    fixture_t *f = *state;
    sf_conn_t *c = pg_conn_or_skip(f, "the orders map (PostgreSQL only)");
    char err[1024];
    static const char fill[] =
        "CREATE SCHEMA shop;"
        "CREATE TABLE shop.orders (id integer PRIMARY KEY, status text NOT NULL,"
        " pay_deadline timestamptz NOT NULL) WITH (autovacuum_enabled = false);"
        "CREATE INDEX ON shop.orders (status);"
        "CREATE INDEX ON shop.orders (pay_deadline);"
        "INSERT INTO shop.orders SELECT i, 'paid', now() - interval '1 day'"
        " FROM generate_series(1, 30000) AS i;"
        "ANALYZE shop.orders;"
        "INSERT INTO shop.orders SELECT i, 'unpaid', now() - interval '1 day'"
        " FROM generate_series(30001, 40000) AS i;"
        "ALTER TABLE lapse.scheduled SET (autovacuum_enabled = false);"
        "INSERT INTO lapse.scheduled (order_id, deadline_ms, created_at_ms)"
        " SELECT i::text, 1700000000000 + i, 1690000000000"
        " FROM generate_series(1, 40000) AS i;"
        "INSERT INTO lapse.scheduled (order_id, deadline_ms, created_at_ms) VALUES"
        " ('x-8', 1700000000000, 1690000000000), ('008', 1700000000000, 1690000000000),"
        " ('99999999999999999999', 1700000000000, 1690000000000);"
        "ANALYZE lapse.scheduled";
    if (sf_exec(c, fill, err, sizeof(err)) != 0) {
        fail_msg("%s", err);
    }
    char map_path[] = "/tmp/lapse-test-map-XXXXXX";
    int fd = mkstemp(map_path);
    assert_true(fd >= 0);
    static const char map_json[] =
        "{\"table\": \"shop.orders\", \"id\": \"id\", \"status\": \"status\","
        " \"pending\": [\"unpaid\"], \"paid\": \"paid\", \"cancelled\": \"cancelled\","
        " \"deadline\": \"pay_deadline\"}";
    assert_int_equal(write(fd, map_json, strlen(map_json)), (ssize_t)strlen(map_json));
    close(fd);

    /* The plans, the statements as the map makes them. */
    lapse_error_t lerr;
    assert_int_equal(lapse__pq_load(&lerr), LAPSE_OK);
    const char *const keys[] = {"dbname", NULL};
    const char *const values[] = {f->sf.conninfo, NULL};
    PGconn *conn = lapse__pq.PQconnectdbParams(keys, values, 1);
    assert_int_equal(lapse__pq.PQstatus(conn), CONNECTION_OK);
    lapse_status_t rc;
    lapse__pg_map_t *m = lapse__pg_map_open(conn, map_path, &rc, &lerr);
    if (m == NULL) {
        fail_msg("%s", lerr.text);
    }
    /* A batch of 20 of the backlog: its ids, and (for the publisher's check) their
     * deadlines and creation times. */
    char ids[400] = "'{", nums[400] = "'{";
    size_t len = strlen(ids), nlen = strlen(nums);
    for (int i = 1; i <= 20; i++) {
        len += (size_t)snprintf(ids + len, sizeof(ids) - len, "%s%d", i > 1 ? "," : "",
                                30000 + i * 7);
        nlen += (size_t)snprintf(nums + nlen, sizeof(nums) - nlen, "%s%d",
                                 i > 1 ? "," : "", 1700000000 + i);
    }
    snprintf(ids + len, sizeof(ids) - len, "}'");
    snprintf(nums + nlen, sizeof(nums) - nlen, "}'");
    char args[1200];
    plan_text_t plan;
    snprintf(args, sizeof(args), "%s, 1800000000000", ids);
    pg_map_plan(c, m, PS_ORDERS_CANCEL, "text[], bigint", args, &plan);
    assert_non_null(strstr(plan.text, "using orders_pkey on orders o"));
    assert_null(strstr(plan.text, "orders_status_idx"));
    assert_null(strstr(plan.text, "Seq Scan on orders o"));
    snprintf(args, sizeof(args), "%s, %s, %s", ids, nums, nums);
    pg_map_plan(c, m, PS_ORDERS_INSERT, "text[], bigint[], bigint[]", args, &plan);
    assert_non_null(strstr(plan.text, "using orders_pkey on orders o"));
    assert_null(strstr(plan.text, "orders_status_idx"));
    assert_null(strstr(plan.text, "Seq Scan on orders o"));
    pg_map_plan(c, m, PS_PRUNE_ORDERS, "bigint, bigint", "1800000000000, 1000", &plan);
    assert_non_null(strstr(plan.text, "using orders_pkey on orders o"));
    assert_null(strstr(plan.text, "orders_status_idx"));
    assert_null(strstr(plan.text, "Seq Scan on orders o"));
    lapse__pg_map_free(m);
    lapse__pq.PQfinish(conn);

    /* The prune itself, in rounds of 1000, through a store on the map. */
    lapse_store_options_t opts;
    lapse_store_options_init(&opts);
    opts.orders_map = map_path;
    lapse_store_t *store = lapse_store_open_opts(f->uri, &opts, &rc, &lerr);
    if (store == NULL) {
        fail_msg("%s", lerr.text);
    }
    int64_t pruned = 0, orders = 0, events = 0;
    int rounds = 0;
    do {
        assert_int_equal(lapse_store_prune(store, INT64_C(1800000000000), 1000, &orders,
                                           &events, &lerr),
                         LAPSE_OK);
        pruned += orders;
        rounds++;
    } while (orders > 0 && rounds < 100);
    lapse_store_close(store);
    unlink(map_path);
    assert_int_equal(pruned, 30003);
    int64_t n = -1;
    assert_int_equal(
        sf_query_int(c, "SELECT count(*) FROM lapse.scheduled", &n, err, sizeof(err)), 0);
    assert_int_equal(n, 10000);
    assert_int_equal(
        sf_query_int(c,
                     "SELECT count(*) FROM lapse.scheduled s JOIN shop.orders"
                     " o ON o.id::text = s.order_id AND o.status = 'unpaid'",
                     &n, err, sizeof(err)),
        0);
    assert_int_equal(n, 10000);
    sf_close(c);
}

/* A file written by schema version 1 (before the walk's indexes) is upgraded in place
 * when opened, its orders kept. */
static void test_open_upgrades_a_version_1_file(void **state) {
    fixture_t *f = *state;
    SF_SKIP_ON_PG("a file of SQLite schema version 1");
    sqlite3 *db = NULL;
    assert_int_equal(
        sqlite3_open_v2(f->path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL),
        SQLITE_OK);
    assert_int_equal(
        sqlite3_exec(
            db,
            "CREATE TABLE orders ("
            " order_id TEXT NOT NULL PRIMARY KEY,"
            " status TEXT NOT NULL CHECK (status IN ('pending', 'paid', "
            "'cancelled')),"
            " deadline_ms INTEGER NOT NULL,"
            " created_at_ms INTEGER NOT NULL,"
            " paid_at_ms INTEGER,"
            " cancelled_at_ms INTEGER,"
            " scheduled INTEGER NOT NULL DEFAULT 0 CHECK (scheduled IN (0, 1)));"
            "CREATE INDEX orders_status_deadline ON orders (status, deadline_ms);"
            "CREATE TABLE holds ("
            " order_id TEXT NOT NULL REFERENCES orders (order_id),"
            " resource TEXT NOT NULL,"
            " released_at_ms INTEGER,"
            " PRIMARY KEY (order_id, resource));"
            "CREATE TABLE events ("
            " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
            " event_id TEXT NOT NULL UNIQUE,"
            " order_id TEXT NOT NULL,"
            " body TEXT NOT NULL,"
            " created_at_ms INTEGER NOT NULL,"
            " published_at_ms INTEGER);"
            "CREATE INDEX events_unpublished ON events (seq)"
            " WHERE published_at_ms IS NULL;"
            "INSERT INTO orders (order_id, status, deadline_ms, created_at_ms)"
            " VALUES ('v1-b', 'pending', 1800000002000, 1800000000000),"
            " ('v1-a', 'pending', 1800000001000, 1800000000000);"
            "INSERT INTO orders (order_id, status, deadline_ms, created_at_ms,"
            " paid_at_ms, cancelled_at_ms, scheduled)"
            " VALUES ('v1-paid', 'paid', 1700000001000, 1700000000000, 1700000000500,"
            " NULL, 1),"
            " ('v1-gone', 'cancelled', 1700000001000, 1700000000000, NULL,"
            " 1700000001200, 1);"
            "INSERT INTO holds (order_id, resource) VALUES ('v1-a', 'seat-1'),"
            " ('v1-a', 'seat-2'), ('v1-paid', 'seat-3');"
            /* v1-gone's event, published; seqs up to 9 were handed out (8 and 9 to
             * events pruned since). */
            "INSERT INTO events (seq, event_id, order_id, body, created_at_ms,"
            " published_at_ms) VALUES (7, 'order.cancelled:v1-gone', 'v1-gone', '{}',"
            " 1700000001200, 1700000001300);"
            "UPDATE sqlite_sequence SET seq = 9 WHERE name = 'events';"
            "PRAGMA user_version = 1;",
            NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3_close(db);

    lapse_status_t rc;
    lapse_error_t err;
    f->store = lapse_store_open(f->uri, &rc, &err);
    assert_non_null(f->store);
    assert_int_equal(query_int(f, "PRAGMA user_version"), SCHEMA_VERSION);
    assert_int_equal(query_int(f, "SELECT count(*) FROM sqlite_master WHERE name IN"
                                  " ('orders_pending_deadline',"
                                  " 'orders_unscheduled_deadline')"),
                     2);
    /* Version 4 rebuilt orders: every row and column kept, the holds still theirs, the
     * status CHECK without an IN list and still refusing what it refused, the index by
     * status gone. */
    assert_int_equal(query_int(f, "SELECT count(*) FROM orders"), 4);
    assert_int_equal(query_int(f, "SELECT paid_at_ms + scheduled FROM orders"
                                  " WHERE order_id = 'v1-paid' AND status = 'paid'"),
                     1700000000501);
    assert_int_equal(query_int(f, "SELECT cancelled_at_ms FROM orders"
                                  " WHERE order_id = 'v1-gone' AND status = 'cancelled'"),
                     1700000001200);
    assert_int_equal(query_int(f, "SELECT count(*) FROM holds h JOIN orders o"
                                  " USING (order_id) WHERE h.resource LIKE 'seat-%'"),
                     3);
    assert_int_equal(query_int(f, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
    assert_int_equal(query_int(f, "SELECT count(*) FROM sqlite_master WHERE name ="
                                  " 'orders_status_deadline' OR name = 'orders_v4'"),
                     0);
    assert_int_equal(query_int(f, "SELECT count(*) FROM sqlite_master WHERE name ="
                                  " 'orders' AND sql LIKE '%status IN%'"),
                     0);
    assert_int_equal(query_int(f, "SELECT count(*) FROM sqlite_master WHERE name ="
                                  " 'orders_settled_deadline'"),
                     1);
    /* Version 5 rebuilt events: its row and AUTOINCREMENT's mark kept, no UNIQUE, no
     * index by publish time. */
    assert_int_equal(query_int(f, "SELECT published_at_ms - seq FROM events WHERE"
                                  " event_id = 'order.cancelled:v1-gone'"),
                     1700000001293);
    assert_int_equal(query_int(f, "SELECT count(*) FROM events"), 1);
    assert_int_equal(
        query_int(f, "SELECT seq FROM sqlite_sequence WHERE name = 'events'"), 9);
    /* Its one event is published: everything up to it is. */
    assert_int_equal(query_int(f, "SELECT seq FROM events_published_below"), 8);
    assert_int_equal(
        query_int(f, "SELECT count(*) FROM sqlite_master WHERE"
                     " tbl_name = 'events_v5' OR name LIKE 'sqlite_autoindex_events%'"
                     " OR (name = 'events' AND sql LIKE '%UNIQUE%')"
                     " OR name = 'events_published'"),
        0);
    assert_int_equal(sqlite3_open_v2(f->path, &db, SQLITE_OPEN_READWRITE, NULL),
                     SQLITE_OK);
    assert_int_equal(
        sqlite3_exec(db, "UPDATE orders SET status = 'lost' WHERE order_id = 'v1-b'",
                     NULL, NULL, NULL),
        SQLITE_CONSTRAINT);
    assert_int_equal(sqlite3_extended_errcode(db), SQLITE_CONSTRAINT_CHECK);
    sqlite3_close(db);

    /* And the store works on it: the walk, and a cancel that releases the holds. */
    seen_t s = {0};
    walk(f->store, NULL, &s);
    assert_string_equal(s.ids, "v1-a v1-b");
    seen_clear(&s);
    lapse_cancel_item_t item = {.order_id = "v1-a"};
    assert_int_equal(lapse_store_cancel_batch(f->store, &item, 1, 1800000001000, &err),
                     LAPSE_OK);
    assert_int_equal(item.outcome, LAPSE_CANCEL_DONE);
    assert_int_equal(query_int(f, "SELECT count(*) FROM holds WHERE order_id = 'v1-a'"
                                  " AND released_at_ms = 1800000001000"),
                     2);
    /* Its event takes the seq after the mark, not after the highest row. */
    assert_int_equal(item.event_seq, 10);
    (void)SCHEMA_SQL;
}

/* A file made by this lapse, three orders in it, rewritten by sql with plain SQLite as
 * an older lapse would have left it; the store is closed. */
static void rewrite_file(fixture_t *f, const char *sql) {
    lapse_status_t rc;
    lapse_error_t err;
    f->store = lapse_store_open(f->uri, &rc, &err);
    assert_non_null(f->store);
    insert_many(f->store, 3);
    lapse_store_close(f->store);
    f->store = NULL;
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(f->path, &db, SQLITE_OPEN_READWRITE, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
}

/* A file of schema version 4 (the newest before events lost UNIQUE (event_id)) whose
 * outbox was pruned empty: the rebuild keeps AUTOINCREMENT's mark from sqlite_sequence
 * alone, so no seq comes back, and the store works on the new table. */
static void test_open_upgrades_a_version_4_file(void **state) {
    fixture_t *f = *state;
    SF_SKIP_ON_PG("a file of SQLite schema version 4");
    rewrite_file(f, "DROP TABLE events;"
                    "DROP TABLE events_published_below;"
                    "CREATE TABLE events ("
                    " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
                    " event_id TEXT NOT NULL UNIQUE,"
                    " order_id TEXT NOT NULL,"
                    " body TEXT NOT NULL,"
                    " created_at_ms INTEGER NOT NULL,"
                    " published_at_ms INTEGER);"
                    "CREATE INDEX events_unpublished ON events (seq)"
                    " WHERE published_at_ms IS NULL;"
                    "CREATE INDEX events_published ON events"
                    " (published_at_ms) WHERE published_at_ms IS NOT NULL;"
                    "INSERT INTO sqlite_sequence (name, seq)"
                    " VALUES ('events', 41);"
                    "PRAGMA user_version = 4;");
    lapse_status_t rc;
    lapse_error_t err;

    f->store = lapse_store_open(f->uri, &rc, &err);
    assert_non_null(f->store);
    assert_int_equal(query_int(f, "PRAGMA user_version"), SCHEMA_VERSION);
    assert_int_equal(
        query_int(f, "SELECT seq FROM sqlite_sequence WHERE name = 'events'"), 41);
    assert_int_equal(query_int(f, "SELECT count(*) FROM sqlite_sequence"
                                  " WHERE name = 'events_v5'"),
                     0);
    assert_int_equal(query_int(f, "SELECT count(*) FROM sqlite_master WHERE name ="
                                  " 'events_unpublished'"),
                     0);
    assert_int_equal(query_int(f, "SELECT seq FROM events_published_below"), 1);
    assert_int_equal(query_int(f, "SELECT count(*) FROM sqlite_master WHERE"
                                  " name LIKE 'sqlite_autoindex_events%'"
                                  " OR name = 'events_published'"),
                     0);
    lapse_cancel_item_t items[] = {{.order_id = "m-0000"}, {.order_id = "m-0001"}};
    assert_int_equal(lapse_store_cancel_batch(f->store, items, 2, T0 + 3600000, &err),
                     LAPSE_OK);
    assert_int_equal(items[0].outcome, LAPSE_CANCEL_DONE);
    assert_int_equal(items[0].event_seq, 42);
    assert_int_equal(items[1].event_seq, 43);
    assert_int_equal(query_int(f, "SELECT count(*) FROM events WHERE published_at_ms"
                                  " IS NULL AND event_id LIKE 'order.cancelled:m-000%'"),
                     2);
}

typedef struct bodies {
    size_t n;
    char body[4][256];
} bodies_t;

static int keep_body(void *opaque, const lapse_event_t *event) {
    bodies_t *b = opaque;
    if (b->n < 4) {
        snprintf(b->body[b->n], sizeof(b->body[0]), "%s", event->body);
    }
    b->n++;
    return 0;
}

/* A file of schema version 5 (events without deadline_ms) with an event still in its
 * outbox: the column is added, that event is published with the body it was stored
 * with, and the next event of an order without holds is stored without its body and
 * read back whole. */
static void test_open_upgrades_a_version_5_file(void **state) {
    fixture_t *f = *state;
    SF_SKIP_ON_PG("a file of SQLite schema version 5");
    rewrite_file(f, "ALTER TABLE events DROP COLUMN deadline_ms;"
                    "DROP TABLE events_published_below;"
                    "INSERT INTO events (seq, event_id, order_id, body,"
                    " created_at_ms) VALUES (5, 'order.cancelled:old',"
                    " 'old', '{\"stored\":\"as written\"}', 1);"
                    "PRAGMA user_version = 5;");
    lapse_status_t rc;
    lapse_error_t err;

    f->store = lapse_store_open(f->uri, &rc, &err);
    assert_non_null(f->store);
    assert_int_equal(query_int(f, "PRAGMA user_version"), SCHEMA_VERSION);
    assert_int_equal(query_int(f, "SELECT count(*) FROM pragma_table_info('events')"
                                  " WHERE name = 'deadline_ms' AND cid = 6"),
                     1);
    assert_int_equal(query_int(f, "SELECT count(*) FROM events WHERE deadline_ms IS NULL"
                                  " AND body = '{\"stored\":\"as written\"}'"),
                     1);
    /* Its one event is unpublished: the seq of what is published below starts there. */
    assert_int_equal(query_int(f, "SELECT seq FROM events_published_below"), 5);
    lapse_cancel_item_t item = {.order_id = "m-0001"};
    assert_int_equal(lapse_store_cancel_batch(f->store, &item, 1, T0 + 3600000, &err),
                     LAPSE_OK);
    assert_int_equal(item.outcome, LAPSE_CANCEL_DONE);
    assert_int_equal(item.event_seq, 6);
    assert_int_equal(query_int(f, "SELECT deadline_ms FROM events WHERE seq = 6"
                                  " AND body = ''"),
                     T0 + 1000);
    bodies_t b = {0};
    assert_int_equal(
        lapse_store_events_pending(f->store, 10, NULL, 0, keep_body, &b, &err), LAPSE_OK);
    assert_int_equal(b.n, 2);
    assert_string_equal(b.body[0], "{\"stored\":\"as written\"}");
    assert_string_equal(b.body[1],
                        "{\"event\":\"order.cancelled\",\"order_id\":\"m-0001\","
                        "\"deadline\":\"2027-01-15T08:00:01.000Z\","
                        "\"cancelled_at\":\"2027-01-15T09:00:00.000Z\","
                        "\"holds\":[]}");
}

/* A file of schema version 6 (the partial index events_unpublished, no
 * events_published_below) whose outbox has events published out of order: the table
 * starts at its oldest unpublished event, the index is gone, and the walk, the count and
 * the marks go on from there. */
static int note_seq(void *opaque, const lapse_event_t *event) {
    int64_t *seqs = opaque;
    if (seqs[0] < 7) {
        seqs[1 + seqs[0]] = event->seq;
    }
    seqs[0]++;
    return 0;
}

static int64_t walk_seqs(fixture_t *f, int64_t *seqs, size_t cap) {
    assert_true(cap >= 8);
    memset(seqs, 0, cap * sizeof *seqs);
    lapse_error_t err;
    assert_int_equal(
        lapse_store_events_pending(f->store, 10, NULL, 0, note_seq, seqs, &err),
        LAPSE_OK);
    return seqs[0];
}

static void test_open_upgrades_a_version_6_file(void **state) {
    fixture_t *f = *state;
    SF_SKIP_ON_PG("a file of SQLite schema version 6");
    rewrite_file(f, "DROP TABLE events_published_below;"
                    "CREATE INDEX events_unpublished ON events (seq)"
                    " WHERE published_at_ms IS NULL;"
                    "INSERT INTO events (seq, event_id, order_id, body, created_at_ms,"
                    " published_at_ms, deadline_ms) VALUES"
                    " (5, 'order.cancelled:a', 'a', '', 1, 2, 1),"
                    " (6, 'order.cancelled:b', 'b', '', 1, NULL, 1),"
                    " (7, 'order.cancelled:c', 'c', '', 1, 2, 1),"
                    " (8, 'order.cancelled:d', 'd', '', 1, NULL, 1);"
                    "PRAGMA user_version = 6;");
    lapse_status_t rc;
    lapse_error_t err;

    f->store = lapse_store_open(f->uri, &rc, &err);
    assert_non_null(f->store);
    assert_int_equal(query_int(f, "PRAGMA user_version"), SCHEMA_VERSION);
    assert_int_equal(query_int(f, "SELECT count(*) FROM sqlite_master WHERE name ="
                                  " 'events_unpublished'"),
                     0);
    assert_int_equal(query_int(f, "SELECT seq FROM events_published_below"), 6);
    int64_t seqs[8];
    assert_int_equal(walk_seqs(f, seqs, 8), 2);
    assert_int_equal(seqs[1], 6);
    assert_int_equal(seqs[2], 8);
    int64_t backlog = -1;
    assert_int_equal(lapse_store_events_count(f->store, &backlog, &err), LAPSE_OK);
    assert_int_equal(backlog, 2);
    const int64_t six = 6, eight = 8;
    assert_int_equal(lapse_store_events_mark_published(f->store, &six, 1, T0, &err),
                     LAPSE_OK);
    assert_int_equal(query_int(f, "SELECT seq FROM events_published_below"), 8);
    assert_int_equal(lapse_store_events_mark_published(f->store, &eight, 1, T0, &err),
                     LAPSE_OK);
    assert_int_equal(query_int(f, "SELECT seq FROM events_published_below"), 9);
    assert_int_equal(walk_seqs(f, seqs, 8), 0);
    /* The next event comes after them and is found. */
    lapse_cancel_item_t item = {.order_id = "m-0001"};
    assert_int_equal(lapse_store_cancel_batch(f->store, &item, 1, T0 + 3600000, &err),
                     LAPSE_OK);
    assert_int_equal(item.outcome, LAPSE_CANCEL_DONE);
    assert_int_equal(item.event_seq, 9);
    assert_int_equal(walk_seqs(f, seqs, 8), 1);
    assert_int_equal(seqs[1], 9);
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_filter_defaults),
        T(test_pending_rejects_null_arguments),
        T(test_pending_by_deadline_then_order_id),
        T(test_pending_empty_store_calls_nothing),
        T(test_pending_due_before_is_strict),
        T(test_pending_only_unscheduled_created_before),
        T(test_pending_holds_only_when_asked),
        T(test_pending_pages_past_page_size),
        T(test_pending_cursor_resumes_after_last_seen),
        T(test_pending_stops_when_callback_says_so),
        T(test_pending_callback_may_write_through_the_same_handle),
        T(test_pending_pages_read_their_partial_index),
        T(test_pg_plans_use_indexes),
        T(test_pg_cancel_of_a_backlog_goes_by_key),
        T(test_pg_map_statements_go_by_the_shops_key),
        cmocka_unit_test_setup_teardown(test_open_upgrades_a_version_1_file, setup_dir,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_open_upgrades_a_version_4_file, setup_dir,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_open_upgrades_a_version_5_file, setup_dir,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_open_upgrades_a_version_6_file, setup_dir,
                                        teardown),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}

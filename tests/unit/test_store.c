/* SPDX-License-Identifier: MIT
 * The store on a temporary SQLite file, or a database of its own on the test cluster
 * (LAPSE_TEST_STORE=postgresql, see store_fixture.h): idempotency, compare-and-set,
 * outbox, races. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <sqlite3.h>

#include <lapse/store.h>

#include "store_fixture.h"

/* The clock that decides. On SQLite it is the caller's: the tests pass times around
 * T0 = 2027-01-15T08:00:00Z, when orders are created, and DEADLINE is half an hour later.
 * On PostgreSQL it is the server's and the time passed is ignored: there setup places T0
 * so that DEADLINE is a second behind the server's clock (an order with it is due), and
 * OPEN_DEADLINE an hour ahead of it, for the orders a test pays or expects refused as
 * early. On SQLite OPEN_DEADLINE is DEADLINE: its tests pass T0 (or DEADLINE - 1) to pay
 * and DEADLINE to cancel, so both hold there as they always did. */
static int64_t t0_ms = INT64_C(1800000000000);
static int64_t open_deadline_ms;
#define T0            t0_ms
#define DEADLINE      (T0 + 30 * 60 * 1000)
#define OPEN_DEADLINE open_deadline_ms

typedef struct fixture {
    sf_store_t sf;   /* the store: sf.uri; on SQLite sf.dir holds sf.path */
    const char *dir; /* SQLite: the directory of the store file */
    const char *path;
    const char *uri;
    lapse_store_t *store;
} fixture_t;

static int setup(void **state) {
    fixture_t *f = calloc(1, sizeof(*f));
    if (f == NULL || sf_create(&f->sf, "store", NULL, NULL) != 0) {
        free(f);
        return -1;
    }
    f->dir = f->sf.dir;
    f->path = f->sf.path;
    f->uri = f->sf.uri;
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
    open_deadline_ms = DEADLINE;
    int64_t now = 0;
    if (f->sf.backend == SF_PG) {
        if (lapse_store_now(f->store, &now, &err) != LAPSE_OK) {
            fprintf(stderr, "store clock: %s\n", err.text);
            return -1;
        }
        t0_ms = now - 1000 - 30 * 60 * 1000;
        open_deadline_ms = now + 60 * 60 * 1000;
    }
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture_t *f = *state;
    lapse_store_close(f->store);
    int rc = sf_drop(&f->sf);
    free(f);
    return rc;
}

/* Reads one integer with a connection of its own, as another process would. */
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

static void exec_sql(const fixture_t *f, const char *sql) {
    char err[1024];
    sf_conn_t *c = sf_connect(&f->sf, false, err, sizeof(err));
    if (c == NULL || sf_exec(c, sql, err, sizeof(err)) != 0) {
        fail_msg("%s", err);
    }
    sf_close(c);
}

/* The store's clock (lapse_store_now). */
static int64_t store_now(const fixture_t *f) {
    int64_t now = 0;
    lapse_error_t err;
    assert_int_equal(lapse_store_now(f->store, &now, &err), LAPSE_OK);
    return now;
}

/* A time the store recorded for a change made between before and after (store_now):
 * the time the caller passed on SQLite, the server's clock during the call on
 * PostgreSQL (read within a second, as lapse_store_now estimates it). */
static void assert_recorded_time(const fixture_t *f, int64_t value, int64_t passed,
                                 int64_t before, int64_t after) {
    if (f->sf.backend == SF_SQLITE) {
        assert_int_equal(value, passed);
    } else {
        assert_in_range(value, before - 1000, after + 1000);
    }
}

/* PostgreSQL claims the outbox events it hands out (and a cancel claims its own) for
 * LAPSE_STORE_EVENT_CLAIM_MS; the walks of these tests come back sooner, so the claims
 * are dropped first, as their expiry would. SQLite claims nothing. */
static void release_claims(const fixture_t *f) {
    if (f->sf.backend == SF_PG) {
        exec_sql(f, "UPDATE events SET claimed_until_ms = NULL");
    }
}

/* Whether needle occurs in text, ignoring ASCII case. */
static bool contains_nocase(const char *text, const char *needle) {
    size_t n = strlen(needle);
    for (; *text != '\0'; text++) {
        size_t i = 0;
        while (i < n && text[i] != '\0' &&
               tolower((unsigned char)text[i]) == tolower((unsigned char)needle[i])) {
            i++;
        }
        if (i == n) {
            return true;
        }
    }
    return n == 0;
}

static lapse_status_t insert(lapse_store_t *store, const char *order_id,
                             int64_t deadline_ms, const char *const *holds,
                             size_t n_holds) {
    lapse_new_order_t order = {.order_id = order_id,
                               .deadline_ms = deadline_ms,
                               .created_at_ms = T0,
                               .holds = holds,
                               .n_holds = n_holds};
    lapse_status_t result = LAPSE_ERR_INVALID;
    lapse_error_t err;
    assert_int_equal(lapse_store_insert_orders(store, &order, 1, &result, &err),
                     LAPSE_OK);
    return result;
}

static lapse_cancel_outcome_t cancel(lapse_store_t *store, const char *order_id,
                                     int64_t now_ms, int64_t *event_seq) {
    lapse_cancel_item_t item = {.order_id = order_id};
    lapse_error_t err;
    assert_int_equal(lapse_store_cancel_batch(store, &item, 1, now_ms, &err), LAPSE_OK);
    if (event_seq != NULL) {
        *event_seq = item.event_seq;
    }
    return item.outcome;
}

static lapse_order_status_t status_of(lapse_store_t *store, const char *order_id) {
    lapse_order_t order;
    lapse_error_t err;
    lapse_order_init(&order);
    assert_int_equal(lapse_store_get(store, order_id, &order, &err), LAPSE_OK);
    lapse_order_status_t status = order.status;
    lapse_order_clear(&order);
    return status;
}

static void test_open_bad_uri(void **state) {
    (void)state;
    static const char *const uris[] = {"mysql://localhost/db", "sqlite:", "lapse.db", ""};
    lapse_status_t rc = LAPSE_OK;
    lapse_error_t err;
    for (size_t i = 0; i < sizeof(uris) / sizeof(uris[0]); i++) {
        assert_null(lapse_store_open(uris[i], &rc, &err));
        assert_int_equal(rc, LAPSE_ERR_CONFIG_STORE);
        assert_int_equal(err.code, LAPSE_ERR_CONFIG_STORE);
    }
    assert_null(lapse_store_open(NULL, &rc, &err));
    assert_int_equal(rc, LAPSE_ERR_CONFIG_STORE);
    /* A server that refuses connections is retriable, and the password stays out of
     * the message. */
    assert_null(lapse_store_open("postgres://u:secret@127.0.0.1:1/orders", &rc, &err));
    assert_int_equal(rc, LAPSE_ERR_STORE_BUSY);
    assert_null(strstr(err.text, "secret"));
    assert_null(lapse_store_open("postgresql://127.0.0.1:1/orders?bogus=1", &rc, &err));
    assert_int_equal(rc, LAPSE_ERR_STORE_OPEN);
    assert_null(lapse_store_open("sqlite:/nonexistent-lapse-dir/x/store.db", &rc, &err));
    assert_int_equal(rc, LAPSE_ERR_STORE_OPEN);
    assert_true(err.text[0] != '\0');
}

/* Commands that only read open with MUST_EXIST: a missing store (no file; a database
 * without lapse's schema) is an error, and none appears; the same store opens once
 * something created it. */
static void test_open_must_exist(void **state) {
    fixture_t *f = *state;
    sf_store_t other;
    assert_int_equal(sf_create(&other, "store-other", f->dir, "other.db"), 0);
    lapse_status_t rc = LAPSE_OK;
    lapse_error_t err;
    assert_null(lapse_store_open_flags(other.uri, LAPSE_STORE_MUST_EXIST, &rc, &err));
    assert_int_equal(rc, LAPSE_ERR_STORE_MISSING);
    assert_int_equal(err.code, LAPSE_ERR_STORE_MISSING);
    assert_non_null(strstr(err.text, "store not found"));
    if (other.backend == SF_SQLITE) {
        assert_non_null(strstr(err.text, other.path));
    }
    assert_false(sf_exists(&other));
    assert_int_equal(sf_drop(&other), 0);
    /* The fixture's store exists: it opens, and keeps its orders. */
    assert_int_equal(insert(f->store, "ord-1", DEADLINE, NULL, 0), LAPSE_OK);
    lapse_store_t *again =
        lapse_store_open_flags(f->uri, LAPSE_STORE_MUST_EXIST, &rc, &err);
    assert_non_null(again);
    lapse_order_t order;
    lapse_order_init(&order);
    assert_int_equal(lapse_store_get(again, "ord-1", &order, &err), LAPSE_OK);
    lapse_order_clear(&order);
    lapse_store_close(again);
}

/* The same for what only SQLite has: a missing directory, and a store in memory. */
static void test_open_must_exist_sqlite_paths(void **state) {
    (void)state;
    SF_SKIP_ON_PG("directories and :memory: are SQLite's");
    lapse_status_t rc = LAPSE_OK;
    lapse_error_t err;
    /* A missing directory is missing too. */
    assert_null(lapse_store_open_flags("sqlite:/nonexistent-lapse-dir/x.db",
                                       LAPSE_STORE_MUST_EXIST, &rc, &err));
    assert_int_equal(rc, LAPSE_ERR_STORE_MISSING);
    /* In memory there is no file to miss. */
    lapse_store_t *again =
        lapse_store_open_flags("sqlite::memory:", LAPSE_STORE_MUST_EXIST, &rc, &err);
    assert_non_null(again);
    lapse_store_close(again);
}

static unsigned file_mode(const char *path) {
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (unsigned)(st.st_mode & 07777);
}

/* A new store file is 0600 whatever the umask, and its -wal and -shm follow it. */
static void test_new_store_files_are_0600(void **state) {
    fixture_t *f = *state;
    SF_SKIP_ON_PG("file modes of the SQLite store and its -wal and -shm files");
    static const mode_t umasks[] = {0, 022, 0277};
    for (size_t i = 0; i < sizeof umasks / sizeof umasks[0]; i++) {
        char path[128], uri[160], wal[140], shm[140];
        snprintf(path, sizeof path, "%s/mode%zu.db", f->dir, i);
        snprintf(uri, sizeof uri, "sqlite:%s", path);
        snprintf(wal, sizeof wal, "%s-wal", path);
        snprintf(shm, sizeof shm, "%s-shm", path);
        mode_t old = umask(umasks[i]);
        lapse_status_t rc;
        lapse_error_t err;
        lapse_store_t *store = lapse_store_open(uri, &rc, &err);
        umask(old);
        if (store == NULL) {
            fail_msg("umask %03o: %s", (unsigned)umasks[i], err.text);
        }
        /* A write while the handle is open: the -wal and -shm files exist now. */
        assert_int_equal(insert(store, "ord-1", DEADLINE, NULL, 0), LAPSE_OK);
        assert_int_equal(file_mode(path), 0600);
        assert_int_equal(file_mode(wal), 0600);
        assert_int_equal(file_mode(shm), 0600);
        lapse_store_close(store);
        assert_int_equal(file_mode(path), 0600);
        unlink(path);
        unlink(wal);
        unlink(shm);
    }
    /* An existing file keeps the mode its owner gave it. */
    assert_int_equal(chmod(f->path, 0640), 0);
    lapse_status_t rc;
    lapse_store_t *again = lapse_store_open(f->uri, &rc, NULL);
    assert_non_null(again);
    lapse_store_close(again);
    assert_int_equal(file_mode(f->path), 0640);
}

/* The schema is there once the store is open, and a second handle (another process,
 * say) opens an existing store as it is. */
static void test_open_creates_the_tables(void **state) {
    fixture_t *f = *state;
    char err_text[1024];
    sf_conn_t *c = sf_connect(&f->sf, true, err_text, sizeof(err_text));
    assert_non_null(c);
    assert_true(sf_table_exists(c, "orders"));
    assert_true(sf_table_exists(c, "holds"));
    assert_true(sf_table_exists(c, "events"));
    sf_close(c);
    assert_int_equal(insert(f->store, "ord-1", DEADLINE, NULL, 0), LAPSE_OK);
    lapse_status_t rc;
    lapse_error_t err;
    lapse_store_t *other = lapse_store_open(f->uri, &rc, &err);
    assert_non_null(other);
    assert_int_equal(status_of(other, "ord-1"), LAPSE_ORDER_PENDING);
    lapse_store_close(other);
}

static void test_open_uses_wal_and_versioned_schema(void **state) {
    fixture_t *f = *state;
    SF_SKIP_ON_PG("WAL and PRAGMA user_version are SQLite's");
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL), 0);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(st, 0), "wal");
    sqlite3_finalize(st);
    sqlite3_close(db);
    assert_int_equal(query_int(f, "PRAGMA user_version"), 8);
    assert_int_equal(query_int(f,
                               "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
                               " AND name IN ('orders', 'holds', 'events')"),
                     3);

    /* A second handle on an existing file (another process, say) opens it as is. */
    lapse_status_t rc;
    lapse_error_t err;
    lapse_store_t *other = lapse_store_open(f->uri, &rc, &err);
    assert_non_null(other);
    lapse_store_close(other);
}

/* A store whose schema a later lapse migrated (SQLite's user_version, PostgreSQL's
 * lapse_schema table) is refused, not written to. */
static void test_open_refuses_newer_schema(void **state) {
    fixture_t *f = *state;
    exec_sql(f, f->sf.backend == SF_PG ? "UPDATE lapse_schema SET version = 99"
                                       : "PRAGMA user_version = 99");
    lapse_status_t rc;
    lapse_error_t err;
    assert_null(lapse_store_open(f->uri, &rc, &err));
    assert_int_equal(rc, LAPSE_ERR_STORE_OPEN);
}

/* PostgreSQL's schema version 3 has no UNIQUE (event_id) and no index by published_at_ms
 * on the outbox (store_pg_sql.h, PG_SCHEMA_V3): a new schema is made without them, and a
 * version 2 schema loses them on open and keeps its events. */
static void test_open_upgrades_a_version_2_schema(void **state) {
    fixture_t *f = *state;
    if (f->sf.backend != SF_PG) {
        print_message("skip on SQLite: PostgreSQL's schema versions\n");
        skip();
    }
    const char *indexes = "SELECT count(*) FROM pg_indexes"
                          " WHERE schemaname = current_schema() AND tablename = 'events'";
    assert_int_equal(query_int(f, indexes), 2); /* events_pkey, events_unpublished */
    assert_int_equal(insert(f->store, "ord-1", DEADLINE, NULL, 0), LAPSE_OK);
    assert_int_equal(cancel(f->store, "ord-1", DEADLINE, NULL), LAPSE_CANCEL_DONE);
    exec_sql(f, "ALTER TABLE events ADD CONSTRAINT events_event_id_key UNIQUE (event_id);"
                "CREATE INDEX events_published ON events (published_at_ms)"
                " WHERE published_at_ms IS NOT NULL;"
                "UPDATE lapse_schema SET version = 2");
    assert_int_equal(query_int(f, indexes), 4);
    lapse_store_close(f->store);
    lapse_status_t rc;
    lapse_error_t err;
    f->store = lapse_store_open(f->uri, &rc, &err);
    assert_non_null(f->store);
    assert_int_equal(query_int(f, "SELECT max(version) FROM lapse_schema"), 3);
    assert_int_equal(query_int(f, indexes), 2);
    assert_int_equal(query_int(f, "SELECT count(*) FROM events"
                                  " WHERE event_id = 'order.cancelled:ord-1'"),
                     1);
}

static void test_insert_is_idempotent_for_same_deadline(void **state) {
    fixture_t *f = *state;
    const char *const holds[] = {"seat-12"};
    assert_int_equal(insert(f->store, "ord-1", DEADLINE, holds, 1), LAPSE_OK);
    assert_int_equal(insert(f->store, "ord-1", DEADLINE, holds, 1), LAPSE_OK);
    assert_int_equal(query_int(f, "SELECT count(*) FROM orders"), 1);
    assert_int_equal(query_int(f, "SELECT count(*) FROM holds"), 1);
}

static void test_insert_conflicts_on_other_deadline(void **state) {
    fixture_t *f = *state;
    assert_int_equal(insert(f->store, "ord-1", DEADLINE, NULL, 0), LAPSE_OK);
    assert_int_equal(insert(f->store, "ord-1", DEADLINE + 1, NULL, 0),
                     LAPSE_ERR_STORE_CONFLICT);
    assert_int_equal(query_int(f, "SELECT deadline_ms FROM orders"), DEADLINE);
}

static void test_insert_refuses_order_no_longer_pending(void **state) {
    fixture_t *f = *state;
    lapse_error_t err;
    assert_int_equal(insert(f->store, "ord-paid", OPEN_DEADLINE, NULL, 0), LAPSE_OK);
    assert_int_equal(insert(f->store, "ord-gone", DEADLINE, NULL, 0), LAPSE_OK);
    assert_int_equal(lapse_store_pay(f->store, "ord-paid", T0, &err), LAPSE_OK);
    assert_int_equal(cancel(f->store, "ord-gone", DEADLINE, NULL), LAPSE_CANCEL_DONE);

    /* One batch, per-order verdicts, and the batch itself still commits. */
    lapse_new_order_t orders[] = {
        {.order_id = "ord-paid", .deadline_ms = OPEN_DEADLINE, .created_at_ms = T0},
        {.order_id = "ord-gone", .deadline_ms = DEADLINE, .created_at_ms = T0},
        {.order_id = "ord-new", .deadline_ms = DEADLINE, .created_at_ms = T0},
    };
    lapse_status_t results[3];
    assert_int_equal(lapse_store_insert_orders(f->store, orders, 3, results, &err),
                     LAPSE_OK);
    assert_int_equal(results[0], LAPSE_ERR_STORE_STATE);
    assert_int_equal(results[1], LAPSE_ERR_STORE_STATE);
    assert_int_equal(results[2], LAPSE_OK);
    assert_int_equal(status_of(f->store, "ord-new"), LAPSE_ORDER_PENDING);
}

static void test_insert_records_holds_sorted_without_duplicates(void **state) {
    fixture_t *f = *state;
    const char *const holds[] = {"seat-9", "seat-1", "seat-9"};
    assert_int_equal(insert(f->store, "ord-1", DEADLINE, holds, 3), LAPSE_OK);

    lapse_order_t order;
    lapse_error_t err;
    lapse_order_init(&order);
    assert_int_equal(lapse_store_get(f->store, "ord-1", &order, &err), LAPSE_OK);
    assert_string_equal(order.order_id, "ord-1");
    assert_int_equal(order.status, LAPSE_ORDER_PENDING);
    assert_int_equal(order.deadline_ms, DEADLINE);
    assert_int_equal(order.created_at_ms, T0);
    assert_int_equal(order.paid_at_ms, -1);
    assert_int_equal(order.cancelled_at_ms, -1);
    assert_false(order.scheduled);
    assert_int_equal(order.n_holds, 2);
    assert_string_equal(order.holds[0], "seat-1");
    assert_string_equal(order.holds[1], "seat-9");
    lapse_order_clear(&order);
    assert_int_equal(order.n_holds, 0);
    assert_null(order.holds);
    lapse_order_clear(NULL);
}

static void test_insert_rejects_invalid_input_and_writes_nothing(void **state) {
    fixture_t *f = *state;
    const char *const bad_holds[] = {"seat-\xff"};
    lapse_new_order_t orders[] = {
        {.order_id = "ord-ok", .deadline_ms = DEADLINE, .created_at_ms = T0},
        {.order_id = "ord bad", .deadline_ms = DEADLINE, .created_at_ms = T0},
    };
    lapse_status_t results[2];
    lapse_error_t err;
    assert_int_equal(lapse_store_insert_orders(f->store, orders, 2, results, &err),
                     LAPSE_ERR_INVALID);
    orders[1].order_id = "ord-utf8";
    orders[1].holds = bad_holds;
    orders[1].n_holds = 1;
    assert_int_equal(lapse_store_insert_orders(f->store, orders, 2, results, &err),
                     LAPSE_ERR_INVALID);
    assert_int_equal(query_int(f, "SELECT count(*) FROM orders"), 0);
    assert_int_equal(lapse_store_insert_orders(NULL, orders, 1, results, &err),
                     LAPSE_ERR_INVALID);
}

static void test_mark_scheduled_sets_flag(void **state) {
    fixture_t *f = *state;
    lapse_error_t err;
    assert_int_equal(insert(f->store, "ord-1", DEADLINE, NULL, 0), LAPSE_OK);
    const char *const ids[] = {"ord-1", "ord-unknown"};
    assert_int_equal(lapse_store_mark_scheduled(f->store, ids, 2, &err), LAPSE_OK);
    lapse_order_t order;
    lapse_order_init(&order);
    assert_int_equal(lapse_store_get(f->store, "ord-1", &order, &err), LAPSE_OK);
    assert_true(order.scheduled);
    lapse_order_clear(&order);
}

static void test_get_unknown_is_not_found(void **state) {
    fixture_t *f = *state;
    lapse_order_t order;
    lapse_error_t err;
    lapse_order_init(&order);
    assert_int_equal(lapse_store_get(f->store, "ord-none", &order, &err),
                     LAPSE_ERR_STORE_NOT_FOUND);
    assert_int_equal(err.code, LAPSE_ERR_STORE_NOT_FOUND);
    assert_int_equal(order.n_holds, 0);
}

static void test_pay_before_deadline_marks_paid(void **state) {
    fixture_t *f = *state;
    lapse_error_t err;
    assert_int_equal(insert(f->store, "ord-1", OPEN_DEADLINE, NULL, 0), LAPSE_OK);
    int64_t before = store_now(f);
    assert_int_equal(lapse_store_pay(f->store, "ord-1", OPEN_DEADLINE - 1, &err),
                     LAPSE_OK);
    int64_t after = store_now(f);
    assert_int_equal(err.code, LAPSE_OK);
    lapse_order_t order;
    lapse_order_init(&order);
    assert_int_equal(lapse_store_get(f->store, "ord-1", &order, &err), LAPSE_OK);
    assert_int_equal(order.status, LAPSE_ORDER_PAID);
    assert_recorded_time(f, order.paid_at_ms, OPEN_DEADLINE - 1, before, after);
    assert_int_equal(order.cancelled_at_ms, -1);
    lapse_order_clear(&order);
}

static void test_pay_after_deadline_is_refused(void **state) {
    fixture_t *f = *state;
    lapse_error_t err;
    assert_int_equal(insert(f->store, "ord-1", DEADLINE, NULL, 0), LAPSE_OK);
    /* The window is half-open: at the deadline itself it is already closed. */
    assert_int_equal(lapse_store_pay(f->store, "ord-1", DEADLINE, &err),
                     LAPSE_ERR_STORE_LAPSED);
    assert_int_equal(err.code, LAPSE_ERR_STORE_LAPSED);
    assert_int_equal(lapse_store_pay(f->store, "ord-1", DEADLINE + 5000, &err),
                     LAPSE_ERR_STORE_LAPSED);
    assert_int_equal(status_of(f->store, "ord-1"), LAPSE_ORDER_PENDING);
}

static void test_pay_cancelled_is_refused(void **state) {
    fixture_t *f = *state;
    lapse_error_t err;
    assert_int_equal(insert(f->store, "ord-1", DEADLINE, NULL, 0), LAPSE_OK);
    assert_int_equal(cancel(f->store, "ord-1", DEADLINE, NULL), LAPSE_CANCEL_DONE);
    /* Even with a clock that says the window is open. */
    assert_int_equal(lapse_store_pay(f->store, "ord-1", T0, &err), LAPSE_ERR_STORE_STATE);
    assert_int_equal(status_of(f->store, "ord-1"), LAPSE_ORDER_CANCELLED);
}

static void test_pay_unknown(void **state) {
    fixture_t *f = *state;
    lapse_error_t err;
    assert_int_equal(lapse_store_pay(f->store, "ord-none", T0, &err),
                     LAPSE_ERR_STORE_NOT_FOUND);
    assert_int_equal(lapse_store_pay(NULL, "ord-none", T0, &err), LAPSE_ERR_INVALID);
}

static void test_pay_twice_is_ok(void **state) {
    fixture_t *f = *state;
    lapse_error_t err;
    assert_int_equal(insert(f->store, "ord-1", OPEN_DEADLINE, NULL, 0), LAPSE_OK);
    int64_t before = store_now(f);
    assert_int_equal(lapse_store_pay(f->store, "ord-1", T0 + 1, &err), LAPSE_OK);
    int64_t after = store_now(f);
    int64_t paid_at = query_int(f, "SELECT paid_at_ms FROM orders");
    assert_recorded_time(f, paid_at, T0 + 1, before, after);
    assert_int_equal(lapse_store_pay(f->store, "ord-1", T0 + 2, &err), LAPSE_OK);
    /* Also after the deadline: the payment already happened in time. */
    assert_int_equal(lapse_store_pay(f->store, "ord-1", OPEN_DEADLINE + 1, &err),
                     LAPSE_OK);
    assert_int_equal(query_int(f, "SELECT paid_at_ms FROM orders"), paid_at);
}

static void test_cancel_before_deadline_is_refused(void **state) {
    fixture_t *f = *state;
    const char *const holds[] = {"seat-1"};
    assert_int_equal(insert(f->store, "ord-1", OPEN_DEADLINE, holds, 1), LAPSE_OK);
    lapse_cancel_item_t item = {.order_id = "ord-1"};
    lapse_error_t err;
    assert_int_equal(
        lapse_store_cancel_batch(f->store, &item, 1, OPEN_DEADLINE - 1, &err), LAPSE_OK);
    assert_int_equal(item.outcome, LAPSE_CANCEL_EARLY);
    assert_int_equal(item.deadline_ms, OPEN_DEADLINE);
    assert_int_equal(item.event_seq, 0);
    assert_int_equal(status_of(f->store, "ord-1"), LAPSE_ORDER_PENDING);
    assert_int_equal(query_int(f, "SELECT count(*) FROM holds"
                                  " WHERE released_at_ms IS NOT NULL"),
                     0);
    assert_int_equal(query_int(f, "SELECT count(*) FROM events"), 0);
}

static void test_cancel_at_deadline_cancels(void **state) {
    fixture_t *f = *state;
    assert_int_equal(insert(f->store, "ord-1", DEADLINE, NULL, 0), LAPSE_OK);
    int64_t seq = 0;
    int64_t before = store_now(f);
    assert_int_equal(cancel(f->store, "ord-1", DEADLINE, &seq), LAPSE_CANCEL_DONE);
    int64_t after = store_now(f);
    assert_true(seq > 0);
    assert_recorded_time(f, query_int(f, "SELECT cancelled_at_ms FROM orders"), DEADLINE,
                         before, after);
}

static void test_cancel_after_deadline_releases_holds_once(void **state) {
    fixture_t *f = *state;
    const char *const holds[] = {"seat-1", "seat-2"};
    assert_int_equal(insert(f->store, "ord-1", DEADLINE, holds, 2), LAPSE_OK);
    int64_t seq = 0;
    int64_t before = store_now(f);
    assert_int_equal(cancel(f->store, "ord-1", DEADLINE + 100, &seq), LAPSE_CANCEL_DONE);
    int64_t after = store_now(f);
    assert_true(seq > 0);
    int64_t cancelled_at = query_int(f, "SELECT cancelled_at_ms FROM orders");
    assert_recorded_time(f, cancelled_at, DEADLINE + 100, before, after);
    static const char released_with_it[] =
        "SELECT count(*) FROM holds h JOIN orders o USING (order_id)"
        " WHERE h.released_at_ms = o.cancelled_at_ms";
    assert_int_equal(query_int(f, released_with_it), 2);

    /* A redelivered message: nothing changes, no second event. */
    int64_t again = -1;
    assert_int_equal(cancel(f->store, "ord-1", DEADLINE + 9000, &again),
                     LAPSE_CANCEL_NOOP_CANCELLED);
    assert_int_equal(again, 0);
    assert_int_equal(query_int(f, released_with_it), 2);
    assert_int_equal(query_int(f, "SELECT cancelled_at_ms FROM orders"), cancelled_at);
    assert_int_equal(query_int(f, "SELECT count(*) FROM events"), 1);
}

static void test_cancel_paid_is_noop(void **state) {
    fixture_t *f = *state;
    const char *const holds[] = {"seat-1"};
    lapse_error_t err;
    assert_int_equal(insert(f->store, "ord-1", OPEN_DEADLINE, holds, 1), LAPSE_OK);
    assert_int_equal(lapse_store_pay(f->store, "ord-1", T0, &err), LAPSE_OK);
    lapse_cancel_item_t item = {.order_id = "ord-1"};
    assert_int_equal(lapse_store_cancel_batch(f->store, &item, 1, DEADLINE, &err),
                     LAPSE_OK);
    assert_int_equal(item.outcome, LAPSE_CANCEL_NOOP_PAID);
    assert_int_equal(item.deadline_ms, OPEN_DEADLINE);
    assert_int_equal(status_of(f->store, "ord-1"), LAPSE_ORDER_PAID);
    assert_int_equal(query_int(f, "SELECT count(*) FROM holds"
                                  " WHERE released_at_ms IS NOT NULL"),
                     0);
    assert_int_equal(query_int(f, "SELECT count(*) FROM events"), 0);
}

static void test_cancel_unknown_order(void **state) {
    fixture_t *f = *state;
    lapse_cancel_item_t item = {.order_id = "ord-none", .deadline_ms = 7, .event_seq = 7};
    lapse_error_t err;
    assert_int_equal(lapse_store_cancel_batch(f->store, &item, 1, DEADLINE, &err),
                     LAPSE_OK);
    assert_int_equal(item.outcome, LAPSE_CANCEL_UNKNOWN);
    assert_int_equal(item.deadline_ms, 0);
    assert_int_equal(item.event_seq, 0);
}

static void test_cancel_same_order_twice_in_one_batch(void **state) {
    fixture_t *f = *state;
    assert_int_equal(insert(f->store, "ord-1", DEADLINE, NULL, 0), LAPSE_OK);
    lapse_cancel_item_t items[] = {{.order_id = "ord-1"}, {.order_id = "ord-1"}};
    lapse_error_t err;
    assert_int_equal(lapse_store_cancel_batch(f->store, items, 2, DEADLINE, &err),
                     LAPSE_OK);
    assert_int_equal(items[0].outcome, LAPSE_CANCEL_DONE);
    assert_int_equal(items[1].outcome, LAPSE_CANCEL_NOOP_CANCELLED);
    assert_int_equal(items[1].event_seq, 0);
    assert_int_equal(query_int(f, "SELECT count(*) FROM events"), 1);
}

/* A batch of 202 orders (one paid, one given twice) cancels 201: their events go in as
 * inserts of 32, 8 and 1 rows on SQLite, and in statements of at most 24 KiB of
 * parameters on PostgreSQL (two here). Each item's event_seq is its own event's, with its
 * id, the seqs are all different, and after every event is deleted the next one still
 * gets a seq above them all (none is given twice, as AUTOINCREMENT promises). */
static void test_cancel_batch_event_seqs(void **state) {
    fixture_t *f = *state;
    enum { N = 202 };
    char ids[N][16];
    lapse_cancel_item_t items[N + 1];
    for (int i = 0; i < N; i++) {
        snprintf(ids[i], sizeof ids[i], "ord-%02d", i);
        /* ord-05 is paid before its deadline (the store's clock decides on PG). */
        assert_int_equal(
            insert(f->store, ids[i], i == 5 ? OPEN_DEADLINE : DEADLINE, NULL, 0),
            LAPSE_OK);
        items[i] = (lapse_cancel_item_t){.order_id = ids[i]};
    }
    items[N] = (lapse_cancel_item_t){.order_id = ids[7]};
    lapse_error_t err;
    assert_int_equal(lapse_store_pay(f->store, ids[5], T0, &err), LAPSE_OK);
    assert_int_equal(lapse_store_cancel_batch(f->store, items, N + 1, DEADLINE, &err),
                     LAPSE_OK);
    int64_t max_seq = 0;
    for (int i = 0; i < N; i++) {
        if (i == 5) {
            assert_int_equal(items[i].outcome, LAPSE_CANCEL_NOOP_PAID);
            assert_int_equal(items[i].event_seq, 0);
            continue;
        }
        assert_int_equal(items[i].outcome, LAPSE_CANCEL_DONE);
        assert_true(items[i].event_seq > 0);
        for (int j = 0; j < i; j++) {
            assert_true(items[j].event_seq != items[i].event_seq);
        }
        char sql[1024];
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM events WHERE seq = %lld AND order_id = '%.15s'"
                 " AND event_id = 'order.cancelled:%.15s'",
                 (long long)items[i].event_seq, ids[i], ids[i]);
        assert_int_equal(query_int(f, sql), 1);
        max_seq = items[i].event_seq > max_seq ? items[i].event_seq : max_seq;
    }
    assert_int_equal(items[N].outcome, LAPSE_CANCEL_NOOP_CANCELLED);
    assert_int_equal(items[N].event_seq, 0);
    assert_int_equal(query_int(f, "SELECT count(*) FROM events"), N - 1);

    exec_sql(f, "DELETE FROM events");
    assert_int_equal(insert(f->store, "ord-next", DEADLINE, NULL, 0), LAPSE_OK);
    int64_t next = 0;
    assert_int_equal(cancel(f->store, "ord-next", DEADLINE, &next), LAPSE_CANCEL_DONE);
    assert_true(next > max_seq);
}

static void test_cancel_batch_failure_writes_nothing(void **state) {
    fixture_t *f = *state;
    const char *const holds[] = {"seat-1"};
    assert_int_equal(insert(f->store, "ord-a", DEADLINE, holds, 1), LAPSE_OK);
    assert_int_equal(insert(f->store, "ord-b", DEADLINE, NULL, 0), LAPSE_OK);
    /* ord-b's event insert fails, after ord-a was cancelled: a trigger refuses it (the
     * events have no UNIQUE (event_id) since SQLite's schema version 5 and PostgreSQL's
     * version 3), and a stray outbox row is there to stay. */
    if (f->sf.backend == SF_PG) {
        exec_sql(f, "CREATE FUNCTION refuse_b() RETURNS trigger LANGUAGE plpgsql AS"
                    " $$ BEGIN IF NEW.order_id = 'ord-b' THEN"
                    " RAISE EXCEPTION 'refused by the test'; END IF; RETURN NEW; END $$;"
                    "CREATE TRIGGER refuse_b BEFORE INSERT ON events FOR EACH ROW"
                    " EXECUTE FUNCTION refuse_b();"
                    "INSERT INTO events (event_id, order_id, body, created_at_ms)"
                    " VALUES ('order.cancelled:stray', 'stray', '{}', 0)");
    } else {
        exec_sql(f, "CREATE TRIGGER refuse_b BEFORE INSERT ON events"
                    " WHEN NEW.order_id = 'ord-b'"
                    " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;"
                    "INSERT INTO events (event_id, order_id, body, created_at_ms)"
                    " VALUES ('order.cancelled:stray', 'stray', '{}', 0)");
    }
    lapse_cancel_item_t items[] = {{.order_id = "ord-a"}, {.order_id = "ord-b"}};
    lapse_error_t err;
    assert_int_equal(lapse_store_cancel_batch(f->store, items, 2, DEADLINE, &err),
                     LAPSE_ERR_STORE_SQL);
    assert_int_equal(err.code, LAPSE_ERR_STORE_SQL);
    assert_true(contains_nocase(err.text, "refused by the test"));
    assert_int_equal(items[0].outcome, LAPSE_CANCEL_UNKNOWN);
    assert_int_equal(items[0].event_seq, 0);
    assert_int_equal(status_of(f->store, "ord-a"), LAPSE_ORDER_PENDING);
    assert_int_equal(query_int(f, "SELECT count(*) FROM holds"
                                  " WHERE released_at_ms IS NOT NULL"),
                     0);
    assert_int_equal(query_int(f, "SELECT count(*) FROM events"), 1);

    /* The handle is usable afterwards. */
    assert_int_equal(cancel(f->store, "ord-a", DEADLINE, NULL), LAPSE_CANCEL_DONE);
}

typedef struct seen {
    size_t n;
    int64_t seq[8];
    char event_id[8][160];
    char body[8][512];
    size_t stop_after;      /* 0: never stop */
    lapse_store_t *publish; /* when set, mark each event published from the callback */
} seen_t;

static int record_event(void *opaque, const lapse_event_t *event) {
    seen_t *seen = opaque;
    if (seen->n < 8) {
        seen->seq[seen->n] = event->seq;
        snprintf(seen->event_id[seen->n], sizeof(seen->event_id[0]), "%s",
                 event->event_id);
        snprintf(seen->body[seen->n], sizeof(seen->body[0]), "%s", event->body);
    }
    seen->n++;
    if (seen->publish != NULL) {
        lapse_error_t err;
        if (lapse_store_events_mark_published(seen->publish, &event->seq, 1, DEADLINE,
                                              &err) != LAPSE_OK) {
            return -1;
        }
    }
    return seen->stop_after != 0 && seen->n >= seen->stop_after;
}

/* Records ORDER_ID with HOLDS, cancels it at CANCEL_AT and reads back its one pending
 * event into *seen (its seq into *seq unless NULL); DEADLINE and the stored cancel time,
 * formatted, into the buffers. */
static void cancel_one_event(fixture_t *f, const char *order_id, const char *const *holds,
                             size_t n_holds, int64_t cancel_at, seen_t *seen,
                             int64_t *seq, char deadline[LAPSE_RFC3339_LEN],
                             char cancelled_at[LAPSE_RFC3339_LEN]) {
    assert_int_equal(insert(f->store, order_id, DEADLINE, holds, n_holds), LAPSE_OK);
    assert_int_equal(cancel(f->store, order_id, cancel_at, seq), LAPSE_CANCEL_DONE);
    release_claims(f);
    lapse_error_t err;
    assert_int_equal(
        lapse_store_events_pending(f->store, 10, NULL, 0, record_event, seen, &err),
        LAPSE_OK);
    assert_int_equal(seen->n, 1);
    lapse_time_format_rfc3339(DEADLINE, deadline);
    lapse_time_format_rfc3339(query_int(f, "SELECT cancelled_at_ms FROM orders"),
                              cancelled_at);
}

static void test_cancel_event_body_names_order_deadline_and_holds(void **state) {
    fixture_t *f = *state;
    const char *const holds[] = {"slot-b", "slot-a"};
    int64_t seq = 0;
    seen_t seen = {0};
    char deadline[LAPSE_RFC3339_LEN], cancelled_at[LAPSE_RFC3339_LEN], want[512];
    cancel_one_event(f, "ord-1", holds, 2, DEADLINE + 250, &seen, &seq, deadline,
                     cancelled_at);
    assert_int_equal(seen.seq[0], seq);
    assert_string_equal(seen.event_id[0], "order.cancelled:ord-1");
    /* The times are the stored ones (on PostgreSQL the server's cancel time). */
    snprintf(want, sizeof(want),
             "{\"event\":\"order.cancelled\",\"order_id\":\"ord-1\","
             "\"deadline\":\"%s\",\"cancelled_at\":\"%s\","
             "\"holds\":[\"slot-a\",\"slot-b\"]}",
             deadline, cancelled_at);
    assert_string_equal(seen.body[0], want);
    if (f->sf.backend == SF_SQLITE) {
        assert_string_equal(seen.body[0],
                            "{\"event\":\"order.cancelled\",\"order_id\":\"ord-1\","
                            "\"deadline\":\"2027-01-15T08:30:00.000Z\","
                            "\"cancelled_at\":\"2027-01-15T08:30:00.250Z\","
                            "\"holds\":[\"slot-a\",\"slot-b\"]}");
    }
}

/* An order that held nothing gets the same event, read by every walk of the outbox (by
 * page, by seq, by a run of seqs); SQLite stores it without its body (schema version 6,
 * store_sqlite_sql.h: EVENT_BODY_DERIVED) and builds it again when it reads it. */
static void test_cancel_event_body_without_holds(void **state) {
    fixture_t *f = *state;
    int64_t seq = 0;
    seen_t seen = {0};
    char deadline[LAPSE_RFC3339_LEN], cancelled_at[LAPSE_RFC3339_LEN], want[512];
    cancel_one_event(f, "ord-plain", NULL, 0, DEADLINE + 31, &seen, &seq, deadline,
                     cancelled_at);
    snprintf(want, sizeof(want),
             "{\"event\":\"order.cancelled\",\"order_id\":\"ord-plain\","
             "\"deadline\":\"%s\",\"cancelled_at\":\"%s\",\"holds\":[]}",
             deadline, cancelled_at);
    assert_string_equal(seen.event_id[0], "order.cancelled:ord-plain");
    assert_string_equal(seen.body[0], want);
    if (f->sf.backend == SF_SQLITE) {
        assert_string_equal(seen.body[0],
                            "{\"event\":\"order.cancelled\",\"order_id\":\"ord-plain\","
                            "\"deadline\":\"2027-01-15T08:30:00.000Z\","
                            "\"cancelled_at\":\"2027-01-15T08:30:00.031Z\","
                            "\"holds\":[]}");
        assert_int_equal(query_int(f,
                                   "SELECT count(*) FROM events WHERE body = ''"
                                   " AND deadline_ms = (SELECT deadline_ms FROM orders)"
                                   " AND created_at_ms = (SELECT cancelled_at_ms"
                                   " FROM orders)"),
                         1);
    }
    /* The same body by seq and by a run of seqs. */
    for (int by = 0; by < 2; by++) {
        int64_t seqs[] = {seq, seq + 1000};
        seen_t again = {0};
        lapse_error_t err;
        release_claims(f);
        assert_int_equal(lapse_store_events_pending(f->store, 10, seqs, by == 0 ? 1 : 2,
                                                    record_event, &again, &err),
                         LAPSE_OK);
        assert_int_equal(again.n, 1);
        assert_string_equal(again.body[0], want);
    }
}

/* A row with an empty body and no deadline cannot be published: the walk says so
 * instead of publishing an empty event. */
static void test_events_pending_refuses_a_row_without_body_or_deadline(void **state) {
    fixture_t *f = *state;
    SF_SKIP_ON_PG("SQLite's derived bodies");
    exec_sql(f, "INSERT INTO events (event_id, order_id, body, created_at_ms)"
                " VALUES ('order.cancelled:x', 'x', '', 1)");
    seen_t seen = {0};
    lapse_error_t err = {0};
    assert_int_equal(
        lapse_store_events_pending(f->store, 10, NULL, 0, record_event, &seen, &err),
        LAPSE_ERR_STORE_SQL);
    assert_non_null(strstr(err.text, "an empty body and no deadline"));
    assert_int_equal(seen.n, 0);
}

static int compare_strings(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The stored body is what jansson's compact dump of the event gives, byte for byte, also
 * for holds that JSON must escape (quotes, backslashes, control characters) and for
 * non-ASCII ones: the SQLite backend hands the bodies to SQL inside a JSON document and
 * must get back exactly what it wrote. */
static void test_cancel_event_body_is_stored_as_written(void **state) {
    fixture_t *f = *state;
    const char *holds[] = {"quote\"d",         "back\\slash", "tab\tand\nnewline",
                           "ctl\x01\x1f\x7f",  "caf\xc3\xa9", "\xe4\xb8\xad",
                           "\xf0\x9f\x98\x80", "slash/x",     "\\u0041"};
    size_t n_holds = sizeof holds / sizeof *holds;
    seen_t seen = {0};
    char deadline[LAPSE_RFC3339_LEN], cancelled_at[LAPSE_RFC3339_LEN];
    cancel_one_event(f, "ord-esc", holds, n_holds, DEADLINE + 7, &seen, NULL, deadline,
                     cancelled_at);
    qsort(holds, n_holds, sizeof *holds, compare_strings); /* the store's order */
    json_t *names = json_array();
    for (size_t h = 0; h < n_holds; h++) {
        json_array_append_new(names, json_string(holds[h]));
    }
    json_t *event = json_pack("{s:s, s:s, s:s, s:s, s:o}", "event", "order.cancelled",
                              "order_id", "ord-esc", "deadline", deadline, "cancelled_at",
                              cancelled_at, "holds", names);
    assert_non_null(event);
    char *want = json_dumps(event, JSON_COMPACT | JSON_PRESERVE_ORDER);
    assert_non_null(strstr(want, "\\u0001\\u001F")); /* escapes were exercised */
    assert_string_equal(seen.body[0], want);
    free(want);
    json_decref(event);
}

/* Every outcome in one batch, an id twice and one that cannot exist: each item is decided
 * as if the items were cancelled one after the other, and only the cancelled release
 * their holds and get an event, in item order. */
static void test_cancel_mixed_batch(void **state) {
    fixture_t *f = *state;
    const char *const holds_a[] = {"h-a2", "h-a1"};
    const char *const holds_b[] = {"h-b"};
    const char *const holds_d[] = {"h-d"};
    lapse_error_t err;
    assert_int_equal(insert(f->store, "ord-a", DEADLINE, holds_a, 2), LAPSE_OK);
    const int64_t later = OPEN_DEADLINE + 60 * 60 * 1000; /* ahead on either clock */
    assert_int_equal(insert(f->store, "ord-b", later, holds_b, 1), LAPSE_OK);
    assert_int_equal(insert(f->store, "ord-c", OPEN_DEADLINE, NULL, 0), LAPSE_OK);
    assert_int_equal(insert(f->store, "ord-d", DEADLINE, holds_d, 1), LAPSE_OK);
    assert_int_equal(insert(f->store, "ord-e", DEADLINE, NULL, 0), LAPSE_OK);
    assert_int_equal(lapse_store_pay(f->store, "ord-c", T0, &err), LAPSE_OK);
    assert_int_equal(cancel(f->store, "ord-e", DEADLINE, NULL), LAPSE_CANCEL_DONE);

    lapse_cancel_item_t items[] = {{.order_id = "ord-d"},    {.order_id = "ord-none"},
                                   {.order_id = "ord-b"},    {.order_id = "ord-a"},
                                   {.order_id = "ord-c"},    {.order_id = "ord-d"},
                                   {.order_id = "no such!"}, {.order_id = "ord-e"}};
    static const lapse_cancel_outcome_t want[] = {
        LAPSE_CANCEL_DONE,    LAPSE_CANCEL_UNKNOWN,       LAPSE_CANCEL_EARLY,
        LAPSE_CANCEL_DONE,    LAPSE_CANCEL_NOOP_PAID,     LAPSE_CANCEL_NOOP_CANCELLED,
        LAPSE_CANCEL_UNKNOWN, LAPSE_CANCEL_NOOP_CANCELLED};
    const int64_t want_deadline[] = {DEADLINE,      0,        later, DEADLINE,
                                     OPEN_DEADLINE, DEADLINE, 0,     DEADLINE};
    size_t n = sizeof(items) / sizeof(items[0]);
    assert_int_equal(lapse_store_cancel_batch(f->store, items, n, DEADLINE + 10, &err),
                     LAPSE_OK);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(items[i].outcome, want[i]);
        assert_int_equal(items[i].deadline_ms, want_deadline[i]);
        if (i != 0 && i != 3) {
            assert_int_equal(items[i].event_seq, 0);
        }
    }
    assert_true(items[0].event_seq > 0 && items[3].event_seq > items[0].event_seq);
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE (seq = %lld AND event_id ="
             " 'order.cancelled:ord-d') OR (seq = %lld AND event_id ="
             " 'order.cancelled:ord-a')",
             (long long)items[0].event_seq, (long long)items[3].event_seq);
    assert_int_equal(query_int(f, sql), 2);
    assert_int_equal(query_int(f, "SELECT count(*) FROM events"), 3);
    assert_int_equal(query_int(f, "SELECT count(*) FROM holds"
                                  " WHERE released_at_ms IS NOT NULL"),
                     3);
    assert_int_equal(query_int(f, "SELECT count(*) FROM holds WHERE order_id = 'ord-b'"
                                  " AND released_at_ms IS NULL"),
                     1);
    assert_int_equal(status_of(f->store, "ord-b"), LAPSE_ORDER_PENDING);
    assert_int_equal(status_of(f->store, "ord-c"), LAPSE_ORDER_PAID);

    /* ord-a's event names its own holds, sorted; ord-d's only its one. */
    seen_t seen = {0};
    const int64_t seqs[] = {items[0].event_seq, items[3].event_seq};
    assert_int_equal(
        lapse_store_events_pending(f->store, 10, seqs, 2, record_event, &seen, &err),
        LAPSE_OK);
    assert_int_equal(seen.n, 2);
    assert_string_equal(seen.event_id[0], "order.cancelled:ord-d");
    assert_non_null(strstr(seen.body[0], "\"holds\":[\"h-d\"]}"));
    assert_string_equal(seen.event_id[1], "order.cancelled:ord-a");
    assert_non_null(strstr(seen.body[1], "\"holds\":[\"h-a1\",\"h-a2\"]}"));
}

static void cancel_three(fixture_t *f, int64_t seqs[3]) {
    static const char *const ids[] = {"ord-1", "ord-2", "ord-3"};
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(insert(f->store, ids[i], DEADLINE, NULL, 0), LAPSE_OK);
        assert_int_equal(cancel(f->store, ids[i], DEADLINE, &seqs[i]), LAPSE_CANCEL_DONE);
    }
    assert_true(seqs[0] < seqs[1] && seqs[1] < seqs[2]);
}

/* More seqs than a page: read a page at a time, handed over oldest first and once each,
 * the limit and a stop holding across pages. */
#define PAGED_N (2 * LAPSE_STORE_EVENTS_PAGE + 100)

typedef struct paged {
    size_t n;
    int64_t seq[PAGED_N + 1];
    size_t stop_after; /* 0: never stop */
} paged_t;

static int record_paged(void *opaque, const lapse_event_t *event) {
    paged_t *p = opaque;
    if (p->n < PAGED_N + 1) {
        p->seq[p->n] = event->seq;
    }
    p->n++;
    return p->stop_after != 0 && p->n == p->stop_after;
}

static void test_events_pending_in_pages(void **state) {
    fixture_t *f = *state;
    static int64_t seqs[PAGED_N], asked[2 * PAGED_N];
    for (size_t i = 0; i < PAGED_N; i++) {
        char id[32];
        snprintf(id, sizeof id, "paged-%04zu", i);
        assert_int_equal(insert(f->store, id, DEADLINE, NULL, 0), LAPSE_OK);
        assert_int_equal(cancel(f->store, id, DEADLINE, &seqs[i]), LAPSE_CANCEL_DONE);
    }
    /* Newest first, each twice, and one that is no event. */
    for (size_t i = 0; i < PAGED_N; i++) {
        asked[2 * i] = asked[2 * i + 1] = seqs[PAGED_N - 1 - i];
    }
    asked[0] = seqs[PAGED_N - 1] + 1000;
    lapse_error_t err;
    static paged_t p;
    memset(&p, 0, sizeof p);
    assert_int_equal(lapse_store_events_pending(f->store, PAGED_N + 10, asked,
                                                2 * PAGED_N, record_paged, &p, &err),
                     LAPSE_OK);
    assert_int_equal(p.n, PAGED_N);
    for (size_t i = 0; i < PAGED_N; i++) {
        assert_int_equal(p.seq[i], seqs[i]);
    }
    /* The limit counts across pages. */
    memset(&p, 0, sizeof p);
    assert_int_equal(lapse_store_events_pending(f->store, LAPSE_STORE_EVENTS_PAGE + 7,
                                                asked, 2 * PAGED_N, record_paged, &p,
                                                &err),
                     LAPSE_OK);
    assert_int_equal(p.n, LAPSE_STORE_EVENTS_PAGE + 7);
    assert_int_equal(p.seq[LAPSE_STORE_EVENTS_PAGE + 6],
                     seqs[LAPSE_STORE_EVENTS_PAGE + 6]);
    /* A stop in the second page ends the walk there. */
    memset(&p, 0, sizeof p);
    p.stop_after = LAPSE_STORE_EVENTS_PAGE + 3;
    assert_int_equal(lapse_store_events_pending(f->store, PAGED_N, asked, 2 * PAGED_N,
                                                record_paged, &p, &err),
                     LAPSE_OK);
    assert_int_equal(p.n, LAPSE_STORE_EVENTS_PAGE + 3);
    /* Those marked published are skipped, in whatever page they were. */
    int64_t odd[PAGED_N / 2];
    for (size_t i = 0; i < PAGED_N / 2; i++) {
        odd[i] = seqs[2 * i + 1];
    }
    assert_int_equal(
        lapse_store_events_mark_published(f->store, odd, PAGED_N / 2, DEADLINE, &err),
        LAPSE_OK);
    memset(&p, 0, sizeof p);
    assert_int_equal(lapse_store_events_pending(f->store, PAGED_N, asked, 2 * PAGED_N,
                                                record_paged, &p, &err),
                     LAPSE_OK);
    assert_int_equal(p.n, PAGED_N / 2);
    for (size_t i = 0; i < PAGED_N / 2; i++) {
        assert_int_equal(p.seq[i], seqs[2 * i]);
    }
}

static void test_events_pending_and_mark_published(void **state) {
    fixture_t *f = *state;
    int64_t seqs[3];
    lapse_error_t err;
    int64_t backlog = -1;
    assert_int_equal(lapse_store_events_count(f->store, &backlog, &err), LAPSE_OK);
    assert_int_equal(backlog, 0);
    cancel_three(f, seqs);
    assert_int_equal(lapse_store_events_count(f->store, &backlog, &err), LAPSE_OK);
    assert_int_equal(backlog, 3);
    assert_int_equal(lapse_store_events_count(NULL, &backlog, &err), LAPSE_ERR_INVALID);
    assert_int_equal(lapse_store_events_count(f->store, NULL, &err), LAPSE_ERR_INVALID);

    release_claims(f);
    seen_t all = {0};
    assert_int_equal(
        lapse_store_events_pending(f->store, 10, NULL, 0, record_event, &all, &err),
        LAPSE_OK);
    assert_int_equal(all.n, 3);
    assert_int_equal(all.seq[0], seqs[0]);
    assert_int_equal(all.seq[2], seqs[2]);
    assert_string_equal(all.event_id[1], "order.cancelled:ord-2");

    release_claims(f);
    seen_t oldest = {0};
    assert_int_equal(
        lapse_store_events_pending(f->store, 2, NULL, 0, record_event, &oldest, &err),
        LAPSE_OK);
    assert_int_equal(oldest.n, 2);
    assert_int_equal(oldest.seq[1], seqs[1]);

    const int64_t done[] = {seqs[0], seqs[1], 424242};
    int64_t before = store_now(f);
    assert_int_equal(
        lapse_store_events_mark_published(f->store, done, 3, DEADLINE + 1, &err),
        LAPSE_OK);
    int64_t after = store_now(f);
    static const char first_published[] =
        "SELECT min(published_at_ms) FROM events WHERE published_at_ms IS NOT NULL";
    int64_t published_at = query_int(f, first_published);
    assert_recorded_time(f, published_at, DEADLINE + 1, before, after);
    /* Marking again keeps the first publication time. */
    assert_int_equal(
        lapse_store_events_mark_published(f->store, done, 1, DEADLINE + 2, &err),
        LAPSE_OK);
    assert_int_equal(query_int(f, first_published), published_at);
    assert_int_equal(query_int(f, "SELECT count(*) FROM events"
                                  " WHERE published_at_ms IS NOT NULL"),
                     2);
    /* The backlog counts only what is still unpublished. */
    assert_int_equal(lapse_store_events_count(f->store, &backlog, &err), LAPSE_OK);
    assert_int_equal(backlog, 1);

    release_claims(f);
    seen_t rest = {0};
    assert_int_equal(
        lapse_store_events_pending(f->store, 10, NULL, 0, record_event, &rest, &err),
        LAPSE_OK);
    assert_int_equal(rest.n, 1);
    assert_int_equal(rest.seq[0], seqs[2]);
}

/* The walk and count of unpublished events over what is published out of order, by two
 * handles: every event left behind is found, however many were published after it, and
 * so is every event written after all before it were published. On SQLite the oldest
 * unpublished seq is kept in events_published_below, where the walk starts (schema
 * version 7); it moves up with each published mark and never past an unpublished event.
 */
static void walk_unpublished(fixture_t *f, seen_t *out) {
    lapse_error_t err;
    release_claims(f);
    memset(out, 0, sizeof *out);
    assert_int_equal(
        lapse_store_events_pending(f->store, 8, NULL, 0, record_event, out, &err),
        LAPSE_OK);
}

static void assert_backlog(fixture_t *f, int64_t want, int64_t below) {
    lapse_error_t err;
    int64_t backlog = -1;
    assert_int_equal(lapse_store_events_count(f->store, &backlog, &err), LAPSE_OK);
    assert_int_equal(backlog, want);
    if (f->sf.backend != SF_PG) {
        assert_int_equal(query_int(f, "SELECT seq FROM events_published_below"), below);
    }
}

static void test_events_left_behind_are_found(void **state) {
    fixture_t *f = *state;
    static const char *const ids[] = {"lb-0", "lb-1", "lb-2", "lb-3",
                                      "lb-4", "lb-5", "lb-6"};
    int64_t s[7];
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(insert(f->store, ids[i], DEADLINE, NULL, 0), LAPSE_OK);
        assert_int_equal(cancel(f->store, ids[i], DEADLINE, &s[i]), LAPSE_CANCEL_DONE);
    }
    lapse_error_t err;
    const int64_t later[] = {s[1], s[2], s[4]};
    assert_int_equal(
        lapse_store_events_mark_published(f->store, later, 3, DEADLINE + 1, &err),
        LAPSE_OK);
    seen_t seen;
    walk_unpublished(f, &seen);
    assert_int_equal(seen.n, 2);
    assert_int_equal(seen.seq[0], s[0]);
    assert_int_equal(seen.seq[1], s[3]);
    assert_backlog(f, 2, s[0]);

    assert_int_equal(
        lapse_store_events_mark_published(f->store, &s[0], 1, DEADLINE + 1, &err),
        LAPSE_OK);
    walk_unpublished(f, &seen);
    assert_int_equal(seen.n, 1);
    assert_int_equal(seen.seq[0], s[3]);
    assert_backlog(f, 1, s[3]);

    /* A mark of an event already published moves nothing past the one left. */
    assert_int_equal(
        lapse_store_events_mark_published(f->store, &s[4], 1, DEADLINE + 2, &err),
        LAPSE_OK);
    assert_backlog(f, 1, s[3]);

    assert_int_equal(
        lapse_store_events_mark_published(f->store, &s[3], 1, DEADLINE + 1, &err),
        LAPSE_OK);
    walk_unpublished(f, &seen);
    assert_int_equal(seen.n, 0);
    assert_backlog(f, 0, s[4] + 1);

    /* Written after everything before them was published, by another handle, which
     * also publishes one of them: the first handle finds the other. */
    lapse_status_t rc;
    lapse_store_t *other = lapse_store_open(f->uri, &rc, &err);
    assert_non_null(other);
    for (size_t i = 5; i < 7; i++) {
        assert_int_equal(insert(other, ids[i], DEADLINE, NULL, 0), LAPSE_OK);
        assert_int_equal(cancel(other, ids[i], DEADLINE, &s[i]), LAPSE_CANCEL_DONE);
    }
    walk_unpublished(f, &seen);
    assert_int_equal(seen.n, 2);
    assert_int_equal(seen.seq[0], s[5]);
    assert_int_equal(seen.seq[1], s[6]);
    assert_backlog(f, 2, s[4] + 1);
    assert_int_equal(lapse_store_events_mark_published(other, &s[6], 1, DEADLINE, &err),
                     LAPSE_OK);
    lapse_store_close(other);
    walk_unpublished(f, &seen);
    assert_int_equal(seen.n, 1);
    assert_int_equal(seen.seq[0], s[5]);
    assert_backlog(f, 1, s[5]);
    assert_int_equal(query_int(f, sf_sql_unpublished(f->sf.backend)), 1);
    if (f->sf.backend != SF_PG) {
        /* The walk and the count start at the stored seq: moved past s5 by hand, they
         * no longer see it (nothing but a mark may move it). */
        exec_sql(f, "UPDATE events_published_below SET seq = seq + 1");
        walk_unpublished(f, &seen);
        assert_int_equal(seen.n, 0);
        assert_backlog(f, 0, s[5] + 1);
        exec_sql(f, "UPDATE events_published_below SET seq = seq - 1");
        /* Its row gone, they read every event with no publication time: s5, and those
         * a mark published by moving the seq past them (s0, marked alone when it was
         * the oldest), published again rather than lost. The next mark writes the row
         * again, and the one after it moves it to the oldest of them. */
        static const char untimed_sql[] =
            "SELECT count(*) FROM events WHERE published_at_ms IS NULL";
        int64_t untimed = query_int(f, untimed_sql);
        assert_true(untimed >= 2);
        assert_int_equal(query_int(f, "SELECT min(seq) FROM events"
                                      " WHERE published_at_ms IS NULL"),
                         s[0]);
        exec_sql(f, "DELETE FROM events_published_below");
        walk_unpublished(f, &seen);
        assert_int_equal((int64_t)seen.n, untimed);
        assert_int_equal(seen.seq[0], s[0]);
        assert_int_equal(seen.seq[seen.n - 1], s[5]);
        assert_int_equal(
            lapse_store_events_mark_published(f->store, &s[6], 1, DEADLINE, &err),
            LAPSE_OK);
        assert_int_equal(query_int(f, "SELECT seq FROM events_published_below"), 1);
        assert_int_equal(
            lapse_store_events_mark_published(f->store, &s[6], 1, DEADLINE, &err),
            LAPSE_OK);
        assert_backlog(f, untimed, s[0]);
    }
}

static void test_events_pending_filters_by_seq(void **state) {
    fixture_t *f = *state;
    int64_t seqs[3];
    lapse_error_t err;
    cancel_three(f, seqs);
    assert_int_equal(
        lapse_store_events_mark_published(f->store, &seqs[1], 1, DEADLINE, &err),
        LAPSE_OK);

    /* Unordered, repeated, published and unknown seqs: the unpublished ones, once each,
     * oldest first. */
    const int64_t wanted[] = {seqs[2], seqs[1], seqs[0], seqs[2], 999999};
    seen_t seen = {0};
    assert_int_equal(
        lapse_store_events_pending(f->store, 10, wanted, 5, record_event, &seen, &err),
        LAPSE_OK);
    assert_int_equal(seen.n, 2);
    assert_int_equal(seen.seq[0], seqs[0]);
    assert_int_equal(seen.seq[1], seqs[2]);

    seen_t limited = {0};
    assert_int_equal(
        lapse_store_events_pending(f->store, 1, wanted, 5, record_event, &limited, &err),
        LAPSE_OK);
    assert_int_equal(limited.n, 1);
    assert_int_equal(limited.seq[0], seqs[0]);
}

/* Seqs one after the other (a round of a consumer's own cancellations, read and marked
 * as a range of seqs where the store can): the same outcome as any other set. */
static void test_events_in_a_run(void **state) {
    fixture_t *f = *state;
    int64_t seqs[3];
    lapse_error_t err;
    cancel_three(f, seqs);
    /* The last two and one past them that is no event. */
    const int64_t tail[] = {seqs[1], seqs[2], seqs[2] + 1};
    assert_int_equal(
        lapse_store_events_mark_published(f->store, tail, 3, DEADLINE + 1, &err),
        LAPSE_OK);
    const char *marked = sf_sql_published(f->sf.backend);
    assert_int_equal(query_int(f, marked), 2);
    static const char second[] = "SELECT published_at_ms FROM events"
                                 " WHERE event_id = 'order.cancelled:ord-2'";
    int64_t second_at = query_int(f, second);
    const int64_t all[] = {seqs[0], seqs[1], seqs[2]};
    seen_t seen = {0};
    assert_int_equal(
        lapse_store_events_pending(f->store, 10, all, 3, record_event, &seen, &err),
        LAPSE_OK);
    assert_int_equal(seen.n, 1);
    assert_int_equal(seen.seq[0], seqs[0]);
    /* The first two: the first gets marked, the second keeps its first time. */
    assert_int_equal(
        lapse_store_events_mark_published(f->store, all, 2, DEADLINE + 2, &err),
        LAPSE_OK);
    assert_int_equal(query_int(f, marked), 3);
    assert_int_equal(query_int(f, second), second_at);
    memset(&seen, 0, sizeof seen);
    assert_int_equal(
        lapse_store_events_pending(f->store, 10, all, 3, record_event, &seen, &err),
        LAPSE_OK);
    assert_int_equal(seen.n, 0);
}

/* A round marked as the run it is, from the oldest unpublished event on: published,
 * the events cancelled after it are not. On SQLite the mark moves events_published_below
 * past the run and writes none of its rows, but never past the last event: seqs marked
 * that no event has yet must not make the next events published. */
static void test_events_run_from_the_oldest(void **state) {
    fixture_t *f = *state;
    int64_t seqs[3], later;
    lapse_error_t err;
    seen_t seen;
    cancel_three(f, seqs);
    const int64_t run[] = {seqs[0], seqs[0] + 1, seqs[0] + 2};
    assert_int_equal(seqs[2], run[2]);
    assert_int_equal(lapse_store_events_mark_published(f->store, run, 3, DEADLINE, &err),
                     LAPSE_OK);
    walk_unpublished(f, &seen);
    assert_int_equal(seen.n, 0);
    assert_backlog(f, 0, seqs[2] + 1);
    assert_int_equal(query_int(f, sf_sql_published(f->sf.backend)), 3);
    if (f->sf.backend != SF_PG) {
        assert_int_equal(
            query_int(f, "SELECT count(*) FROM events WHERE published_at_ms IS NULL"), 3);
    }
    /* Past the last event: the seqs after it are no events yet, and stay unpublished
     * once they are. */
    assert_int_equal(insert(f->store, "ord-4", DEADLINE, NULL, 0), LAPSE_OK);
    assert_int_equal(cancel(f->store, "ord-4", DEADLINE, &later), LAPSE_CANCEL_DONE);
    const int64_t beyond[] = {later, later + 1, later + 2};
    assert_int_equal(
        lapse_store_events_mark_published(f->store, beyond, 3, DEADLINE, &err), LAPSE_OK);
    assert_backlog(f, 0, later + 1);
    int64_t next[2];
    static const char *const ids[] = {"ord-5", "ord-6"};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(insert(f->store, ids[i], DEADLINE, NULL, 0), LAPSE_OK);
        assert_int_equal(cancel(f->store, ids[i], DEADLINE, &next[i]), LAPSE_CANCEL_DONE);
    }
    if (f->sf.backend != SF_PG) {
        assert_int_equal(next[0], later + 1); /* what the guard is about */
    }
    walk_unpublished(f, &seen);
    assert_int_equal(seen.n, 2);
    assert_int_equal(seen.seq[0], next[0]);
    assert_int_equal(seen.seq[1], next[1]);
    assert_backlog(f, 2, later + 1);
    /* Asked for by seq, a round published by the jump is not handed out again. */
    const int64_t again[] = {seqs[0], seqs[1], next[0]};
    release_claims(f);
    memset(&seen, 0, sizeof seen);
    assert_int_equal(
        lapse_store_events_pending(f->store, 10, again, 3, record_event, &seen, &err),
        LAPSE_OK);
    assert_int_equal(seen.n, 1);
    assert_int_equal(seen.seq[0], next[0]);
}

static void test_events_pending_stops_when_callback_says_so(void **state) {
    fixture_t *f = *state;
    int64_t seqs[3];
    lapse_error_t err;
    cancel_three(f, seqs);
    release_claims(f);
    seen_t seen = {.stop_after = 1};
    assert_int_equal(
        lapse_store_events_pending(f->store, 10, NULL, 0, record_event, &seen, &err),
        LAPSE_OK);
    assert_int_equal(seen.n, 1);
}

static void test_events_pending_callback_may_use_the_store(void **state) {
    fixture_t *f = *state;
    int64_t seqs[3];
    lapse_error_t err;
    cancel_three(f, seqs);
    release_claims(f);
    seen_t seen = {.publish = f->store};
    assert_int_equal(
        lapse_store_events_pending(f->store, 10, NULL, 0, record_event, &seen, &err),
        LAPSE_OK);
    assert_int_equal(seen.n, 3);
    assert_int_equal(query_int(f, sf_sql_unpublished(f->sf.backend)), 0);
}

static void test_count(void **state) {
    fixture_t *f = *state;
    lapse_error_t err;
    int64_t counts[3] = {-1, -1, -1};
    assert_int_equal(lapse_store_count(f->store, counts, &err), LAPSE_OK);
    assert_int_equal(counts[LAPSE_ORDER_PENDING], 0);
    assert_int_equal(counts[LAPSE_ORDER_PAID], 0);
    assert_int_equal(counts[LAPSE_ORDER_CANCELLED], 0);

    static const char *const ids[] = {"o-1", "o-2", "o-3", "o-4", "o-5", "o-6"};
    for (size_t i = 0; i < 6; i++) {
        assert_int_equal(
            insert(f->store, ids[i], i == 0 ? OPEN_DEADLINE : DEADLINE, NULL, 0),
            LAPSE_OK);
    }
    assert_int_equal(lapse_store_pay(f->store, "o-1", T0, &err), LAPSE_OK);
    assert_int_equal(cancel(f->store, "o-2", DEADLINE, NULL), LAPSE_CANCEL_DONE);
    assert_int_equal(cancel(f->store, "o-3", DEADLINE, NULL), LAPSE_CANCEL_DONE);
    assert_int_equal(lapse_store_count(f->store, counts, &err), LAPSE_OK);
    assert_int_equal(counts[LAPSE_ORDER_PENDING], 3);
    assert_int_equal(counts[LAPSE_ORDER_PAID], 1);
    assert_int_equal(counts[LAPSE_ORDER_CANCELLED], 2);
}

/* Settled orders and published events go once their times are behind the cutoff; what
 * is pending or unpublished stays. Times come from the store's clock, so the test holds
 * on a store whose own clock decides. */
static void test_prune_removes_only_what_is_settled_and_old(void **state) {
    fixture_t *f = *state;
    lapse_error_t err;
    int64_t now = 0;
    assert_int_equal(lapse_store_now(f->store, &now, &err), LAPSE_OK);
    const int64_t hour = INT64_C(3600000);
    static const char *const seat[] = {"seat:1"};
    assert_int_equal(insert(f->store, "paid-1", now + hour, NULL, 0), LAPSE_OK);
    assert_int_equal(insert(f->store, "gone-1", now - 1000, seat, 1), LAPSE_OK);
    assert_int_equal(insert(f->store, "gone-2", now - 1000, NULL, 0), LAPSE_OK);
    assert_int_equal(insert(f->store, "wait-1", now - 1000, NULL, 0), LAPSE_OK);
    assert_int_equal(lapse_store_pay(f->store, "paid-1", now, &err), LAPSE_OK);
    int64_t seq1 = 0, seq2 = 0;
    assert_int_equal(cancel(f->store, "gone-1", now, &seq1), LAPSE_CANCEL_DONE);
    assert_int_equal(cancel(f->store, "gone-2", now, &seq2), LAPSE_CANCEL_DONE);
    /* gone-1's event is published, gone-2's is not. */
    assert_int_equal(lapse_store_events_mark_published(f->store, &seq1, 1, now, &err),
                     LAPSE_OK);

    int64_t orders = -1, events = -1;
    /* A cutoff before the paid order's deadline keeps it; gone-2 stays while its event
     * waits in the outbox; limit 1 takes one at a time. */
    assert_int_equal(
        lapse_store_prune(f->store, now + hour / 2, 1, &orders, &events, &err), LAPSE_OK);
    assert_int_equal(orders, 1);
    assert_int_equal(events, 1);
    assert_int_equal(
        lapse_store_prune(f->store, now + hour / 2, 10, &orders, &events, &err),
        LAPSE_OK);
    assert_int_equal(orders, 0);
    assert_int_equal(events, 0);
    assert_int_equal(status_of(f->store, "paid-1"), LAPSE_ORDER_PAID);
    assert_int_equal(status_of(f->store, "gone-2"), LAPSE_ORDER_CANCELLED);
    lapse_order_t order;
    lapse_order_init(&order);
    assert_int_equal(lapse_store_get(f->store, "gone-1", &order, &err),
                     LAPSE_ERR_STORE_NOT_FOUND);
    /* Past the paid order's deadline too: it goes; the pending one never does. */
    assert_int_equal(
        lapse_store_prune(f->store, now + 2 * hour, 10, &orders, &events, &err),
        LAPSE_OK);
    assert_int_equal(orders, 1);
    assert_int_equal(events, 0);
    assert_int_equal(status_of(f->store, "wait-1"), LAPSE_ORDER_PENDING);
    int64_t counts[3];
    assert_int_equal(lapse_store_count(f->store, counts, &err), LAPSE_OK);
    assert_int_equal(counts[LAPSE_ORDER_PENDING], 1);
    assert_int_equal(counts[LAPSE_ORDER_PAID], 0);
    assert_int_equal(counts[LAPSE_ORDER_CANCELLED], 1);
    int64_t backlog = -1;
    assert_int_equal(lapse_store_events_count(f->store, &backlog, &err), LAPSE_OK);
    assert_int_equal(backlog, 1);
    /* Once its event is published, gone-2 goes too, with the event. */
    assert_int_equal(lapse_store_events_mark_published(f->store, &seq2, 1, now, &err),
                     LAPSE_OK);
    assert_int_equal(
        lapse_store_prune(f->store, now + 2 * hour, 10, &orders, &events, &err),
        LAPSE_OK);
    assert_int_equal(orders, 1);
    assert_int_equal(events, 1);
    assert_int_equal(lapse_store_get(f->store, "gone-2", &order, &err),
                     LAPSE_ERR_STORE_NOT_FOUND);
    /* A pruned id is free again: publishing it anew is a new order. */
    assert_int_equal(insert(f->store, "gone-1", now + hour, NULL, 0), LAPSE_OK);
    assert_int_equal(status_of(f->store, "gone-1"), LAPSE_ORDER_PENDING);
    assert_int_equal(lapse_store_prune(NULL, now, 1, &orders, &events, &err),
                     LAPSE_ERR_INVALID);
}

/* The prune walks the outbox by seq from its oldest row and stops at the first event
 * created at or after the cutoff (PRUNE_EVENTS of either backend): an old published
 * event written after a younger one waits for a later prune; nothing young or
 * unpublished goes. */
static void test_prune_events_walk_stops_at_the_first_young_event(void **state) {
    fixture_t *f = *state;
    bool pg = f->sf.backend == SF_PG;
    /* The seqs left, as one number. */
    const char *left = pg ? "SELECT coalesce(string_agg(seq::text, '' ORDER BY seq), '0')"
                            "::bigint FROM events"
                          : "SELECT group_concat(seq, '') FROM events";
    char sql[512];
    snprintf(sql, sizeof sql,
             "INSERT INTO events (seq, event_id, order_id, body, created_at_ms,"
             " published_at_ms) %s VALUES"
             " (1, 'order.cancelled:e1', 'e1', '{}', 1000, 1100),"
             " (2, 'order.cancelled:e2', 'e2', '{}', 1200, NULL),"
             " (3, 'order.cancelled:e3', 'e3', '{}', 1300, 1400),"
             " (4, 'order.cancelled:e4', 'e4', '{}', 5000, 5100),"
             " (5, 'order.cancelled:e5', 'e5', '{}', 1500, 1600),"
             " (6, 'order.cancelled:e6', 'e6', '{}', 6000, 6100)",
             pg ? "OVERRIDING SYSTEM VALUE" : ""); /* seq is an identity column there */
    exec_sql(f, sql);
    lapse_error_t err;
    int64_t orders = -1, events = -1;
    assert_int_equal(lapse_store_prune(f->store, 2000, 10, &orders, &events, &err),
                     LAPSE_OK);
    assert_int_equal(events, 2);
    assert_int_equal(query_int(f, left), 2456);
    /* Limit 1: the oldest first. */
    assert_int_equal(lapse_store_prune(f->store, 5500, 1, &orders, &events, &err),
                     LAPSE_OK);
    assert_int_equal(events, 1);
    assert_int_equal(query_int(f, left), 256);
    assert_int_equal(lapse_store_prune(f->store, 5500, 10, &orders, &events, &err),
                     LAPSE_OK);
    assert_int_equal(events, 1);
    assert_int_equal(query_int(f, left), 26);
    assert_int_equal(lapse_store_prune(f->store, 9000, 10, &orders, &events, &err),
                     LAPSE_OK);
    assert_int_equal(events, 1);
    assert_int_equal(query_int(f, left), 2);
    if (!pg) {
        /* Below events_published_below's seq an event is published with no time of its
         * own (a mark moved the seq past it): it goes once it was created before the
         * cutoff. */
        exec_sql(f, "UPDATE events_published_below SET seq = 3");
        assert_int_equal(lapse_store_prune(f->store, 1100, 10, &orders, &events, &err),
                         LAPSE_OK);
        assert_int_equal(events, 0);
        assert_int_equal(lapse_store_prune(f->store, 1300, 10, &orders, &events, &err),
                         LAPSE_OK);
        assert_int_equal(events, 1);
        assert_int_equal(query_int(f, "SELECT count(*) FROM events"), 0);
    }
}

static void test_names_are_static_strings(void **state) {
    (void)state;
    assert_string_equal(lapse_order_status_name(LAPSE_ORDER_PENDING), "pending");
    assert_string_equal(lapse_order_status_name(LAPSE_ORDER_PAID), "paid");
    assert_string_equal(lapse_order_status_name(LAPSE_ORDER_CANCELLED), "cancelled");
    assert_string_equal(lapse_cancel_outcome_name(LAPSE_CANCEL_DONE), "cancelled");
    assert_string_equal(lapse_cancel_outcome_name(LAPSE_CANCEL_NOOP_PAID), "noop_paid");
    assert_string_equal(lapse_cancel_outcome_name(LAPSE_CANCEL_NOOP_CANCELLED),
                        "noop_cancelled");
    assert_string_equal(lapse_cancel_outcome_name(LAPSE_CANCEL_EARLY), "early");
    assert_string_equal(lapse_cancel_outcome_name(LAPSE_CANCEL_UNKNOWN), "unknown");
    lapse_store_close(NULL);
}

#define RACE_ORDERS 200
#define RACE_BATCH  3

/* Written by the two racing processes, read by the test afterwards. */
typedef struct race {
    lapse_status_t pay_rc[RACE_ORDERS];
    lapse_cancel_outcome_t outcome[RACE_ORDERS];
    int64_t event_seq[RACE_ORDERS];
} race_t;

static void race_id(char *buf, size_t cap, int i) {
    snprintf(buf, cap, "race-%03d", i);
}

/* Called between transactions. Without a pause, whichever side takes the write lock first
 * runs all its transactions while the other sleeps in SQLite's busy handler, and no order
 * is ever contested. */
static void let_the_other_side_in(void) {
    struct timespec pause = {.tv_sec = 0, .tv_nsec = 200 * 1000};
    nanosleep(&pause, NULL);
}

/* One side of the race, in a child process with a handle of its own. The payer walks the
 * orders upwards and the canceller downwards, in batches, so each side wins some orders
 * outright, both attempt every order, and they collide where they meet. Returns the exit
 * status: the child must not touch cmocka's state. */
static int race_side(bool pays, const char *uri, race_t *race, int ready_fd, int go_fd) {
    lapse_status_t rc;
    lapse_error_t err;
    lapse_store_t *store = lapse_store_open(uri, &rc, &err);
    char byte = 'r';
    if (store == NULL || write(ready_fd, &byte, 1) != 1) {
        return 2;
    }
    /* Blocks until the parent closes the pipe, releasing both sides at once. */
    if (read(go_fd, &byte, 1) != 0) {
        return 3;
    }
    char ids[RACE_BATCH][16];
    for (int i = 0; pays && i < RACE_ORDERS; i++) {
        race_id(ids[0], sizeof(ids[0]), i);
        do {
            rc = lapse_store_pay(store, ids[0], DEADLINE - 1, &err);
        } while (rc == LAPSE_ERR_STORE_BUSY);
        race->pay_rc[i] = rc;
        let_the_other_side_in();
        if (sf_backend() == SF_PG) {
            /* Slow enough that the deadline passes while payments are still made. */
            usleep(1000);
        }
    }
    for (int i = RACE_ORDERS - 1; !pays && i >= 0; i -= RACE_BATCH) {
        lapse_cancel_item_t items[RACE_BATCH];
        size_t n = 0;
        for (; n < RACE_BATCH && i - (int)n >= 0; n++) {
            race_id(ids[n], sizeof(ids[n]), i - (int)n);
            items[n] = (lapse_cancel_item_t){.order_id = ids[n]};
        }
        /* Until the store has decided each order: on PostgreSQL one may still be early
         * (the server's clock has not reached its deadline yet) or its row held by the
         * payer's transaction; on SQLite neither happens. */
        for (bool undecided = true; undecided;) {
            do {
                rc = lapse_store_cancel_batch(store, items, n, DEADLINE, &err);
            } while (rc == LAPSE_ERR_STORE_BUSY);
            if (rc != LAPSE_OK) {
                return 4;
            }
            undecided = false;
            for (size_t k = 0; k < n; k++) {
                undecided |= items[k].outcome == LAPSE_CANCEL_EARLY ||
                             items[k].outcome == LAPSE_CANCEL_BUSY;
                race->outcome[i - (int)k] = items[k].outcome;
                race->event_seq[i - (int)k] = items[k].event_seq;
            }
            let_the_other_side_in();
        }
    }
    lapse_store_close(store);
    return 0;
}

/* On SQLite the caller's clock makes every payment in time (DEADLINE - 1) and every
 * cancel due (DEADLINE). On PostgreSQL the server's clock decides: the deadline is set
 * to pass while the two sides run, so payments early on are in time, cancels early on
 * are early (and tried again), and late payments of orders not yet cancelled lapse. */
static void test_pay_races_cancel_from_two_connections(void **state) {
    fixture_t *f = *state;
    bool pg = f->sf.backend == SF_PG;
    if (pg) {
        t0_ms = store_now(f) + 1500 - 30 * 60 * 1000;
    }
    for (int i = 0; i < RACE_ORDERS; i++) {
        char id[16], seat[24], slot[24];
        race_id(id, sizeof(id), i);
        snprintf(seat, sizeof(seat), "seat-%03d", i);
        snprintf(slot, sizeof(slot), "slot-%03d", i);
        const char *const holds[] = {seat, slot};
        assert_int_equal(insert(f->store, id, DEADLINE, holds, 2), LAPSE_OK);
    }
    /* No SQLite connection may cross a fork. */
    lapse_store_close(f->store);
    f->store = NULL;

    race_t *race = mmap(NULL, sizeof(*race), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(race != MAP_FAILED);
    int ready[2], go[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(go), 0);
    pid_t kids[2];
    for (int side = 0; side < 2; side++) {
        kids[side] = fork();
        assert_true(kids[side] >= 0);
        if (kids[side] == 0) {
            close(ready[0]);
            close(go[1]);
            _exit(race_side(side == 0, f->uri, race, ready[1], go[0]));
        }
    }
    close(ready[1]);
    close(go[0]);
    char byte;
    for (int side = 0; side < 2; side++) {
        assert_int_equal(read(ready[0], &byte, 1), 1);
    }
    /* PostgreSQL: go 100 ms before the deadline (the server runs on this machine's
     * clock). */
    while (pg && lapse_clock_now_ms() < DEADLINE - 100) {
        usleep(1000);
    }
    close(go[1]);
    for (int side = 0; side < 2; side++) {
        int status = 0;
        assert_int_equal(waitpid(kids[side], &status, 0), kids[side]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    close(ready[0]);

    /* Exactly one side won each order, and the loser was told why. */
    lapse_status_t rc;
    lapse_error_t err;
    f->store = lapse_store_open(f->uri, &rc, &err);
    assert_non_null(f->store);
    int64_t paid = 0, cancelled = 0;
    for (int i = 0; i < RACE_ORDERS; i++) {
        char id[16];
        race_id(id, sizeof(id), i);
        lapse_order_status_t status = status_of(f->store, id);
        if (status == LAPSE_ORDER_PAID) {
            paid++;
            assert_int_equal(race->pay_rc[i], LAPSE_OK);
            assert_int_equal(race->outcome[i], LAPSE_CANCEL_NOOP_PAID);
            assert_int_equal(race->event_seq[i], 0);
        } else {
            cancelled++;
            assert_int_equal(status, LAPSE_ORDER_CANCELLED);
            if (!pg || race->pay_rc[i] != LAPSE_ERR_STORE_LAPSED) {
                assert_int_equal(race->pay_rc[i], LAPSE_ERR_STORE_STATE);
            }
            assert_int_equal(race->outcome[i], LAPSE_CANCEL_DONE);
            assert_true(race->event_seq[i] > 0);
        }
    }
    int64_t lapsed = 0;
    for (int i = 0; i < RACE_ORDERS; i++) {
        lapsed += race->pay_rc[i] == LAPSE_ERR_STORE_LAPSED;
    }
    print_message("race: %lld paid, %lld cancelled (%lld payments lapsed first)\n",
                  (long long)paid, (long long)cancelled, (long long)lapsed);
    assert_int_equal(paid + cancelled, RACE_ORDERS);
    assert_int_equal(query_int(f, "SELECT count(*) FROM events"), cancelled);
    assert_int_equal(query_int(f, "SELECT count(DISTINCT order_id) FROM events"),
                     cancelled);
    assert_int_equal(query_int(f, "SELECT count(*) FROM holds"
                                  " WHERE released_at_ms IS NOT NULL"),
                     2 * cancelled);
    assert_int_equal(query_int(f,
                               "SELECT count(*) FROM holds JOIN orders USING (order_id)"
                               " WHERE (released_at_ms IS NOT NULL)"
                               " != (status = 'cancelled')"),
                     0);
    munmap(race, sizeof(*race));
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_open_must_exist),
        cmocka_unit_test(test_open_must_exist_sqlite_paths),
        T(test_open_creates_the_tables),
        T(test_new_store_files_are_0600),
        cmocka_unit_test(test_open_bad_uri),
        cmocka_unit_test(test_names_are_static_strings),
        T(test_prune_removes_only_what_is_settled_and_old),
        T(test_prune_events_walk_stops_at_the_first_young_event),
        T(test_open_uses_wal_and_versioned_schema),
        T(test_open_refuses_newer_schema),
        T(test_open_upgrades_a_version_2_schema),
        T(test_insert_is_idempotent_for_same_deadline),
        T(test_insert_conflicts_on_other_deadline),
        T(test_insert_refuses_order_no_longer_pending),
        T(test_insert_records_holds_sorted_without_duplicates),
        T(test_insert_rejects_invalid_input_and_writes_nothing),
        T(test_mark_scheduled_sets_flag),
        T(test_get_unknown_is_not_found),
        T(test_pay_before_deadline_marks_paid),
        T(test_pay_after_deadline_is_refused),
        T(test_pay_cancelled_is_refused),
        T(test_pay_unknown),
        T(test_pay_twice_is_ok),
        T(test_cancel_before_deadline_is_refused),
        T(test_cancel_at_deadline_cancels),
        T(test_cancel_after_deadline_releases_holds_once),
        T(test_cancel_paid_is_noop),
        T(test_cancel_unknown_order),
        T(test_cancel_same_order_twice_in_one_batch),
        T(test_cancel_batch_event_seqs),
        T(test_cancel_batch_failure_writes_nothing),
        T(test_cancel_mixed_batch),
        T(test_cancel_event_body_names_order_deadline_and_holds),
        T(test_cancel_event_body_is_stored_as_written),
        T(test_cancel_event_body_without_holds),
        T(test_events_pending_refuses_a_row_without_body_or_deadline),
        T(test_events_pending_and_mark_published),
        T(test_events_pending_in_pages),
        T(test_events_left_behind_are_found),
        T(test_events_pending_filters_by_seq),
        T(test_events_in_a_run),
        T(test_events_run_from_the_oldest),
        T(test_events_pending_stops_when_callback_says_so),
        T(test_events_pending_callback_may_use_the_store),
        T(test_count),
        T(test_pay_races_cancel_from_two_connections),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}

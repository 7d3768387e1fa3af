/* SPDX-License-Identifier: MIT
 * The sweeper's store-side work on a temporary SQLite file, or a database of its own on
 * the test cluster (LAPSE_TEST_STORE=postgresql, see store_fixture.h), with no broker:
 * the grace period, exactly-once direct cancellation, dry runs, limits, a busy store, and
 * a broker out of reach that must not stop the cancelling. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include <lapse/store.h>
#include <lapse/sweep.h>

#include "store_fixture.h"

#define SEC      INT64_C(1000)
#define BAD_AMQP "amqp://guest:guest@127.0.0.1:1/%2f" /* nothing listens on port 1 */

typedef struct fixture {
    sf_store_t sf;
    lapse_store_t *store;
    lapse_config_t *cfg;
    char log[16384]; /* every log line, '\n'-separated */
    int64_t now;     /* the wall clock when the test began */
} fixture_t;

static void capture_log(void *opaque, lapse_log_level_t level, const char *line) {
    (void)level;
    fixture_t *f = opaque;
    size_t len = strlen(f->log);
    snprintf(f->log + len, sizeof(f->log) - len, "%s\n", line);
}

static int setup(void **state) {
    fixture_t *f = calloc(1, sizeof(*f));
    if (f == NULL) {
        return -1;
    }
    if (sf_create(&f->sf, "sweep", NULL, NULL) != 0) {
        free(f);
        return -1;
    }
    lapse_status_t rc;
    lapse_error_t err;
    f->store = lapse_store_open(f->sf.uri, &rc, &err);
    f->cfg = lapse_config_new();
    if (f->store == NULL || f->cfg == NULL ||
        lapse_config_set(f->cfg, "amqp_url", BAD_AMQP, &err) != LAPSE_OK) {
        return -1;
    }
    lapse_config_set_log_cb(f->cfg, capture_log, f);
    f->now = lapse_clock_now_ms();
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture_t *f = *state;
    lapse_store_close(f->store);
    lapse_config_free(f->cfg);
    int rc = sf_drop(&f->sf);
    free(f);
    return rc;
}

static int64_t query_int(const fixture_t *f, const char *sql) {
    char err[1024];
    int64_t value = -1;
    sf_conn_t *c = sf_connect(&f->sf, true, err, sizeof(err));
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

/* An order created created_ago ms before the test began, due deadline_in ms after it
 * (negative: in the past), marked scheduled when scheduled. */
static void order(fixture_t *f, const char *order_id, int64_t deadline_in,
                  int64_t created_ago, bool scheduled, const char *const *holds,
                  size_t n_holds) {
    lapse_new_order_t o = {.order_id = order_id,
                           .deadline_ms = f->now + deadline_in,
                           .created_at_ms = f->now - created_ago,
                           .holds = holds,
                           .n_holds = n_holds};
    lapse_status_t result = LAPSE_ERR_INVALID;
    lapse_error_t err;
    assert_int_equal(lapse_store_insert_orders(f->store, &o, 1, &result, &err), LAPSE_OK);
    assert_int_equal(result, LAPSE_OK);
    if (scheduled) {
        assert_int_equal(lapse_store_mark_scheduled(f->store, &order_id, 1, &err),
                         LAPSE_OK);
    }
}

static lapse_order_t get(fixture_t *f, const char *order_id) {
    lapse_order_t o;
    lapse_error_t err;
    lapse_order_init(&o);
    assert_int_equal(lapse_store_get(f->store, order_id, &o, &err), LAPSE_OK);
    return o;
}

static lapse_order_status_t status_of(fixture_t *f, const char *order_id) {
    lapse_order_t o = get(f, order_id);
    lapse_order_status_t status = o.status;
    lapse_order_clear(&o);
    return status;
}

/* The store-only part: no re-publishing, so no broker is involved at all. */
static lapse_status_t sweep_store_only(fixture_t *f, lapse_sweep_opts_t *opts,
                                       lapse_sweep_report_t *report, lapse_error_t *err) {
    opts->republish = false;
    opts->events = false;
    return lapse_sweep_run(f->cfg, f->store, opts, report, err);
}

static size_t count_lines(const char *text, const char *needle) {
    size_t n = 0;
    for (const char *p = strstr(text, needle); p != NULL; p = strstr(p + 1, needle)) {
        n++;
    }
    return n;
}

static void test_opts_defaults(void **state) {
    (void)state;
    lapse_sweep_opts_t opts;
    memset(&opts, 0x5a, sizeof(opts));
    lapse_sweep_opts_init(&opts);
    assert_int_equal(opts.grace_ms, 60 * SEC);
    assert_int_equal(opts.in_flight_ms, 30 * SEC);
    assert_false(opts.dry_run);
    assert_true(opts.republish);
    assert_true(opts.cancel);
    assert_int_equal(opts.max_orders, 0);
    assert_true(opts.events);
    assert_null(opts.progress);
    lapse_sweep_opts_init(NULL);
}

static void test_sweep_rejects_bad_arguments(void **state) {
    fixture_t *f = *state;
    lapse_sweep_opts_t opts;
    lapse_sweep_report_t report;
    lapse_error_t err;
    lapse_sweep_opts_init(&opts);
    assert_int_equal(lapse_sweep_run(NULL, f->store, &opts, &report, &err),
                     LAPSE_ERR_INVALID);
    assert_int_equal(lapse_sweep_run(f->cfg, NULL, &opts, &report, &err),
                     LAPSE_ERR_INVALID);
    assert_int_equal(lapse_sweep_run(f->cfg, f->store, &opts, NULL, &err),
                     LAPSE_ERR_INVALID);
    opts.grace_ms = -1;
    assert_int_equal(lapse_sweep_run(f->cfg, f->store, &opts, &report, &err),
                     LAPSE_ERR_INVALID);
}

/* Past its deadline but within the grace period: its message may still be on its way,
 * so it is left alone. Past deadline + grace: cancelled directly, holds released, one
 * event. Paid and future orders are untouched. */
static void test_sweep_cancels_only_past_deadline_plus_grace(void **state) {
    fixture_t *f = *state;
    const char *holds[] = {"seat-1", "seat-2"};
    order(f, "in-grace", -30 * SEC, 3600 * SEC, true, holds, 2);
    order(f, "lost", -90 * SEC, 3600 * SEC, true, holds, 2);
    order(f, "paid", 600 * SEC, 3600 * SEC, true, holds, 2);
    order(f, "future", 600 * SEC, 60 * SEC, true, NULL, 0);
    lapse_error_t err;
    /* Paid in its window (by either store's clock), which has since closed: the row is
     * dated back to a payment 100 s ago and a deadline 90 s ago. */
    assert_int_equal(lapse_store_pay(f->store, "paid", f->now, &err), LAPSE_OK);
    char sql[160];
    snprintf(sql, sizeof(sql),
             "UPDATE orders SET deadline_ms = %lld, paid_at_ms = %lld"
             " WHERE order_id = 'paid'",
             (long long)(f->now - 90 * SEC), (long long)(f->now - 100 * SEC));
    exec_sql(f, sql);

    lapse_sweep_opts_t opts;
    lapse_sweep_report_t report;
    lapse_sweep_opts_init(&opts);
    assert_int_equal(sweep_store_only(f, &opts, &report, &err), LAPSE_OK);
    assert_int_equal(report.cancelled, 1);
    assert_int_equal(report.failed, 0);
    assert_int_equal(report.would_cancel, 0);
    assert_false(report.more);

    lapse_order_t lost = get(f, "lost");
    assert_int_equal(lost.status, LAPSE_ORDER_CANCELLED);
    assert_true(lost.cancelled_at_ms >= f->now);
    lapse_order_clear(&lost);
    assert_int_equal(status_of(f, "in-grace"), LAPSE_ORDER_PENDING);
    assert_int_equal(status_of(f, "paid"), LAPSE_ORDER_PAID);
    assert_int_equal(status_of(f, "future"), LAPSE_ORDER_PENDING);
    assert_int_equal(query_int(f, "SELECT count(*) FROM holds WHERE order_id = 'lost'"
                                  " AND released_at_ms IS NOT NULL"),
                     2);
    assert_int_equal(query_int(f, "SELECT count(*) FROM holds"
                                  " WHERE released_at_ms IS NOT NULL"),
                     2);
    assert_int_equal(query_int(f, "SELECT count(*) FROM events"), 1);
    char lost_unpublished[512];
    snprintf(lost_unpublished, sizeof lost_unpublished,
             "SELECT count(*) FROM events WHERE event_id = 'order.cancelled:lost' AND %s",
             sf_unpublished_where(f->sf.backend));
    assert_int_equal(query_int(f, lost_unpublished), 1);
    /* One grep-able line for it, with the lag behind its deadline. */
    print_message("%s", f->log);
    assert_int_equal(count_lines(f->log, "event=sweep_cancel order_id=lost "), 1);
    assert_int_equal(count_lines(f->log, "event=sweep_cancel"), 1);
    assert_non_null(strstr(f->log, "lag_ms=9"));

    /* A shorter grace reaches the other one; a second run finds nothing. */
    opts.grace_ms = 10 * SEC;
    assert_int_equal(sweep_store_only(f, &opts, &report, &err), LAPSE_OK);
    assert_int_equal(report.cancelled, 1);
    assert_int_equal(status_of(f, "in-grace"), LAPSE_ORDER_CANCELLED);
    assert_int_equal(sweep_store_only(f, &opts, &report, &err), LAPSE_OK);
    assert_int_equal(report.cancelled, 0);
    assert_int_equal(report.skipped, 0);
    assert_int_equal(query_int(f, "SELECT count(*) FROM events"), 2);
    assert_int_equal(query_int(f, "SELECT count(DISTINCT order_id) FROM events"), 2);
    assert_int_equal(count_lines(f->log, "event=sweep_cancel"), 2);
}

static void test_sweep_dry_run_changes_nothing(void **state) {
    fixture_t *f = *state;
    order(f, "lost", -90 * SEC, 3600 * SEC, true, NULL, 0);
    order(f, "lost-unscheduled", -120 * SEC, 3600 * SEC, false, NULL, 0);
    order(f, "unscheduled", 600 * SEC, 60 * SEC, false, NULL, 0);
    order(f, "in-flight", 600 * SEC, 1 * SEC, false, NULL, 0);
    order(f, "scheduled", 600 * SEC, 60 * SEC, true, NULL, 0);

    /* Re-publishing included: a dry run connects to no broker (BAD_AMQP would fail). */
    lapse_sweep_opts_t opts;
    lapse_sweep_report_t report;
    lapse_error_t err;
    lapse_sweep_opts_init(&opts);
    opts.dry_run = true;
    assert_int_equal(lapse_sweep_run(f->cfg, f->store, &opts, &report, &err), LAPSE_OK);
    assert_int_equal(report.would_cancel, 2);
    /* The lost unscheduled order is the cancel part's, counted once. */
    assert_int_equal(report.would_republish, 1);
    assert_int_equal(report.cancelled + report.republished + report.failed, 0);
    assert_int_equal(query_int(f, "SELECT count(*) FROM orders WHERE status = 'pending'"),
                     5);
    assert_int_equal(query_int(f, "SELECT count(*) FROM orders WHERE scheduled = 1"), 2);
    assert_int_equal(query_int(f, "SELECT count(*) FROM events"), 0);
    assert_int_equal(count_lines(f->log, "event=sweep_cancel"), 0);
}

/* More lost orders than a page and than a cancel batch: all cancelled, once each. */
static void test_sweep_cancels_in_batches(void **state) {
    fixture_t *f = *state;
    enum { N = 650 };
    lapse_new_order_t *orders = calloc(N, sizeof(*orders));
    lapse_status_t *results = calloc(N, sizeof(*results));
    char(*ids)[32] = calloc(N, sizeof(*ids));
    assert_non_null(orders);
    assert_non_null(results);
    assert_non_null(ids);
    for (size_t i = 0; i < N; i++) {
        snprintf(ids[i], sizeof(ids[i]), "b-%04zu", i);
        orders[i] = (lapse_new_order_t){.order_id = ids[i],
                                        .deadline_ms = f->now - 70 * SEC - (int64_t)i,
                                        .created_at_ms = f->now - 3600 * SEC};
    }
    lapse_error_t err;
    assert_int_equal(lapse_store_insert_orders(f->store, orders, N, results, &err),
                     LAPSE_OK);
    free(ids);
    free(results);
    free(orders);

    lapse_sweep_opts_t opts;
    lapse_sweep_report_t report;
    lapse_sweep_opts_init(&opts);
    assert_int_equal(sweep_store_only(f, &opts, &report, &err), LAPSE_OK);
    assert_int_equal(report.cancelled, N);
    assert_int_equal(query_int(f, "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     N);
    assert_int_equal(query_int(f, "SELECT count(DISTINCT order_id) FROM events"), N);
    assert_int_equal(query_int(f, "SELECT count(*) FROM events"), N);
}

static void test_sweep_max_orders_leaves_more_for_the_next_call(void **state) {
    fixture_t *f = *state;
    const char *ids[] = {"m1", "m2", "m3", "m4", "m5"};
    for (size_t i = 0; i < 5; i++) {
        order(f, ids[i], -100 * SEC + (int64_t)i, 3600 * SEC, true, NULL, 0);
    }
    lapse_sweep_opts_t opts;
    lapse_sweep_report_t report;
    lapse_error_t err;
    lapse_sweep_opts_init(&opts);
    opts.max_orders = 2;
    uint64_t total = 0;
    int calls = 0;
    do {
        assert_int_equal(sweep_store_only(f, &opts, &report, &err), LAPSE_OK);
        assert_true(report.cancelled <= 2);
        total += report.cancelled;
        calls++;
    } while (report.more && calls < 10);
    assert_int_equal(total, 5);
    assert_int_equal(calls, 3);
    /* Earliest deadline first. */
    assert_true(query_int(f, "SELECT cancelled_at_ms FROM orders WHERE order_id='m1'") <=
                query_int(f, "SELECT cancelled_at_ms FROM orders WHERE order_id='m5'"));
}

static int stop_now(void *opaque, const lapse_sweep_report_t *so_far) {
    int *calls = opaque;
    (*calls)++;
    assert_non_null(so_far);
    return 1;
}

static void test_sweep_progress_may_stop_it(void **state) {
    fixture_t *f = *state;
    enum { N = 450 };
    for (int i = 0; i < N; i++) {
        char id[16];
        snprintf(id, sizeof(id), "p-%04d", i);
        order(f, id, -100 * SEC + i, 3600 * SEC, true, NULL, 0);
    }
    int calls = 0;
    lapse_sweep_opts_t opts;
    lapse_sweep_report_t report;
    lapse_error_t err;
    lapse_sweep_opts_init(&opts);
    opts.progress = stop_now;
    opts.progress_opaque = &calls;
    assert_int_equal(sweep_store_only(f, &opts, &report, &err), LAPSE_ERR_STOPPED);
    assert_int_equal(calls, 1);
    assert_true(report.more);
    /* It stopped after its first batch, which was committed. */
    assert_true(report.cancelled > 0 && report.cancelled < N);
    assert_int_equal(query_int(f, "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     (int64_t)report.cancelled);
}

static int first_seq(void *opaque, const lapse_event_t *event) {
    *(int64_t *)opaque = event->seq;
    return 1;
}

/* The broker is out of reach: re-publishing fails with a clear error, but the store-side
 * cancellation still ran, and the unscheduled order is left for the next sweep. */
static void test_sweep_without_broker_still_cancels(void **state) {
    fixture_t *f = *state;
    order(f, "lost", -90 * SEC, 3600 * SEC, true, NULL, 0);
    order(f, "unscheduled", 600 * SEC, 60 * SEC, false, NULL, 0);
    lapse_sweep_opts_t opts;
    lapse_sweep_report_t report;
    lapse_error_t err;
    lapse_sweep_opts_init(&opts);
    lapse_status_t rc = lapse_sweep_run(f->cfg, f->store, &opts, &report, &err);
    print_message("sweep without broker: %s (%s)\n", err.text, lapse_status_name(rc));
    assert_int_equal(rc, LAPSE_ERR_BROKER_CONNECT);
    assert_int_equal(err.code, LAPSE_ERR_BROKER_CONNECT);
    assert_true(strncmp(err.text, "republish: ", 11) == 0);
    assert_int_equal(report.cancelled, 1);
    assert_int_equal(report.republished, 0);
    assert_int_equal(report.failed, 1);
    assert_int_equal(status_of(f, "lost"), LAPSE_ORDER_CANCELLED);
    lapse_order_t o = get(f, "unscheduled");
    assert_int_equal(o.status, LAPSE_ORDER_PENDING);
    assert_false(o.scheduled);
    lapse_order_clear(&o);
    /* The cancellation's event could not be published either: one warning line says so,
     * the event stays in the outbox, and the run's status is the republish part's. */
    assert_int_equal(report.events_published, 0);
    assert_int_equal(report.events_waiting, 1);
    assert_int_equal(count_lines(f->log, "event=sweep_events_left reason=broker"), 1);
    assert_int_equal(count_lines(f->log, "_events_left"), 1);
    assert_int_equal(query_int(f, sf_sql_unpublished(f->sf.backend)), 1);

    /* Nothing unscheduled and nothing lost: the run succeeds, and only the event left in
     * the outbox makes it try the broker (and say so again). */
    assert_int_equal(lapse_store_mark_scheduled(
                         f->store, (const char *const[]){"unscheduled"}, 1, &err),
                     LAPSE_OK);
    assert_int_equal(lapse_sweep_run(f->cfg, f->store, &opts, &report, &err), LAPSE_OK);
    assert_int_equal(report.failed, 0);
    assert_int_equal(report.events_waiting, 1);
    assert_int_equal(count_lines(f->log, "event=sweep_events_left reason=broker"), 2);

    /* With the outbox empty there is nothing to publish: no connection is even tried.
     * (PostgreSQL's claim on the event, taken by the cancel and the sweeps that could not
     * publish it, is dropped first, as its expiry would.) */
    if (f->sf.backend == SF_PG) {
        exec_sql(f, "UPDATE events SET claimed_until_ms = NULL");
    }
    int64_t seq = 0;
    assert_int_equal(
        lapse_store_events_pending(f->store, 10, NULL, 0, first_seq, &seq, &err),
        LAPSE_OK);
    assert_true(seq > 0);
    assert_int_equal(lapse_store_events_mark_published(f->store, &seq, 1, f->now, &err),
                     LAPSE_OK);
    assert_int_equal(lapse_sweep_run(f->cfg, f->store, &opts, &report, &err), LAPSE_OK);
    assert_int_equal(report.events_waiting, 0);
    assert_int_equal(count_lines(f->log, "_events_left"), 2);
}

/* Another process holds the write lock for longer than the store's busy timeout: the
 * sweep retries with backoff and then cancels. */
static void test_sweep_retries_a_busy_store(void **state) {
    fixture_t *f = *state;
    SF_SKIP_ON_PG("SQLite's write lock and busy timeout (a PostgreSQL writer waits for "
                  "the row lock instead)");
    order(f, "lost", -90 * SEC, 3600 * SEC, true, NULL, 0);
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        sqlite3 *db = NULL;
        sqlite3_open_v2(f->sf.path, &db, SQLITE_OPEN_READWRITE, NULL);
        int ok = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK;
        (void)!write(ready[1], ok ? "1" : "0", 1);
        usleep(6500 * 1000); /* past the store's 5 s busy timeout */
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        sqlite3_close(db);
        _exit(0);
    }
    char c = 0;
    assert_int_equal(read(ready[0], &c, 1), 1);
    assert_int_equal(c, '1');
    close(ready[0]);
    close(ready[1]);

    lapse_sweep_opts_t opts;
    lapse_sweep_report_t report;
    lapse_error_t err;
    lapse_sweep_opts_init(&opts);
    assert_int_equal(sweep_store_only(f, &opts, &report, &err), LAPSE_OK);
    int status;
    waitpid(child, &status, 0);
    assert_int_equal(report.cancelled, 1);
    assert_int_equal(status_of(f, "lost"), LAPSE_ORDER_CANCELLED);
    print_message("%s", f->log);
    assert_true(count_lines(f->log, "event=store_retry op=sweep_cancel") >= 1);
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_opts_defaults),
        T(test_sweep_rejects_bad_arguments),
        T(test_sweep_cancels_only_past_deadline_plus_grace),
        T(test_sweep_dry_run_changes_nothing),
        T(test_sweep_cancels_in_batches),
        T(test_sweep_max_orders_leaves_more_for_the_next_call),
        T(test_sweep_progress_may_stop_it),
        T(test_sweep_without_broker_still_cancels),
        T(test_sweep_retries_a_busy_store),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}

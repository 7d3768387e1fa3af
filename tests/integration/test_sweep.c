/* SPDX-License-Identifier: MIT
 * The sweeper on the private broker: an order recorded but never published is published
 * by `lapse sweep` and cancelled at its deadline (fault d); orders whose messages were
 * purged are cancelled directly after deadline + grace, once each (fault e); `lapse
 * pending` lists by deadline; `lapse reconcile` publishes every pending order again. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <lapse/store.h>

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define OUT_CAP 65536
#define SEC     INT64_C(1000)

static int64_t wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_until(int64_t wall) {
    while (wall_ms() < wall) {
        usleep(10000);
    }
}

/* The value of key=N in a line of key=value pairs; fails the test when absent. */
static long long kv(const char *out, const char *key) {
    char needle[64];
    snprintf(needle, sizeof needle, " %s=", key);
    const char *p = strstr(out, needle);
    if (!p) {
        fail_msg("no %s= in '%s'", key, out);
    }
    return atoll(p + strlen(needle));
}

static lapse_store_t *open_store(h_ctx_t *h) {
    lapse_status_t rc;
    lapse_error_t err;
    lapse_store_t *store = lapse_store_open(h->store, &rc, &err);
    if (!store) {
        fail_msg("open %s: %s", h->store, err.text);
    }
    return store;
}

/* Record an order the way the publisher does before publishing, and stop there (the
 * publisher crashed, or its connection was cut, before the confirm). */
static void record(lapse_store_t *store, const char *order_id, int64_t deadline_ms,
                   int64_t created_at_ms, const char *hold, bool scheduled) {
    const char *holds[1] = {hold};
    lapse_new_order_t order = {.order_id = order_id,
                               .deadline_ms = deadline_ms,
                               .created_at_ms = created_at_ms,
                               .holds = holds,
                               .n_holds = hold ? 1 : 0};
    lapse_status_t result = LAPSE_ERR_INVALID;
    lapse_error_t err;
    assert_int_equal(lapse_store_insert_orders(store, &order, 1, &result, &err),
                     LAPSE_OK);
    assert_int_equal(result, LAPSE_OK);
    if (scheduled) {
        assert_int_equal(lapse_store_mark_scheduled(store, &order_id, 1, &err), LAPSE_OK);
    }
}

/* Messages in every queue of the topology, from `lapse status --json`. */
static long long messages_on_broker(h_ctx_t *h) {
    char out[OUT_CAP];
    assert_int_equal(h_lapse(h, out, sizeof out, "status", "--json", NULL), 0);
    json_error_t jerr;
    json_t *root = json_loads(out, 0, &jerr);
    if (!root) {
        fail_msg("status --json: %s: %s", jerr.text, out);
    }
    long long sum = 0;
    const char *name;
    json_t *q;
    json_object_foreach(json_object_get(root, "queues"), name, q) {
        sum += json_integer_value(json_object_get(q, "messages"));
    }
    json_decref(root);
    return sum;
}

/* The depth is read queue by queue, so a message hopping between two rungs at that
 * moment can be missed or counted twice: polled until it settles on expect. */
static long long wait_messages(h_ctx_t *h, long long expect) {
    long long n = -1;
    for (int i = 0; i < 30 && (n = messages_on_broker(h)) != expect; i++) {
        usleep(100000);
    }
    return n;
}

/* Bind <prefix>.tap to the events exchange; returns the queue's name (h->tap). */
static const char *tap_events(h_ctx_t *h) {
    amqp_connection_state_t conn = h_amqp_open(h);
    h_tap_events(h, conn);
    h_amqp_close(conn);
    return h->tap;
}

static char *run_sweep(h_ctx_t *h, char *out, int expect_code, const char *a1,
                       const char *a2, const char *a3) {
    int code = h_lapse(h, out, OUT_CAP, "sweep", a1, a2, a3, NULL);
    fprintf(stderr, "sweep %s %s %s -> %d: %s", a1 ? a1 : "", a2 ? a2 : "", a3 ? a3 : "",
            code, out);
    assert_int_equal(code, expect_code);
    assert_true(strncmp(out, "sweep ", 6) == 0);
    return out;
}

/* Fault d: recorded, never published. The sweep publishes it (the delay ladder, for what
 * is left of its recorded deadline), leaves an order whose publish may still be in flight
 * alone, and the consumer cancels it at its deadline, never before. */
static void test_unpublished_order_is_published_and_cancelled_on_time(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "sweep-d", "30m", true);
    /* Events are published mandatory: a queue must take them to count as published. */
    tap_events(&h);
    lapse_store_t *store = open_store(&h);
    int64_t now = wall_ms();
    int64_t deadline = now + 8 * SEC;
    record(store, "d1", deadline, now - 60 * SEC, "seat-7", false);
    record(store, "d2", deadline + 500, now, NULL, false); /* publish in flight */
    record(store, "d3", deadline, now - 60 * SEC, NULL, false);
    record(store, "d4", now + 3600 * SEC, now - 60 * SEC, NULL, true);
    lapse_error_t err;
    assert_int_equal(lapse_store_pay(store, "d3", now, &err), LAPSE_OK);
    lapse_store_close(store);

    char out[OUT_CAP];
    run_sweep(&h, out, 0, NULL, NULL, NULL);
    assert_int_equal(kv(out, "republished"), 1);
    assert_int_equal(kv(out, "cancelled"), 0);
    assert_int_equal(kv(out, "failed"), 0);
    assert_int_equal(h_sql_int(&h, "SELECT scheduled FROM orders WHERE order_id='d1'"),
                     1);
    assert_int_equal(h_sql_int(&h, "SELECT scheduled FROM orders WHERE order_id='d2'"),
                     0);
    assert_int_equal(h_sql_int(&h, "SELECT deadline_ms FROM orders WHERE order_id='d1'"),
                     deadline);
    /* The re-publish left the hold as it was: one, not released. */
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM holds WHERE order_id='d1'"
                                   " AND resource='seat-7' AND released_at_ms IS NULL"),
                     1);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM holds"), 1);
    assert_int_equal(wait_messages(&h, 1), 1);

    /* Without the in-flight margin, d2 goes too; the next sweep finds nothing. */
    run_sweep(&h, out, 0, "--in-flight", "0", NULL);
    assert_int_equal(kv(out, "republished"), 1);
    assert_int_equal(wait_messages(&h, 2), 2);
    run_sweep(&h, out, 0, NULL, NULL, NULL);
    assert_int_equal(kv(out, "republished"), 0);
    assert_int_equal(wait_messages(&h, 2), 2);

    pid_t consumer = h_spawn_consumer(&h, "consumer.log", NULL);
    assert_int_equal(
        h_wait_sql(&h, 2, h_ms(25000),
                   "SELECT count(*) FROM orders WHERE order_id IN ('d1','d2')"
                   " AND status='cancelled'"),
        2);
    int64_t early = h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='cancelled'"
                                  " AND cancelled_at_ms < deadline_ms");
    int64_t lag1 = h_sql_int(
        &h, "SELECT cancelled_at_ms - deadline_ms FROM orders WHERE order_id='d1'");
    int64_t lag2 = h_sql_int(
        &h, "SELECT cancelled_at_ms - deadline_ms FROM orders WHERE order_id='d2'");
    fprintf(stderr, "d1 cancelled %lld ms after its deadline, d2 %lld ms\n",
            (long long)lag1, (long long)lag2);
    assert_int_equal(early, 0);
    assert_true(lag1 >= 0 && lag1 < h_ms(1500));
    assert_true(lag2 >= 0 && lag2 < h_ms(1500));
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM holds WHERE order_id='d1'"
                                   " AND released_at_ms IS NOT NULL"),
                     1);
    assert_int_equal(
        h_sql_int(&h, "SELECT status='paid' FROM orders WHERE order_id='d3'"), 1);
    assert_int_equal(
        h_sql_int(&h, "SELECT status='pending' FROM orders WHERE order_id='d4'"), 1);
    assert_int_equal(h_count_lines(&h, "consumer.log", "order_id=d1 decision=cancelled"),
                     1);
    assert_int_equal(h_wait_sql(&h, 2, h_ms(15000), sf_sql_published(h.sf.backend)), 2);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    h_teardown(&h);
}

/* Fault e: a holding queue purged. Inside the grace period nothing happens; after it,
 * the sweep cancels every unpaid order directly, once, and publishes their events itself
 * before it exits. A dry run changes nothing. */
static bool every_twentieth(int i) {
    return i % 20 == 0;
}

static void test_purged_orders_are_cancelled_after_the_grace_period(void **state) {
    (void)state;
    enum { N = 100 };
    h_ctx_t h;
    h_setup(&h, "sweep-e", "4s", true);
    const char *tap = tap_events(&h);
    FILE *f = fopen(h_path(&h, "batch.jsonl"), "w");
    assert_non_null(f);
    for (int i = 0; i < N; i++) {
        fprintf(f, "{\"order_id\":\"ord-%d\",\"timeout\":\"4s\",\"holds\":[\"r-%d\"]}\n",
                i, i);
    }
    fclose(f);
    assert_int_equal(
        h_lapse(&h, NULL, 0, "publish", "--batch", h_path(&h, "batch.jsonl"), NULL), 0);

    /* Purged right away; anything that already expired is purged from expired too. */
    amqp_connection_state_t conn = h_amqp_open(&h);
    uint32_t purged = 0;
    const char *suffixes[] = {"hold.4s", "expired"};
    for (size_t i = 0; i < 2; i++) {
        char queue[160];
        snprintf(queue, sizeof queue, "%s.%s", h.prefix, suffixes[i]);
        amqp_queue_purge_ok_t *ok = amqp_queue_purge(conn, 1, amqp_cstring_bytes(queue));
        assert_non_null(ok);
        purged += ok->message_count;
    }
    h_amqp_close(conn);
    assert_int_equal(purged, N);
    size_t paid = h_pay_in_time(&h, N, every_twentieth);
    assert_int_equal(paid, N / 20);
    int64_t first = h_sql_int(&h, "SELECT min(deadline_ms) FROM orders");
    int64_t last = h_sql_int(&h, "SELECT max(deadline_ms) FROM orders");
    fprintf(stderr, "%d orders purged, deadlines within %lld ms\n", N,
            (long long)(last - first));
    assert_true(last - first < 1000);

    char out[OUT_CAP];
    run_sweep(&h, out, 0, "--grace", "2s", NULL);
    assert_int_equal(kv(out, "cancelled"), 0);
    /* Past every deadline, inside the grace period: still nothing. */
    sleep_until(last + 200);
    run_sweep(&h, out, 0, "--grace", "2s", NULL);
    assert_int_equal(kv(out, "cancelled"), 0);
    assert_true(wall_ms() < first + 2000); /* the sweep did run inside the grace */
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='pending'"),
                     N - N / 20);

    sleep_until(last + 2000 + 100);
    run_sweep(&h, out, 0, "--grace", "2s", "--dry-run");
    assert_int_equal(kv(out, "would_cancel"), N - N / 20);
    assert_int_equal(kv(out, "cancelled"), 0);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='pending'"),
                     N - N / 20);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM events"), 0);

    run_sweep(&h, out, 0, "--grace", "2s", NULL);
    assert_int_equal(kv(out, "cancelled"), N - N / 20);
    assert_int_equal(kv(out, "failed"), 0);
    /* ...and published their events before it exited, with no consumer running. */
    assert_int_equal(kv(out, "events_published"), N - N / 20);
    assert_int_equal(kv(out, "events_waiting"), 0);
    assert_int_equal(h_count_lines(&h, "cli.log", "event=sweep_cancel order_id=ord-"),
                     N - N / 20);
    run_sweep(&h, out, 0, "--grace", "2s", NULL);
    assert_int_equal(kv(out, "cancelled"), 0);
    assert_int_equal(kv(out, "events_published"), 0);

    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='cancelled'"
                                   " AND cancelled_at_ms >= deadline_ms + 2000"),
                     N - N / 20);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='paid'"),
                     N / 20);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM events"), N - N / 20);
    assert_int_equal(h_sql_int(&h, "SELECT count(DISTINCT event_id) FROM events"),
                     N - N / 20);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM holds JOIN orders"
                                   " USING (order_id) WHERE (released_at_ms IS NOT NULL)"
                                   " != (status = 'cancelled')"),
                     0);

    assert_int_equal(h_sql_int(&h, sf_sql_unpublished(h.sf.backend)), 0);
    amqp_connection_state_t tap_conn = h_amqp_open(&h);
    size_t total = 0;
    assert_int_equal(h_tap_event_orders(tap_conn, tap, &total), N - N / 20);
    assert_int_equal(total, N - N / 20);
    h_amqp_close(tap_conn);
    h_teardown(&h);
}

/* A consumer far behind is late, not lost: with the expired queue holding messages
 * older than the grace, the consumer's own sweep cancels directly only the orders whose
 * messages are truly gone (recorded, never published, due long before the backlog),
 * and leaves the backlog to the consumer, which cancels each of its orders once, as an
 * expiry. Before, the first sweep cancelled the whole backlog as "message_lost". */
/* A backlog of expiry messages that stands three graces past its deadlines: first
 * n_paid of orders paid meanwhile (no-ops), then n_pending of pending orders; plus LOST
 * orders recorded as scheduled 30 s overdue whose messages never existed. A consumer
 * taking one delivery per batch with a 1 s sweep and a 1 s grace must sweep the lost
 * ones only and cancel every pending one on delivery: the lag its messages arrive with
 * (no-ops included) holds its sweep back. */
static void run_backlog(const char *name, int n_paid, int n_pending) {
    enum { LOST = 5 };
    int n = n_paid + n_pending;
    h_ctx_t h;
    h_setup(&h, name, "1s", true);
    tap_events(&h);
    FILE *f = fopen(h_path(&h, "batch.jsonl"), "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"order_id\":\"%s-%d\",\"timeout\":\"1s\"}\n",
                i < n_paid ? "paid" : "ord", i);
    }
    fclose(f);
    assert_int_equal(
        h_lapse(&h, NULL, 0, "publish", "--batch", h_path(&h, "batch.jsonl"), NULL), 0);
    /* Lost for good: confirmed as scheduled 30 s before the backlog fell due, with no
     * message anywhere. */
    lapse_store_t *store = open_store(&h);
    int64_t now = wall_ms();
    for (int i = 0; i < LOST; i++) {
        char id[32];
        snprintf(id, sizeof id, "lost-%d", i);
        record(store, id, now - 30 * SEC, now - 40 * SEC, NULL, true);
    }
    lapse_store_close(store);
    /* The backlog: every message dead-lettered into the expired queue, then left there
     * three times the grace. */
    assert_int_equal(wait_messages(&h, n), n);
    amqp_connection_state_t conn = h_amqp_open(&h);
    char expired[160];
    snprintf(expired, sizeof expired, "%s.expired", h.prefix);
    for (int i = 0; i < 50 && h_queue_depth(conn, expired) < n; i++) {
        usleep(100000);
    }
    assert_int_equal(h_queue_depth(conn, expired), n);
    h_amqp_close(conn);
    /* Paid in time, by the store's record; their messages are already queued. */
    h_sql_exec(&h, "UPDATE orders SET status='paid', paid_at_ms=deadline_ms-500"
                   " WHERE order_id LIKE 'paid-%%'");
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='paid'"),
                     n_paid);
    sleep_until(h_sql_int(&h, "SELECT max(deadline_ms) FROM orders") + 3 * SEC);

    /* One delivery per batch: the backlog takes many sweeps to drain. */
    pid_t consumer =
        h_spawn_consumer(&h, "consumer.log",
                         (const char *const[]){"--prefetch", "1", "--sweep-every", "1s",
                                               "--grace", "1s", NULL});
    assert_int_equal(h_wait_sql(&h, n_pending + LOST, h_ms(60000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     n_pending + LOST);
    /* Every message decided: the paid ones as no-ops. */
    assert_int_equal(h_wait_lines(&h, "consumer.log", " decision=noop_paid",
                                  (size_t)n_paid, h_ms(30000)),
                     (size_t)n_paid);
    size_t swept = h_count_lines(&h, "consumer.log", "event=sweep_cancel ");
    size_t swept_lost =
        h_count_lines(&h, "consumer.log", "event=sweep_cancel order_id=lost-");
    size_t expired_cancels = h_count_lines(&h, "consumer.log", " decision=cancelled");
    fprintf(stderr,
            "backlog %d paid + %d pending, lost %d: swept %zu (lost ones %zu), cancelled "
            "on delivery %zu, sweep_behind_backlog lines %zu\n",
            n_paid, n_pending, LOST, swept, swept_lost, expired_cancels,
            h_count_lines(&h, "consumer.log", "event=sweep_behind_backlog"));
    assert_int_equal(swept_lost, LOST);
    assert_int_equal(swept, LOST);
    assert_int_equal(expired_cancels, n_pending);
    assert_true(h_count_lines(&h, "consumer.log", "event=sweep_behind_backlog") >= 1);
    /* Drained, the consumer idles and says so at the next sweep. */
    assert_int_equal(
        h_wait_lines(&h, "consumer.log", "event=sweep_caught_up", 1, h_ms(10000)), 1);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    /* Each order cancelled once: one outbox event each; the paid ones stayed paid. */
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM events"), n_pending + LOST);
    assert_int_equal(h_sql_int(&h, "SELECT count(DISTINCT order_id) FROM events"),
                     n_pending + LOST);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='paid'"),
                     n_paid);
    h_teardown(&h);
}

static void test_consumer_backlog_is_not_swept_as_lost(void **state) {
    (void)state;
    run_backlog("sweep-backlog", 0, 300);
}

/* The backlog's head is all no-ops: they alone must tell the sweep how late messages
 * arrive, or the pending orders behind them are swept as lost. */
static void test_consumer_noop_backlog_holds_the_sweep(void **state) {
    (void)state;
    run_backlog("sweep-noops", 300, 50);
}

/* No broker: the re-publishing fails with one clear line and exit 1, the store-side
 * cancelling still happens. */
static void test_sweep_without_broker(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "sweep-down", "30m", false);
    snprintf(h.amqp, sizeof h.amqp, "amqp://guest:guest@127.0.0.1:1/%%2f");
    lapse_store_t *store = open_store(&h);
    int64_t now = wall_ms();
    record(store, "lost", now - 120 * SEC, now - 3600 * SEC, NULL, true);
    record(store, "unpublished", now + 3600 * SEC, now - 60 * SEC, NULL, false);
    lapse_store_close(store);
    char out[OUT_CAP];
    run_sweep(&h, out, 1, NULL, NULL, NULL);
    assert_int_equal(kv(out, "cancelled"), 1);
    assert_int_equal(kv(out, "failed"), 1);
    assert_int_equal(h_count_lines(&h, "cli.log", "lapse: sweep: republish: "), 1);
    /* The cancellation's event stays in the outbox, said in one warning line. */
    assert_int_equal(kv(out, "events_published"), 0);
    assert_int_equal(kv(out, "events_waiting"), 1);
    assert_int_equal(h_count_lines(&h, "cli.log", "event=sweep_events_left"), 1);
    assert_int_equal(h_sql_int(&h, "SELECT status='cancelled' FROM orders"
                                   " WHERE order_id='lost'"),
                     1);
    assert_int_equal(h_sql_int(&h, "SELECT scheduled FROM orders"
                                   " WHERE order_id='unpublished'"),
                     0);
    h_teardown(&h);
}

static json_t *pending_json(h_ctx_t *h, const char *a1, const char *a2, const char *a3,
                            const char *a4) {
    char out[OUT_CAP];
    int code = h_lapse(h, out, sizeof out, "pending", "--json", a1, a2, a3, a4, NULL);
    assert_int_equal(code, 0);
    json_error_t jerr;
    json_t *root = json_loads(out, 0, &jerr);
    if (!root || !json_is_array(root)) {
        fail_msg("pending --json is not an array: %s: %s", jerr.text, out);
    }
    return root;
}

/* `lapse pending`: the JSON shape and order, filters and limits, the text form and usage
 * errors; then `lapse reconcile` puts every pending order (and only those) back on the
 * broker. */
static void test_pending_and_reconcile(void **state) {
    (void)state;
    enum { N = 20 };
    h_ctx_t h;
    h_setup(&h, "sweep-r", "30m", true);
    lapse_store_t *store = open_store(&h);
    int64_t now = wall_ms();
    for (int i = 0; i < N; i++) {
        char id[32], hold[32];
        snprintf(id, sizeof id, "r-%02d", (i * 7) % N);
        snprintf(hold, sizeof hold, "slot-%d", i);
        /* 1 h 2 m to 1 h 11 m ahead, in no particular order, pairs sharing a deadline. */
        int64_t deadline = now + 3720 * SEC + (int64_t)((i * 13) % N / 2) * 60 * SEC;
        record(store, id, deadline, now - 10 * SEC, i % 3 == 0 ? hold : NULL, i % 2);
    }
    lapse_error_t err;
    assert_int_equal(lapse_store_pay(store, "r-03", now, &err), LAPSE_OK);
    assert_int_equal(lapse_store_pay(store, "r-11", now, &err), LAPSE_OK);
    lapse_store_close(store);
    const int pending = N - 2;

    json_t *all = pending_json(&h, "--limit", "0", NULL, NULL);
    assert_int_equal(json_array_size(all), pending);
    int64_t prev_deadline = 0;
    const char *prev_id = "";
    size_t i;
    json_t *o;
    json_array_foreach(all, i, o) {
        assert_int_equal(json_object_size(o), 6);
        const char *id = json_string_value(json_object_get(o, "order_id"));
        json_int_t deadline = json_integer_value(json_object_get(o, "deadline_ms"));
        assert_non_null(id);
        assert_true(strcmp(id, "r-03") != 0 && strcmp(id, "r-11") != 0);
        assert_true(deadline > prev_deadline ||
                    (deadline == prev_deadline && strcmp(id, prev_id) > 0));
        char want[32];
        snprintf(want, sizeof want, "%s",
                 json_string_value(json_object_get(o, "deadline")));
        int64_t parsed = 0;
        assert_int_equal(lapse_time_parse_rfc3339(want, &parsed), LAPSE_OK);
        assert_int_equal(parsed, deadline);
        assert_true(json_integer_value(json_object_get(o, "created_at_ms")) < now);
        assert_true(json_is_boolean(json_object_get(o, "scheduled")));
        assert_int_equal(
            json_is_true(json_object_get(o, "scheduled")),
            h_sql_int(&h, "SELECT scheduled FROM orders WHERE order_id='%q'", id));
        json_t *holds = json_object_get(o, "holds");
        assert_true(json_is_array(holds));
        assert_int_equal(
            json_array_size(holds),
            h_sql_int(&h, "SELECT count(*) FROM holds WHERE order_id='%q'", id));
        prev_deadline = deadline;
        prev_id = id;
    }

    /* --limit: the first N by deadline; --due-before: strictly before, as a time or as a
     * duration from now. */
    json_t *five = pending_json(&h, "--limit", "5", NULL, NULL);
    assert_int_equal(json_array_size(five), 5);
    for (size_t k = 0; k < 5; k++) {
        assert_true(json_equal(json_array_get(five, k), json_array_get(all, k)));
    }
    json_decref(five);
    const char *sixth =
        json_string_value(json_object_get(json_array_get(all, 5), "deadline"));
    json_int_t sixth_ms =
        json_integer_value(json_object_get(json_array_get(all, 5), "deadline_ms"));
    size_t before_sixth = 0;
    json_array_foreach(all, i, o) {
        before_sixth += json_integer_value(json_object_get(o, "deadline_ms")) < sixth_ms;
    }
    json_t *due = pending_json(&h, "--due-before", sixth, NULL, NULL);
    assert_int_equal(json_array_size(due), before_sixth);
    json_decref(due);
    json_t *none = pending_json(&h, "--due-before", "30m", NULL, NULL);
    assert_int_equal(json_array_size(none), 0);
    json_decref(none);
    json_t *soon = pending_json(&h, "--due-before", "3h", "--limit", "0");
    assert_int_equal(json_array_size(soon), pending);
    json_decref(soon);

    /* Text: one line per order, id first; the default limit is far above 18. */
    char out[OUT_CAP];
    assert_int_equal(h_lapse(&h, out, sizeof out, "pending", NULL), 0);
    fprintf(stderr, "pending:\n%s", out);
    size_t lines = 0;
    for (const char *p = out; *p; p = strchr(p, '\n') + 1) {
        const char *id =
            json_string_value(json_object_get(json_array_get(all, lines), "order_id"));
        assert_true(strncmp(p, id, strlen(id)) == 0);
        const char *eol = strchr(p, '\n');
        assert_non_null(eol);
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)(eol - p), p);
        assert_true(strstr(line, "scheduled=yes") || strstr(line, "scheduled=no"));
        assert_non_null(strstr(line, "(in 1h"));
        lines++;
    }
    assert_int_equal(lines, pending);
    assert_int_equal(h_lapse(&h, out, sizeof out, "pending", "--limit", "2", NULL), 0);
    assert_int_equal(h_count_lines(&h, "cli.log", "lapse pending: showing the first 2"),
                     1);

    /* Help and usage errors. */
    const char *cmds[] = {"pending", "sweep", "reconcile"};
    for (size_t k = 0; k < 3; k++) {
        assert_int_equal(h_lapse(&h, out, sizeof out, cmds[k], "--help", NULL), 0);
        char want[64];
        snprintf(want, sizeof want, "usage: lapse %s", cmds[k]);
        assert_true(strncmp(out, want, strlen(want)) == 0);
        assert_int_equal(h_lapse(&h, out, sizeof out, cmds[k], "--bogus", NULL), 2);
        assert_string_equal(out, "");
    }
    assert_int_equal(h_lapse(&h, out, sizeof out, "pending", "--limit", "-1", NULL), 2);
    assert_int_equal(
        h_lapse(&h, out, sizeof out, "pending", "--due-before", "yesterday", NULL), 2);
    assert_int_equal(h_lapse(&h, out, sizeof out, "pending", "extra", NULL), 2);
    assert_int_equal(h_lapse(&h, out, sizeof out, "sweep", "--grace", "soon", NULL), 2);
    assert_int_equal(h_lapse(&h, out, sizeof out, "reconcile", "extra", NULL), 2);

    /* Reconcile: every pending order once more on the broker, none of the paid. */
    assert_int_equal(wait_messages(&h, 0), 0);
    assert_int_equal(h_lapse(&h, out, sizeof out, "reconcile", "--dry-run", NULL), 0);
    assert_int_equal(kv(out, "would_republish"), pending);
    assert_int_equal(wait_messages(&h, 0), 0);
    assert_int_equal(h_lapse(&h, out, sizeof out, "reconcile", NULL), 0);
    fprintf(stderr, "reconcile: %s", out);
    assert_int_equal(kv(out, "republished"), pending);
    assert_int_equal(kv(out, "failed"), 0);
    assert_int_equal(wait_messages(&h, pending), pending);
    assert_int_equal(
        h_sql_int(&h,
                  "SELECT count(*) FROM orders WHERE status='pending' AND scheduled=1"),
        pending);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM holds"), (N + 2) / 3);
    /* Once more (another broker, say): the depth grows by the pending count again. */
    assert_int_equal(h_lapse(&h, out, sizeof out, "reconcile", NULL), 0);
    assert_int_equal(wait_messages(&h, 2 * pending), 2 * pending);
    json_decref(all);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unpublished_order_is_published_and_cancelled_on_time),
        cmocka_unit_test(test_purged_orders_are_cancelled_after_the_grace_period),
        cmocka_unit_test(test_consumer_backlog_is_not_swept_as_lost),
        cmocka_unit_test(test_consumer_noop_backlog_holds_the_sweep),
        cmocka_unit_test(test_sweep_without_broker),
        cmocka_unit_test(test_pending_and_reconcile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

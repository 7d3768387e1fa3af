/* SPDX-License-Identifier: MIT
 * Issue 12: cancelling in the shop's own orders table (--orders-map), on PostgreSQL. The
 * test builds a small shop in the test's database: orders with a text status and a
 * pay_deadline timestamptz, their items, inventory whose stock an order takes when it is
 * placed and gets back when it is cancelled, and seats an order holds. lapse's own
 * bookkeeping lives in its schema "lapse"; the shop's in "shop". */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SKUS  5
#define STOCK 100000
#define MAP_RELEASE                                                                      \
    "\"on_cancel\": [\"UPDATE shop.inventory i SET stock = i.stock + it.qty FROM"        \
    " shop.order_items it WHERE it.order_id = $1 AND it.sku = i.sku\","                  \
    " \"UPDATE shop.seats SET held_by = NULL WHERE held_by = $1\"]"
#define MAP_HEAD                                                                         \
    "{\"table\": \"shop.orders\", \"id\": \"id\", \"status\": \"status\","               \
    " \"pending\": [\"unpaid\"], \"paid\": \"paid\", \"cancelled\": \"cancelled\","      \
    " \"cancelled_at\": \"cancelled_at\", \"deadline\": \"pay_deadline\", "

/* The shop's own payment statement, as the README shows it. */
#define SHOP_PAY                                                                         \
    "WITH u AS (UPDATE shop.orders SET status = 'paid' WHERE id = %d"                    \
    " AND status = 'unpaid' AND pay_deadline > now() RETURNING 1) SELECT count(*) FROM " \
    "u"

/* Orders first..last placed now, due after window_ms, each with one item (qty 1..3 of
 * one of five skus, taken from stock) and one seat. */
static void add_orders(h_ctx_t *h, int first, int last, int window_ms) {
    h_sql_exec(h,
               "INSERT INTO shop.orders (id, status, pay_deadline) SELECT g, 'unpaid',"
               " now() + interval '%d milliseconds' FROM generate_series(%d, %d) g",
               window_ms, first, last);
    h_sql_exec(h,
               "INSERT INTO shop.order_items SELECT g, 'sku-' || (g %% %d), 1 + g %% 3"
               " FROM generate_series(%d, %d) g",
               SKUS, first, last);
    h_sql_exec(h,
               "UPDATE shop.inventory i SET stock = i.stock - t.q FROM (SELECT sku,"
               " sum(qty) AS q FROM shop.order_items WHERE order_id BETWEEN %d AND %d"
               " GROUP BY sku) t WHERE t.sku = i.sku",
               first, last);
    h_sql_exec(
        h, "INSERT INTO shop.seats SELECT 'seat-' || g, g FROM generate_series(%d, %d) g",
        first, last);
}

/* The shop, with orders 1..n (see add_orders). */
static void make_shop(h_ctx_t *h, int n, int window_ms) {
    h_sql_exec(h, "CREATE SCHEMA shop");
    h_sql_exec(h, "CREATE TABLE shop.orders (id bigint PRIMARY KEY, status text NOT NULL,"
                  " pay_deadline timestamptz NOT NULL, cancelled_at timestamptz,"
                  " created_at timestamptz NOT NULL DEFAULT now())");
    h_sql_exec(h, "CREATE INDEX ON shop.orders (pay_deadline)");
    h_sql_exec(h, "CREATE TABLE shop.order_items (order_id bigint REFERENCES shop.orders,"
                  " sku text NOT NULL, qty int NOT NULL)");
    h_sql_exec(h,
               "CREATE TABLE shop.inventory (sku text PRIMARY KEY, stock int NOT NULL)");
    h_sql_exec(h, "CREATE TABLE shop.seats (seat text PRIMARY KEY, held_by bigint)");
    h_sql_exec(
        h,
        "INSERT INTO shop.inventory SELECT 'sku-' || g, %d FROM generate_series(0, %d)"
        " g",
        STOCK, SKUS - 1);
    if (n > 0) {
        add_orders(h, 1, n, window_ms);
    }
}

static void write_map(h_ctx_t *h, const char *file, const char *json) {
    FILE *f = fopen(h_path(h, file), "w");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
}

/* lapse with the map: the global flags, then --orders-map, then args (h_path's buffer
 * is static: every path is copied before the next call). */
static int lapse_mapped(h_ctx_t *h, char *out, size_t cap, const char *map, const char *a,
                        const char *b, const char *c) {
    char map_path[PATH_MAX + 64], arg[3][PATH_MAX + 64];
    const char *in[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        snprintf(arg[i], sizeof arg[i], "%s", in[i] != NULL ? in[i] : "");
    }
    snprintf(map_path, sizeof map_path, "%s", h_path(h, map));
    return h_lapse(h, out, cap, "--orders-map", map_path, a != NULL ? arg[0] : NULL,
                   b != NULL ? arg[1] : NULL, c != NULL ? arg[2] : NULL, NULL);
}

static pid_t consumer(h_ctx_t *h, const char *map, const char *log,
                      const char *const *env) {
    char map_path[PATH_MAX + 64];
    snprintf(map_path, sizeof map_path, "%s", h_path(h, map));
    const char *args[] = {"--orders-map", map_path, "consume", "--prefetch", "50", NULL};
    return env != NULL ? h_spawn_env(h, log, args, env) : h_spawn(h, log, args);
}

static void publish_all(h_ctx_t *h, const char *map, int n) {
    FILE *f = fopen(h_path(h, "orders.jsonl"), "w");
    assert_non_null(f);
    for (int i = 1; i <= n; i++) {
        fprintf(f, "{\"order_id\":\"%d\"}\n", i);
    }
    fclose(f);
    assert_int_equal(
        lapse_mapped(h, NULL, 0, map, "publish", "--batch", h_path(h, "orders.jsonl")),
        0);
}

/* The shop's laws: every order paid or cancelled, never both, never cancelled early, an
 * event exactly for each cancelled one, stock back for exactly the cancelled ones, seats
 * held only by paid orders. */
static void assert_shop_laws(h_ctx_t *h, int n, int64_t paid) {
    assert_int_equal(
        h_sql_int(h, "SELECT count(*) FROM shop.orders WHERE status = 'paid'"), paid);
    assert_int_equal(
        h_sql_int(h, "SELECT count(*) FROM shop.orders WHERE status = 'cancelled'"),
        n - paid);
    assert_int_equal(h_sql_int(h, "SELECT count(*) FROM shop.orders WHERE status = 'paid'"
                                  " AND cancelled_at IS NOT NULL"),
                     0);
    assert_int_equal(h_sql_int(h, "SELECT count(*) FROM shop.orders WHERE status ="
                                  " 'cancelled' AND cancelled_at < pay_deadline"),
                     0);
    assert_int_equal(h_sql_int(h, "SELECT count(*) FROM events"), n - paid);
    assert_int_equal(h_sql_int(h, "SELECT count(DISTINCT order_id) FROM events"),
                     n - paid);
    assert_int_equal(
        h_sql_int(h, "SELECT count(*) FROM events e JOIN shop.orders o"
                     " ON o.id::text = e.order_id WHERE o.status <> 'cancelled'"),
        0);
    assert_int_equal(
        h_sql_int(h,
                  "SELECT count(*) FROM shop.inventory i WHERE i.stock <>"
                  " %d - coalesce((SELECT sum(it.qty) FROM shop.order_items it"
                  " JOIN shop.orders o ON o.id = it.order_id WHERE"
                  " it.sku = i.sku AND o.status = 'paid'), 0)",
                  STOCK),
        0);
    assert_int_equal(h_sql_int(h, "SELECT count(*) FROM shop.seats s JOIN shop.orders o"
                                  " ON o.id = s.held_by WHERE o.status <> 'paid'"),
                     0);
    assert_int_equal(
        h_sql_int(h, "SELECT count(*) FROM shop.seats WHERE held_by IS NULL"), n - paid);
}

static size_t count_in(h_ctx_t *h, const char *const *logs, const char *needle) {
    size_t total = 0;
    for (int i = 0; logs[i] != NULL; i++) {
        total += h_count_lines(h, logs[i], needle);
    }
    return total;
}

/* A queue of the test's bound to the events exchange: the consumers' order.cancelled
 * events are published into it, not returned unroutable and left in the outbox. */
static amqp_connection_state_t open_tap(h_ctx_t *h) {
    amqp_connection_state_t conn = h_amqp_open(h);
    h_tap_events(h, conn);
    return conn;
}

/* Every event went out (the outbox empties within wait_ms, the consumers still running),
 * and the tap holds one for each of the cancelled orders. Delivery is at least once (a
 * consumer killed between a confirm and its mark sends that event again), so the number
 * of messages is printed, not held to the number of orders. */
static void assert_events_published(h_ctx_t *h, amqp_connection_state_t conn,
                                    int64_t cancelled, int wait_ms) {
    assert_int_equal(h_wait_outbox_empty(h, wait_ms), 0);
    size_t total = 0;
    size_t orders = h_tap_event_orders(conn, h->tap, &total);
    printf("events published=%zu orders=%zu cancelled=%lld\n", total, orders,
           (long long)cancelled);
    assert_int_equal(orders, (size_t)cancelled);
    h_amqp_close(conn);
}

/* The shop's payment statement races two consumers over 1,000 orders around their
 * deadline: exactly one wins each order, and paid orders are never cancelled. */
static void test_shop_payments_race_the_consumers(void **state) {
    (void)state;
    H_SKIP_UNLESS_PG("orders maps");
    h_ctx_t h;
    h_setup(&h, "map-race", "3s", true);
    amqp_connection_state_t conn = open_tap(&h);
    const int n = 1000;
    make_shop(&h, n, 4000);
    write_map(&h, "map.json", MAP_HEAD MAP_RELEASE "}");
    publish_all(&h, "map.json", n);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM scheduled WHERE scheduled = 1"),
                     n);
    const char *logs[] = {"consumer-0.log", "consumer-1.log", NULL};
    pid_t c0 = consumer(&h, "map.json", logs[0], NULL);
    pid_t c1 = consumer(&h, "map.json", logs[1], NULL);
    /* Every odd order's payment is tried, from a quarter second before the deadline on,
     * in a loop that the deadline and the consumers overtake. */
    int64_t due = h_sql_int(&h, "SELECT (extract(epoch FROM min(pay_deadline)) * 1000)"
                                "::bigint FROM shop.orders");
    while (h_now_ms() < due - 250) {
        usleep(5000);
    }
    /* About one a millisecond, so that the payments run on past the deadline. */
    int64_t paid = 0, refused = 0;
    for (int i = 1; i <= n; i += 2) {
        int64_t won = h_sql_int(&h, SHOP_PAY, i);
        paid += won;
        refused += 1 - won;
        usleep(1000);
    }
    assert_int_equal(
        h_wait_sql(&h, 0, h_ms(30000),
                   "SELECT count(*) FROM shop.orders WHERE status = 'unpaid'"),
        0);
    printf("map-race orders=%d paid=%lld refused=%lld cancelled=%lld\n", n,
           (long long)paid, (long long)refused, (long long)(n - paid));
    assert_events_published(&h, conn, n - paid, h_ms(20000));
    assert_int_equal(h_stop(c0, SIGTERM, h_ms(15000)), 0);
    assert_int_equal(h_stop(c1, SIGTERM, h_ms(15000)), 0);
    /* The race was real: some payments made it, some came too late. */
    assert_true(paid > 0);
    assert_true(refused > 0);
    assert_shop_laws(&h, n, paid);
    assert_int_equal(count_in(&h, logs, "decision=cancelled"), (size_t)(n - paid));
    h_teardown(&h);
}

/* Each mistake in a map is one line naming it, and exit 2. */
static void test_map_errors_are_one_line_and_exit_2(void **state) {
    (void)state;
    H_SKIP_UNLESS_PG("orders maps");
    h_ctx_t h;
    h_setup(&h, "map-errors", "30m", true);
    make_shop(&h, 1, 60000);
    static const struct {
        const char *map;
        const char *says;
    } cases[] = {
        {"{\"table\": \"shop.nope\", \"id\": \"id\", \"status\": \"status\", \"pending\":"
         " \"unpaid\", \"paid\": \"paid\", \"cancelled\": \"cancelled\", \"deadline\":"
         " \"pay_deadline\"}",
         "table shop.nope does not exist"},
        {"{\"table\": \"shop.orders\", \"id\": \"id\", \"status\": \"state\", "
         "\"pending\":"
         " \"unpaid\", \"paid\": \"paid\", \"cancelled\": \"cancelled\", \"deadline\":"
         " \"pay_deadline\"}",
         "column \"state\" (\"status\") does not exist in shop.orders"},
        {"{\"table\": \"shop.orders\", \"id\": \"id\", \"status\": \"status\", "
         "\"pending\":"
         " \"unpaid\", \"paid\": \"paid\", \"cancelled\": \"cancelled\", \"deadline\":"
         " \"status\"}",
         "column shop.orders.status is text; want timestamp with time zone"},
        {"{\"table\": \"shop.orders\", \"id\": \"id\", \"status\": \"status\", \"paid\":"
         " \"paid\", \"cancelled\": \"cancelled\", \"deadline\": \"pay_deadline\"}",
         "\"pending\" is missing"},
        {MAP_HEAD "\"on_cancel\": [\"UPDATE shop.nothing SET x = 1 WHERE id = $1\"]}",
         "on_cancel statement 1 does not prepare"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char file[32];
        snprintf(file, sizeof file, "bad-%zu.json", i);
        write_map(&h, file, cases[i].map);
        size_t before = h_count_lines(&h, "cli.log", "");
        int code = lapse_mapped(&h, NULL, 0, file, "status", "1", NULL);
        if (code != 2 || h_count_lines(&h, "cli.log", cases[i].says) != 1 ||
            h_count_lines(&h, "cli.log", "") != before + 1) {
            fail_msg("case %zu: exit %d, want 2 and one line with \"%s\" (see %s)", i,
                     code, cases[i].says, h_path(&h, "cli.log"));
        }
    }
    /* The shop's tables are untouched by all that. */
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM shop.orders WHERE status ="
                                   " 'unpaid'"),
                     1);
    h_teardown(&h);
}

/* A failing on_cancel rolls the whole cancel back, retries, and ends parked with the
 * database's error; the other orders are cancelled, nothing is half done. */
static void test_failing_on_cancel_rolls_back_and_parks(void **state) {
    (void)state;
    H_SKIP_UNLESS_PG("orders maps");
    h_ctx_t h;
    h_setup(&h, "map-failing", "2s", true);
    const int n = 20;
    make_shop(&h, n, 2000);
    /* Order 7's seat release divides by zero; it runs after the stock release. */
    write_map(&h, "map.json",
              MAP_HEAD
              "\"on_cancel\": [\"UPDATE shop.inventory i SET stock = i.stock +"
              " it.qty FROM shop.order_items it WHERE it.order_id = $1 AND"
              " it.sku = i.sku\", \"UPDATE shop.seats SET held_by = NULL WHERE"
              " held_by = $1 AND 1 / (CASE WHEN $1 = 7 THEN 0 ELSE 1 END) = 1\"]}");
    publish_all(&h, "map.json", n);
    char map_path[PATH_MAX + 64];
    snprintf(map_path, sizeof map_path, "%s", h_path(&h, "map.json"));
    const char *args[] = {"--orders-map",   map_path, "consume",
                          "--max-attempts", "2",      NULL};
    pid_t c = h_spawn(&h, "consumer.log", args);
    assert_int_equal(h_wait_sql(&h, n - 1, h_ms(20000),
                                "SELECT count(*) FROM shop.orders WHERE status ="
                                " 'cancelled'"),
                     n - 1);
    /* Parked after its second failed attempt (the retry waits 1 s). */
    char out[8192] = "";
    for (int64_t until = h_now_ms() + h_ms(20000);
         h_now_ms() < until && strstr(out, "division by zero") == NULL;) {
        usleep(200000);
        lapse_mapped(&h, out, sizeof out, "map.json", "parked", "list", NULL);
    }
    assert_non_null(strstr(out, "division by zero"));
    assert_int_equal(h_stop(c, SIGTERM, h_ms(15000)), 0);
    /* Order 7: still unpaid, its stock and seat still taken, no event. */
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM shop.orders WHERE id = 7 AND"
                                   " status = 'unpaid' AND cancelled_at IS NULL"),
                     1);
    assert_int_equal(
        h_sql_int(&h, "SELECT held_by FROM shop.seats WHERE seat = 'seat-7'"), 7);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM events WHERE order_id = '7'"),
                     0);
    /* Its stock is exactly what the other cancellations gave back, nothing more. */
    assert_int_equal(h_sql_int(&h,
                               "SELECT count(*) FROM shop.inventory i WHERE i.stock <>"
                               " %d - coalesce((SELECT sum(it.qty) FROM shop.order_items"
                               " it JOIN shop.orders o ON o.id = it.order_id WHERE"
                               " it.sku = i.sku AND o.status = 'unpaid'), 0)",
                               STOCK),
                     0);
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=cancelled"),
                     (size_t)n - 1);
    h_teardown(&h);
}

/* Three consumers, one killed mid-flow, half the orders paid in time by the shop: every
 * unpaid order cancelled once, with its release. */
static void test_competing_consumers_and_a_crash(void **state) {
    (void)state;
    H_SKIP_UNLESS_PG("orders maps");
    h_ctx_t h;
    h_setup(&h, "map-crash", "3s", true);
    amqp_connection_state_t conn = open_tap(&h);
    const int n = 600;
    make_shop(&h, n, 3000);
    write_map(&h, "map.json", MAP_HEAD MAP_RELEASE "}");
    const char *logs[] = {"consumer-0.log", "consumer-1.log", "consumer-2.log", NULL};
    pid_t c[3];
    for (int i = 0; i < 3; i++) {
        c[i] = consumer(&h, "map.json", logs[i], NULL);
    }
    publish_all(&h, "map.json", n);
    int64_t paid = 0;
    for (int i = 2; i <= n; i += 2) {
        paid += h_sql_int(&h, SHOP_PAY, i);
    }
    assert_int_equal(paid, n / 2);
    assert_true(h_wait_sql(&h, 1, h_ms(20000),
                           "SELECT count(*) > 0 FROM shop.orders WHERE status ="
                           " 'cancelled'") == 1);
    assert_int_equal(h_stop(c[1], SIGKILL, h_ms(5000)), 128 + SIGKILL);
    assert_int_equal(
        h_wait_sql(&h, 0, h_ms(30000),
                   "SELECT count(*) FROM shop.orders WHERE status = 'unpaid'"),
        0);
    /* The killed consumer's claims on events it had in hand run out first. */
    assert_events_published(&h, conn, n - paid, h_ms(20000) + h_claim_wait_ms(&h));
    assert_int_equal(h_stop(c[0], SIGTERM, h_ms(15000)), 0);
    assert_int_equal(h_stop(c[2], SIGTERM, h_ms(15000)), 0);
    assert_shop_laws(&h, n, paid);
    h_teardown(&h);
}

/* A consumer whose wall clock is 5 min ahead cancels nothing early, and one 5 min
 * behind cancels on time: the database's clock decides. The deadlines are the window
 * form (created_at + 3s). */
static void test_wrong_clocks_and_a_window_deadline(void **state) {
    (void)state;
    H_SKIP_UNLESS_PG("orders maps");
    if (!h_faketime_available()) {
        fprintf(stderr, "skipped: libfaketime is not installed (scripts/setup)\n");
        skip();
    }
    h_ctx_t h;
    h_setup(&h, "map-clock", "3s", true);
    const int half = 50;
    make_shop(&h, 0, 0);
    write_map(
        &h, "map.json",
        "{\"table\": \"shop.orders\", \"id\": \"id\", \"status\": \"status\","
        " \"pending\": \"unpaid\", \"paid\": \"paid\", \"cancelled\": \"cancelled\","
        " \"cancelled_at\": \"cancelled_at\","
        " \"deadline\": {\"column\": \"created_at\", \"window\": \"3s\"}," MAP_RELEASE
        "}");
    static const char *const ahead[] = {H_FAKETIME_ENV, "FAKETIME=+300", NULL};
    static const char *const behind[] = {H_FAKETIME_ENV, "FAKETIME=-300", NULL};
    const char *const *clocks[2] = {ahead, behind};
    const char *logs[2] = {"consumer-ahead.log", "consumer-behind.log"};
    for (int round = 0; round < 2; round++) {
        /* pay_deadline is not the map's deadline here; it only has to exist. */
        add_orders(&h, round * half + 1, (round + 1) * half, 3000);
        FILE *f = fopen(h_path(&h, "orders.jsonl"), "w");
        assert_non_null(f);
        for (int i = round * half + 1; i <= (round + 1) * half; i++) {
            fprintf(f, "{\"order_id\":\"%d\"}\n", i);
        }
        fclose(f);
        assert_int_equal(lapse_mapped(&h, NULL, 0, "map.json", "publish", "--batch",
                                      h_path(&h, "orders.jsonl")),
                         0);
        pid_t c = consumer(&h, "map.json", logs[round], clocks[round]);
        assert_int_equal(h_wait_sql(&h, 0, h_ms(30000),
                                    "SELECT count(*) FROM shop.orders WHERE status ="
                                    " 'unpaid'"),
                         0);
        assert_int_equal(h_stop(c, SIGTERM, h_ms(15000)), 0);
    }
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM shop.orders WHERE"
                                   " cancelled_at < created_at + interval '3 seconds'"),
                     0);
    int64_t lag = h_sql_int(&h,
                            "SELECT (extract(epoch FROM max(cancelled_at - (created_at"
                            " + interval '3 seconds'))) * 1000)::bigint FROM"
                            " shop.orders WHERE id > %d",
                            half);
    printf("map-clock behind_max_lag_ms=%lld\n", (long long)lag);
    assert_true(lag < 5000);
    assert_shop_laws(&h, 2 * half, 0);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shop_payments_race_the_consumers),
        cmocka_unit_test(test_map_errors_are_one_line_and_exit_2),
        cmocka_unit_test(test_failing_on_cancel_rolls_back_and_parks),
        cmocka_unit_test(test_competing_consumers_and_a_crash),
        cmocka_unit_test(test_wrong_clocks_and_a_window_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT
 * Test g: the CLI contract of DESIGN.md (help, usage, exit codes, JSON) for real. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define OUT_CAP 16384

static int64_t wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* What the CLI wrote to stderr (cli.log) since offset mark; caller frees. */
static size_t log_mark(h_ctx_t *h) {
    struct stat st;
    return stat(h_path(h, "cli.log"), &st) == 0 ? (size_t)st.st_size : 0;
}

static char *log_since(h_ctx_t *h, size_t mark) {
    FILE *f = fopen(h_path(h, "cli.log"), "r");
    char *buf = calloc(1, OUT_CAP);
    assert_non_null(buf);
    if (f) {
        fseek(f, (long)mark, SEEK_SET);
        size_t n = fread(buf, 1, OUT_CAP - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
    return buf;
}

static size_t lines_starting(const char *text, const char *prefix) {
    size_t n = 0;
    for (const char *p = text; p && *p;) {
        n += strncmp(p, prefix, strlen(prefix)) == 0;
        p = strchr(p, '\n');
        p = p ? p + 1 : NULL;
    }
    return n;
}

/* args: at most 6, NULL-terminated. Exit 2, nothing on stdout, and on stderr first one
 * error line that names the problem (a usage text may follow it). */
static void expect_usage(h_ctx_t *h, const char *fragment, const char *const *args) {
    const char *a[7] = {NULL};
    for (size_t i = 0; i < 6 && args[i]; i++) {
        a[i] = args[i];
    }
    char out[OUT_CAP];
    size_t mark = log_mark(h);
    int code = h_lapse(h, out, sizeof out, a[0], a[1], a[2], a[3], a[4], a[5], NULL);
    char *err = log_since(h, mark);
    fprintf(stderr, "usage case [%s %s %s ...] -> %d: %.*s\n", a[0] ? a[0] : "",
            a[1] ? a[1] : "", a[2] ? a[2] : "", code, (int)strcspn(err, "\n"), err);
    assert_int_equal(code, 2);
    assert_string_equal(out, "");
    assert_true(strncmp(err, "lapse", 5) == 0);
    size_t first = strcspn(err, "\n");
    assert_true(err[first] == '\n');
    char line[1024];
    snprintf(line, sizeof line, "%.*s", (int)first, err);
    if (!strstr(line, fragment)) {
        fail_msg("error line '%s' does not mention '%s'", line, fragment);
    }
    assert_int_equal(lines_starting(err, "lapse"), 1);
    free(err);
}

static void test_help_and_usage_errors(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "cli-usage", "2s,3s", false);
    char out[OUT_CAP];

    const char *commands[] = {NULL,     "publish",  "pay", "consume",
                              "status", "topology", "demo"};
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        size_t mark = log_mark(&h);
        int code = commands[i] ? h_lapse(&h, out, sizeof out, commands[i], "--help", NULL)
                               : h_lapse(&h, out, sizeof out, "--help", NULL);
        fprintf(stderr, "%s --help -> %d\n", commands[i] ? commands[i] : "lapse", code);
        assert_int_equal(code, 0);
        assert_true(strncmp(out, "usage: lapse", 12) == 0);
        if (commands[i]) {
            char want[64];
            snprintf(want, sizeof want, "lapse %s", commands[i]);
            assert_non_null(strstr(out, want));
        } else {
            for (size_t c = 1; c < sizeof commands / sizeof commands[0]; c++) {
                assert_non_null(strstr(out, commands[c]));
            }
        }
        assert_int_equal(log_mark(&h), mark); /* nothing on stderr */
    }
    assert_int_equal(h_lapse(&h, out, sizeof out, "publish", "-h", NULL), 0);
    assert_true(strncmp(out, "usage: lapse publish", 20) == 0);

    /* Global options. */
    expect_usage(&h, "--bogus", (const char *[]){"--bogus", "status", NULL});
    expect_usage(&h, "--classes", (const char *[]){"--classes", NULL});
    expect_usage(&h, "no command", (const char *[]){NULL});
    expect_usage(&h, "frobnicate", (const char *[]){"frobnicate", NULL});
    expect_usage(&h, "amqp",
                 (const char *[]){"--amqp", "http://127.0.0.1/", "status", NULL});
    expect_usage(&h, "classes", (const char *[]){"--classes", "soon", "status", NULL});
    /* publish */
    expect_usage(&h, "--bogus", (const char *[]){"publish", "--bogus", "o1", NULL});
    expect_usage(&h, "ORDER_ID", (const char *[]){"publish", NULL});
    expect_usage(&h, "ORDER_ID", (const char *[]){"publish", "o1", "o2", NULL});
    expect_usage(&h, "--timeout", (const char *[]){"publish", "o1", "--timeout", NULL});
    expect_usage(&h, "invalid order id", (const char *[]){"publish", "bad id!", NULL});
    char long_id[130];
    memset(long_id, 'x', 129);
    long_id[129] = '\0';
    expect_usage(&h, "invalid order id", (const char *[]){"publish", long_id, NULL});
    expect_usage(
        &h, "in the past",
        (const char *[]){"publish", "o1", "--deadline", "2020-01-01T00:00:00Z", NULL});
    expect_usage(&h, "too far ahead",
                 (const char *[]){"publish", "o1", "--timeout", "3200d", NULL});
    expect_usage(
        &h, "too far ahead",
        (const char *[]){"publish", "o1", "--deadline", "2099-01-01T00:00:00Z", NULL});
    expect_usage(&h, "--deadline",
                 (const char *[]){"publish", "o1", "--deadline", "tomorrow", NULL});
    expect_usage(&h, "not both",
                 (const char *[]){"publish", "o1", "--timeout", "7s", "--deadline",
                                  "2030-01-01T00:00:00Z", NULL});
    expect_usage(&h, "--timeout",
                 (const char *[]){"publish", "o1", "--timeout", "soon", NULL});
    /* pay, status, topology, consume, demo */
    expect_usage(&h, "ORDER_ID", (const char *[]){"pay", NULL});
    expect_usage(&h, "ORDER_ID", (const char *[]){"pay", "o1", "o2", NULL});
    expect_usage(&h, "invalid order id", (const char *[]){"pay", "bad id!", NULL});
    expect_usage(&h, "--bogus", (const char *[]){"status", "--bogus", NULL});
    expect_usage(&h, "ORDER_ID", (const char *[]){"status", "o1", "o2", NULL});
    expect_usage(&h, "declare", (const char *[]){"topology", NULL});
    expect_usage(&h, "frob", (const char *[]){"topology", "frob", NULL});
    expect_usage(&h, "--prefetch", (const char *[]){"consume", "--prefetch", NULL});
    expect_usage(&h, "prefetch", (const char *[]){"consume", "--prefetch", "0", NULL});
    expect_usage(&h, "extra", (const char *[]){"consume", "extra", NULL});
    expect_usage(&h, "extra", (const char *[]){"demo", "extra", NULL});

    /* Refused before anything was touched: the store was never even created. */
    assert_int_not_equal(access(h.db_path, F_OK), 0);
    h_teardown(&h);
}

static json_t *run_json(h_ctx_t *h, int expect_code, const char *a1, const char *a2) {
    char out[OUT_CAP];
    int code = h_lapse(h, out, sizeof out, "status", a1, a2, NULL);
    fprintf(stderr, "status %s %s -> %d %s", a1 ? a1 : "", a2 ? a2 : "", code, out);
    assert_int_equal(code, expect_code);
    json_error_t jerr;
    json_t *root = json_loads(out, 0, &jerr);
    if (!root) {
        fail_msg("status printed no JSON: %s (%s)", jerr.text, out);
    }
    return root;
}

/* `status ORDER --json`: exactly the keys of DESIGN.md, with their types. */
static json_t *order_json(h_ctx_t *h, const char *order_id, const char *want_status) {
    json_t *o = run_json(h, 0, order_id, "--json");
    static const char *const keys[] = {"order_id",      "status",     "deadline_ms",
                                       "created_at_ms", "paid_at_ms", "cancelled_at_ms",
                                       "holds"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (!json_object_get(o, keys[i])) {
            fail_msg("status %s --json lacks \"%s\"", order_id, keys[i]);
        }
    }
    assert_int_equal(json_object_size(o), sizeof keys / sizeof keys[0]);
    assert_string_equal(json_string_value(json_object_get(o, "order_id")), order_id);
    assert_string_equal(json_string_value(json_object_get(o, "status")), want_status);
    assert_true(json_is_integer(json_object_get(o, "deadline_ms")));
    assert_true(json_is_integer(json_object_get(o, "created_at_ms")));
    assert_true(json_is_array(json_object_get(o, "holds")));
    return o;
}

static json_int_t jint(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    assert_true(json_is_integer(v));
    return json_integer_value(v);
}

/* {"queues":{name:{"messages":N,"consumers":N}},"orders":{"pending":N,...},
 * "outbox":{"pending":N}} with exactly the topology's queues and the given order counts.
 */
static json_t *overview_json(h_ctx_t *h, json_int_t pending, json_int_t paid,
                             json_int_t cancelled) {
    json_t *st = run_json(h, 0, "--json", NULL);
    assert_int_equal(json_object_size(st), 3);
    /* The outbox backlog: events not yet published. */
    json_t *outbox = json_object_get(st, "outbox");
    assert_int_equal(json_object_size(outbox), 1);
    assert_int_equal(
        jint(outbox, "pending"),
        h_sql_int(h, "SELECT count(*) FROM events WHERE published_at_ms IS NULL"));
    json_t *queues = json_object_get(st, "queues");
    json_t *orders = json_object_get(st, "orders");
    assert_true(json_is_object(queues));
    assert_true(json_is_object(orders));
    const char *suffixes[] = {"hold.2s",  "hold.3s", "hold.10m", "delay.00",
                              "delay.27", "expired", "parked"};
    assert_int_equal(json_object_size(queues), 5 + 28);
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        char name[160];
        snprintf(name, sizeof name, "%s.%s", h->prefix, suffixes[i]);
        json_t *q = json_object_get(queues, name);
        if (!q) {
            fail_msg("status --json lacks queue %s", name);
        }
        assert_int_equal(json_object_size(q), 2);
        assert_true(jint(q, "messages") >= 0);
        assert_true(jint(q, "consumers") >= 0);
    }
    assert_int_equal(json_object_size(orders), 3);
    assert_int_equal(jint(orders, "pending"), pending);
    assert_int_equal(jint(orders, "paid"), paid);
    assert_int_equal(jint(orders, "cancelled"), cancelled);
    return st;
}

static json_int_t q_stat(h_ctx_t *h, json_t *st, const char *suffix, const char *key) {
    char name[160];
    snprintf(name, sizeof name, "%s.%s", h->prefix, suffix);
    return jint(json_object_get(json_object_get(st, "queues"), name), key);
}

static void test_publish_pay_status(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "cli-orders", "2s,3s,10m", true);
    char out[OUT_CAP];
    size_t mark;
    char *err;

    /* Unknown orders: 4, for pay and status alike. */
    mark = log_mark(&h);
    assert_int_equal(h_lapse(&h, out, sizeof out, "pay", "nosuch", NULL), 4);
    err = log_since(&h, mark);
    assert_non_null(strstr(err, "no such order"));
    assert_int_equal(lines_starting(err, "lapse"), 1);
    free(err);
    assert_int_equal(h_lapse(&h, out, sizeof out, "status", "nosuch", "--json", NULL), 4);
    assert_string_equal(out, "");

    /* Published, then paid in time. */
    assert_int_equal(h_lapse(&h, out, sizeof out, "publish", "p1", "--timeout", "3s",
                             "--hold", "seat-2", "--hold", "seat-1", NULL),
                     0);
    assert_non_null(strstr(out, "order_id=p1"));
    assert_int_equal(h_sql_int(&h, "SELECT scheduled FROM orders WHERE order_id='p1'"),
                     1);
    assert_int_equal(h_lapse(&h, out, sizeof out, "pay", "p1", NULL), 0);
    assert_int_equal(h_lapse(&h, out, sizeof out, "pay", "p1", NULL), 0); /* idempotent */
    json_t *o = order_json(&h, "p1", "paid");
    json_int_t created = jint(o, "created_at_ms"), deadline = jint(o, "deadline_ms");
    assert_int_equal(deadline - created, 3000);
    assert_true(jint(o, "paid_at_ms") >= created && jint(o, "paid_at_ms") < deadline);
    assert_true(json_is_null(json_object_get(o, "cancelled_at_ms")));
    json_t *holds = json_object_get(o, "holds");
    assert_int_equal(json_array_size(holds), 2);
    assert_string_equal(json_string_value(json_array_get(holds, 0)), "seat-1");
    assert_string_equal(json_string_value(json_array_get(holds, 1)), "seat-2");
    json_decref(o);

    /* w1 waits ten minutes; l1 is left to lapse. */
    assert_int_equal(
        h_lapse(&h, out, sizeof out, "publish", "w1", "--timeout", "10m", NULL), 0);
    assert_int_equal(h_lapse(&h, out, sizeof out, "publish", "l1", "--timeout", "2s",
                             "--hold", "slot-9", NULL),
                     0);
    int64_t l1_deadline =
        h_sql_int(&h, "SELECT deadline_ms FROM orders WHERE order_id='l1'");
    /* The same id with another window is refused, and changes nothing. */
    mark = log_mark(&h);
    assert_int_equal(
        h_lapse(&h, out, sizeof out, "publish", "l1", "--timeout", "3s", NULL), 3);
    err = log_since(&h, mark);
    fprintf(stderr, "republish l1: %s", err);
    assert_non_null(strstr(err, "l1"));
    free(err);
    assert_int_equal(h_sql_int(&h, "SELECT deadline_ms FROM orders WHERE order_id='l1'"),
                     l1_deadline);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders"), 3);

    /* Overview before any consumer: p1's and l1's messages are held or expired, w1's
     * is held, nobody consumes. */
    json_t *st = overview_json(&h, 2, 1, 0);
    assert_int_equal(q_stat(&h, st, "hold.10m", "messages"), 1);
    assert_int_equal(q_stat(&h, st, "hold.2s", "messages") +
                         q_stat(&h, st, "hold.3s", "messages") +
                         q_stat(&h, st, "expired", "messages"),
                     2);
    assert_int_equal(q_stat(&h, st, "parked", "messages"), 0);
    assert_int_equal(q_stat(&h, st, "delay.00", "messages"), 0);
    const char *all[] = {"hold.2s",  "hold.3s", "hold.10m", "delay.00",
                         "delay.27", "expired", "parked"};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        assert_int_equal(q_stat(&h, st, all[i], "consumers"), 0);
    }
    json_decref(st);

    /* Past its deadline, l1 can no longer be paid, even before it is cancelled. */
    while (wall_ms() <= l1_deadline + 20) {
        usleep(20000);
    }
    mark = log_mark(&h);
    assert_int_equal(h_lapse(&h, out, sizeof out, "pay", "l1", NULL), 3);
    err = log_since(&h, mark);
    fprintf(stderr, "late pay l1: %s", err);
    assert_non_null(strstr(err, "lapsed"));
    free(err);

    pid_t consumer = h_spawn_consumer(&h, "consumer.log", NULL);
    assert_int_equal(h_wait_sql(&h, 1, h_ms(15000),
                                "SELECT count(*) FROM orders WHERE order_id='l1' AND "
                                "status='cancelled'"),
                     1);
    mark = log_mark(&h);
    assert_int_equal(h_lapse(&h, out, sizeof out, "pay", "l1", NULL), 3);
    err = log_since(&h, mark);
    fprintf(stderr, "pay cancelled l1: %s", err);
    assert_non_null(strstr(err, "cancelled"));
    assert_int_equal(lines_starting(err, "lapse"), 1);
    free(err);
    o = order_json(&h, "l1", "cancelled");
    assert_int_equal(jint(o, "deadline_ms"), l1_deadline);
    assert_true(jint(o, "cancelled_at_ms") >= l1_deadline);
    assert_true(json_is_null(json_object_get(o, "paid_at_ms")));
    holds = json_object_get(o, "holds");
    assert_int_equal(json_array_size(holds), 1);
    assert_string_equal(json_string_value(json_array_get(holds, 0)), "slot-9");
    json_decref(o);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM holds WHERE order_id='l1' AND "
                                   "released_at_ms IS NOT NULL"),
                     1);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM holds WHERE order_id='p1' AND "
                                   "released_at_ms IS NULL"),
                     2);

    /* Once p1's message came through too (a no-op), only w1's message is left. */
    for (int t = 0;
         t < h_ms(100) && h_count_lines(&h, "consumer.log", "decision=noop_paid") < 1;
         t++) {
        usleep(100000);
    }
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=noop_paid"), 1);
    st = overview_json(&h, 1, 1, 1);
    assert_int_equal(q_stat(&h, st, "hold.10m", "messages"), 1);
    for (size_t i = 0; i < 6; i++) {
        if (strcmp(all[i], "hold.10m") != 0) {
            assert_int_equal(q_stat(&h, st, all[i], "messages"), 0);
        }
        assert_int_equal(q_stat(&h, st, all[i], "consumers"),
                         strcmp(all[i], "expired") == 0);
    }
    json_decref(st);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    h_teardown(&h);
}

static void test_batch_with_bad_lines(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "cli-batch", "2s,3s", true);
    FILE *f = fopen(h_path(&h, "batch.jsonl"), "w");
    assert_non_null(f);
    fputs("{\"order_id\":\"b1\",\"timeout\":\"2s\",\"holds\":[\"h-1\"]}\n" /* 1 ok */
          "{\"order_id\":\"b2\",\"timeout\":\n"                           /* 2 bad JSON */
          "{\"order_id\":\"bad id!\",\"timeout\":\"2s\"}\n"               /* 3 bad id */
          "{\"order_id\":\"b4\",\"timeout\":\"3s\"}\n"                    /* 4 ok */
          "{\"order_id\":\"b5\",\"timeout\":\"2s\",\"colour\":\"red\"}\n" /* 5 unknown
                                                                             field */
          "{\"order_id\":\"b6\",\"deadline\":\"2020-01-01T00:00:00Z\"}\n" /* 6 past */
          "\n"                                                            /* 7 blank */
          "{\"order_id\":\"b8\",\"timeout\":\"2s\"}\n",                   /* 8 ok */
          f);
    fclose(f);
    size_t mark = log_mark(&h);
    int code =
        h_lapse(&h, NULL, 0, "publish", "--batch", h_path(&h, "batch.jsonl"), NULL);
    char *err = log_since(&h, mark);
    fprintf(stderr, "batch -> %d:\n%s", code, err);
    assert_true(code > 0 && code < 128);

    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders"), 3);
    assert_int_equal(h_sql_int(&h,
                               "SELECT count(*) FROM orders WHERE order_id IN "
                               "('b1','b4','b8') AND status='pending' AND scheduled=1"),
                     3);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM holds WHERE order_id='b1'"), 1);

    const int bad[] = {2, 3, 5, 6}, good[] = {1, 4, 7, 8};
    for (size_t i = 0; i < 4; i++) {
        char needle[32];
        snprintf(needle, sizeof needle, "line %d:", bad[i]);
        if (lines_starting(err, "lapse publish: ") == 0 || !strstr(err, needle)) {
            fail_msg("stderr does not report %s", needle);
        }
        assert_int_equal(h_count_lines(&h, "cli.log", needle), 1);
        snprintf(needle, sizeof needle, "line %d:", good[i]);
        assert_int_equal(h_count_lines(&h, "cli.log", needle), 0);
    }
    assert_non_null(strstr(err, "colour"));
    assert_non_null(strstr(err, "in the past"));
    free(err);

    /* The three good ones are on the broker. */
    amqp_connection_state_t conn = h_amqp_open(&h);
    char q2[160], q3[160], qx[160];
    snprintf(q2, sizeof q2, "%s.hold.2s", h.prefix);
    snprintf(q3, sizeof q3, "%s.hold.3s", h.prefix);
    snprintf(qx, sizeof qx, "%s.expired", h.prefix);
    assert_int_equal(
        h_queue_depth(conn, q2) + h_queue_depth(conn, q3) + h_queue_depth(conn, qx), 3);
    h_amqp_close(conn);
    h_teardown(&h);
}

static void test_unreachable_broker(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "cli-down", "2s", true);
    char good_url[sizeof h.amqp];
    memcpy(good_url, h.amqp, sizeof good_url);
    snprintf(h.amqp, sizeof h.amqp, "amqp://guest:guest@127.0.0.1:1/%%2f");
    char out[OUT_CAP];

    size_t mark = log_mark(&h);
    int64_t t0 = mono_ms();
    int code = h_lapse(&h, out, sizeof out, "publish", "u1", "--timeout", "2s", NULL);
    int64_t took = mono_ms() - t0;
    char *err = log_since(&h, mark);
    fprintf(stderr, "publish to a closed port -> %d after %lld ms:\n%s", code,
            (long long)took, err);
    assert_int_equal(code, 1);
    assert_string_equal(out, "");
    assert_true(took < h_ms(6000)); /* 250+500+1000+2000 ms of back-off */
    /* It retried, then gave up with one clear last line naming the address. */
    assert_true(h_count_lines(&h, "cli.log", "retrying") >= 1);
    char *last = err + strlen(err);
    assert_true(last > err && last[-1] == '\n');
    for (last--; last > err && last[-1] != '\n'; last--) {
    }
    assert_true(strncmp(last, "lapse", 5) == 0);
    assert_non_null(strstr(last, "127.0.0.1:1"));
    assert_null(strstr(last, "retrying"));
    free(err);
    /* Nothing in the store claims the order was scheduled (or is anything but pending).
     */
    int64_t rows = h_sql_int(&h, "SELECT count(*) FROM orders WHERE order_id='u1'");
    fprintf(stderr, "u1 rows in the store after the failed publish: %lld\n",
            (long long)rows);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE order_id='u1' AND "
                                   "(status != 'pending' OR scheduled != 0)"),
                     0);

    /* The other broker commands fail the same way, without a usage error. */
    assert_int_equal(h_lapse(&h, out, sizeof out, "status", "--json", NULL), 1);
    assert_string_equal(out, "");
    assert_int_equal(h_lapse(&h, out, sizeof out, "topology", "declare", NULL), 1);

    /* Once the broker is there, the same publish goes through. */
    memcpy(h.amqp, good_url, sizeof good_url);
    assert_int_equal(
        h_lapse(&h, out, sizeof out, "publish", "u1", "--timeout", "2s", NULL), 0);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE order_id='u1' AND "
                                   "status='pending' AND scheduled=1"),
                     1);
    h_teardown(&h);
}

static int64_t count_in(const char *db_path, const char *order_id) {
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        sqlite3_close(db);
        return -1;
    }
    sqlite3_stmt *st = NULL;
    int64_t n = -1;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM orders WHERE order_id = ?1", -1, &st,
                           NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, order_id, -1, SQLITE_STATIC);
        if (sqlite3_step(st) == SQLITE_ROW) {
            n = sqlite3_column_int64(st, 0);
        }
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
}

static int unset_env(void **state) {
    (void)state;
    unsetenv("LAPSE_STORE");
    unsetenv("LAPSE_PREFIX");
    return 0;
}

/* A class configured here but not declared on the broker: the broker returns the
 * mandatory publish, publish exits 1, and the order stays pending and unscheduled until
 * the same command is retried. */
static void test_returned_publish_fails_and_stays_unscheduled(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "cli-return", "2s", true);
    snprintf(h.classes, sizeof h.classes, "2s,7s");
    assert_int_equal(h_lapse(&h, NULL, 0, "publish", "r1", "--timeout", "7s", NULL), 1);
    assert_int_equal(h_count_lines(&h, "cli.log", "r1: the broker returned"), 1);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE order_id='r1' AND "
                                   "status='pending' AND scheduled=0"),
                     1);
    /* Once the queue exists, retrying the same command publishes it with the deadline
     * recorded the first time. */
    int64_t deadline =
        h_sql_int(&h, "SELECT deadline_ms FROM orders WHERE order_id='r1'");
    assert_int_equal(h_lapse(&h, NULL, 0, "topology", "declare", NULL), 0);
    assert_int_equal(h_lapse(&h, NULL, 0, "publish", "r1", "--timeout", "7s", NULL), 0);
    assert_int_equal(h_sql_int(&h,
                               "SELECT count(*) FROM orders WHERE order_id='r1' AND "
                               "status='pending' AND scheduled=1 AND deadline_ms=%lld",
                               (long long)deadline),
                     1);
    /* The declared class still works on the same store. */
    assert_int_equal(h_lapse(&h, NULL, 0, "publish", "r2", "--timeout", "2s", NULL), 0);
    assert_int_equal(h_sql_int(&h, "SELECT scheduled FROM orders WHERE order_id='r2'"),
                     1);
    h_teardown(&h);
}

static void test_flag_beats_variable(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "cli-env", "2s", true);
    char env_db[PATH_MAX + 16], env_store[PATH_MAX + 32];
    snprintf(env_db, sizeof env_db, "%s/env.db", h.dir);
    snprintf(env_store, sizeof env_store, "sqlite:%s", env_db);
    setenv("LAPSE_STORE", env_store, 1);
    char out[OUT_CAP];

    /* --store given: the variable is ignored. */
    assert_int_equal(
        h_lapse(&h, out, sizeof out, "publish", "e1", "--timeout", "2s", NULL), 0);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE order_id='e1'"), 1);
    assert_int_not_equal(access(env_db, F_OK), 0);

    /* No --store: the variable counts. */
    assert_int_equal(h_run(&h, out, sizeof out, "--amqp", h.amqp, "--prefix", h.prefix,
                           "--classes", h.classes, "publish", "e2", "--timeout", "2s",
                           NULL),
                     0);
    assert_int_equal(count_in(env_db, "e2"), 1);
    assert_int_equal(count_in(env_db, "e1"), 0);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE order_id='e2'"), 0);

    /* A bad variable behind a flag is not even looked at; without the flag it is a usage
     * error that names the variable. */
    setenv("LAPSE_PREFIX", "not a prefix!", 1);
    assert_int_equal(h_lapse(&h, out, sizeof out, "status", "e1", "--json", NULL), 0);
    size_t mark = log_mark(&h);
    assert_int_equal(h_run(&h, out, sizeof out, "status", "--json", NULL), 2);
    char *err = log_since(&h, mark);
    assert_true(strncmp(err, "lapse: LAPSE_PREFIX", 19) == 0);
    free(err);
    unset_env(NULL);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_and_usage_errors),
        cmocka_unit_test(test_publish_pay_status),
        cmocka_unit_test(test_batch_with_bad_lines),
        cmocka_unit_test(test_unreachable_broker),
        cmocka_unit_test(test_returned_publish_fails_and_stays_unscheduled),
        cmocka_unit_test_teardown(test_flag_beats_variable, unset_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

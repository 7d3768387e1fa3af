/* SPDX-License-Identifier: MIT
 * Test g: the CLI contract of docs/design.md, "The command line" (help, usage, exit
 * codes, JSON), for real. */
/* posix_spawn_file_actions_addchdir_np: a child started in another directory. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include "cli/options.h"

#include <lapse/config.h>
#include <lapse/store.h>

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

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

/* Run `lapse args...` (argv[0] is filled in) with no flags added, in directory cwd
 * (NULL: the test's), stdout into the file out_path ("/dev/full" allowed) and stderr
 * into err_path, with the test's environment. Returns the exit code. */
static int run_raw(h_ctx_t *h, const char *cwd, const char *out_path,
                   const char *err_path, const char *const *args) {
    const char *argv[32] = {h->bin};
    size_t n = 1;
    for (size_t i = 0; args[i] && n < 31; i++) {
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    if (cwd) {
        assert_int_equal(posix_spawn_file_actions_addchdir_np(&fa, cwd), 0);
    }
    pid_t pid;
    int rc = posix_spawn(&pid, h->bin, &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    assert_int_equal(rc, 0);
    return h_stop(pid, 0, h_ms(60000));
}

/* Whole file into a new string (caller frees); "" when missing. */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    size_t cap = 1 << 20;
    char *buf = calloc(1, cap);
    assert_non_null(buf);
    if (f) {
        size_t n = fread(buf, 1, cap - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
    return buf;
}

/* `lapse args...` with stdout and stderr captured (both freed by the caller). */
static int run_both(h_ctx_t *h, char **out, char **err, const char *const *args) {
    char out_path[PATH_MAX + 16], err_path[PATH_MAX + 16];
    snprintf(out_path, sizeof out_path, "%s/raw.out", h->dir);
    snprintf(err_path, sizeof err_path, "%s/raw.err", h->dir);
    int code = run_raw(h, NULL, out_path, err_path, args);
    *out = slurp(out_path);
    *err = slurp(err_path);
    return code;
}

/* The test's queues and exchanges off the broker (h_teardown leaves them): a node that
 * a later test restarts (the fault tests) recovers every queue still there, ~31 a test.
 */
static void drop_topology(h_ctx_t *h) {
    char *out, *err;
    const char *const args[] = {"--prefix", h->prefix, "--classes", h->classes,
                                "topology", "export",  NULL};
    if (run_both(h, &out, &err, args) == 0) {
        json_t *defs = json_loads(out, 0, NULL);
        amqp_connection_state_t conn = h_amqp_open(h);
        size_t i;
        json_t *item;
        json_array_foreach(json_object_get(defs, "queues"), i, item) {
            const char *name = json_string_value(json_object_get(item, "name"));
            amqp_queue_delete(conn, 1, amqp_cstring_bytes(name), 0, 0);
        }
        json_array_foreach(json_object_get(defs, "exchanges"), i, item) {
            const char *name = json_string_value(json_object_get(item, "name"));
            amqp_exchange_delete(conn, 1, amqp_cstring_bytes(name), 0);
        }
        h_amqp_close(conn);
        json_decref(defs);
    }
    free(out);
    free(err);
}

static void cli_teardown(h_ctx_t *h) {
    drop_topology(h);
    h_teardown(h);
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
    assert_false(h_store_exists(&h));
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

/* `status ORDER --json`: exactly the keys of docs/design.md ("The command line"),
 * with their types. */
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
    assert_int_equal(jint(outbox, "pending"),
                     h_sql_int(h, sf_sql_unpublished(h->sf.backend)));
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

    /* No store yet: pay creates none (exit 1), then an empty store is made. */
    mark = log_mark(&h);
    assert_int_equal(h_lapse(&h, out, sizeof out, "pay", "nosuch", NULL), 1);
    err = log_since(&h, mark);
    assert_non_null(strstr(err, "store not found"));
    free(err);
    assert_false(h_store_exists(&h));
    lapse_store_close(lapse_store_open(h.store, NULL, NULL));
    assert_true(h_store_exists(&h));

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
    /* The text shows how long each queue holds a message as a person reads it: the
     * longest rung holds 2^27 s, the classes keep their names. */
    assert_int_equal(h_lapse(&h, out, sizeof out, "status", NULL), 0);
    assert_non_null(strstr(out, " 1553d10h42m8s "));
    assert_null(strstr(out, "134217728s"));
    char line10m[256];
    snprintf(line10m, sizeof line10m, "%s.hold.10m", h.prefix);
    assert_non_null(strstr(out, line10m));
    assert_non_null(strstr(strstr(out, line10m), " 10m "));

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
    cli_teardown(&h);
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
    /* 9: a 1 MiB line (no batch line is that long): read past with bounded memory
     * (unit_line_reader checks the buffer), reported with its number; the batch goes
     * on to 10. */
    fputs("{\"order_id\":\"big\",\"pad\":\"", f);
    for (int i = 0; i < 1024 * 1024; i++) {
        fputc('x', f);
    }
    fputs("\"}\n{\"order_id\":\"b10\",\"timeout\":\"2s\"}\n", f); /* 10 ok */
    fclose(f);
    size_t mark = log_mark(&h);
    int code =
        h_lapse(&h, NULL, 0, "publish", "--batch", h_path(&h, "batch.jsonl"), NULL);
    char *err = log_since(&h, mark);
    fprintf(stderr, "batch -> %d:\n%s", code, err);
    assert_true(code > 0 && code < 128);

    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders"), 4);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE order_id IN "
                                   "('b1','b4','b8','b10') AND status='pending' AND "
                                   "scheduled=1"),
                     4);
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
    assert_non_null(strstr(err, "line 9: longer than 65536 bytes (1048603); skipped"));
    assert_int_equal(h_count_lines(&h, "cli.log", "line 10:"), 0);
    free(err);

    /* The four good ones are on the broker. */
    amqp_connection_state_t conn = h_amqp_open(&h);
    char q2[160], q3[160], qx[160];
    snprintf(q2, sizeof q2, "%s.hold.2s", h.prefix);
    snprintf(q3, sizeof q3, "%s.hold.3s", h.prefix);
    snprintf(qx, sizeof qx, "%s.expired", h.prefix);
    assert_int_equal(
        h_queue_depth(conn, q2) + h_queue_depth(conn, q3) + h_queue_depth(conn, qx), 4);
    h_amqp_close(conn);
    cli_teardown(&h);
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
    cli_teardown(&h);
}

/* Orders named order_id (a plain id) in another store; -1 when it cannot be read. */
static int64_t count_in(const sf_store_t *store, const char *order_id) {
    char err[1024], sql[256];
    sf_conn_t *c = sf_connect(store, true, err, sizeof err);
    int64_t n = -1;
    snprintf(sql, sizeof sql, "SELECT count(*) FROM orders WHERE order_id = '%s'",
             order_id);
    if (c == NULL || sf_query_int(c, sql, &n, err, sizeof err) != 0) {
        fprintf(stderr, "count_in: %s\n", err);
        n = -1;
    }
    sf_close(c);
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
    cli_teardown(&h);
}

static void test_flag_beats_variable(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "cli-env", "2s", true);
    /* Another store of the same backend: <dir>/env.db, or a second database. */
    sf_store_t env_store;
    assert_int_equal(sf_create(&env_store, "cli-env-var", h.dir, "env.db"), 0);
    setenv("LAPSE_STORE", env_store.uri, 1);
    char out[OUT_CAP];

    /* --store given: the variable is ignored. */
    assert_int_equal(
        h_lapse(&h, out, sizeof out, "publish", "e1", "--timeout", "2s", NULL), 0);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE order_id='e1'"), 1);
    assert_false(sf_exists(&env_store));

    /* No --store: the variable counts. */
    assert_int_equal(h_run(&h, out, sizeof out, "--amqp", h.amqp, "--prefix", h.prefix,
                           "--classes", h.classes, "publish", "e2", "--timeout", "2s",
                           NULL),
                     0);
    assert_int_equal(count_in(&env_store, "e2"), 1);
    assert_int_equal(count_in(&env_store, "e1"), 0);
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
    if (h.pg) {
        sf_drop(&env_store);
    }
    cli_teardown(&h);
}

/* ---- Issue 9: CLI conventions ---- */

static void test_options_before_or_after_the_command(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "cli-order", "2s,10m", true);
    char out[OUT_CAP], first[OUT_CAP];
    /* Every global option after the command, and command options among them. */
    assert_int_equal(h_run(&h, out, sizeof out, "publish", "a1", "--timeout", "10m",
                           "--amqp", h.amqp, "--store", h.store, "--prefix", h.prefix,
                           "--classes", h.classes, "--hold", "seat-1", NULL),
                     0);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM holds WHERE order_id='a1'"), 1);
    assert_int_equal(h_run(&h, first, sizeof first, "status", "--json", "--store",
                           h.store, "--amqp", h.amqp, "--prefix", h.prefix, "--classes",
                           h.classes, NULL),
                     0);
    assert_non_null(strstr(first, "\"pending\":1"));
    /* The same before the command, and mixed, with --opt=value spellings. */
    assert_int_equal(h_run(&h, out, sizeof out, "--store", h.store, "--amqp", h.amqp,
                           "--prefix", h.prefix, "--classes", h.classes, "status",
                           "--json", NULL),
                     0);
    assert_string_equal(out, first);
    char store_eq[sizeof h.store + 16];
    snprintf(store_eq, sizeof store_eq, "--store=%s", h.store);
    assert_int_equal(h_run(&h, out, sizeof out, "--amqp", h.amqp, "status", store_eq,
                           "--prefix", h.prefix, "--json", "--classes", h.classes, NULL),
                     0);
    assert_string_equal(out, first);
    /* One order, options around it. */
    assert_int_equal(
        h_run(&h, out, sizeof out, "status", "--store", h.store, "a1", "--json", NULL),
        0);
    assert_non_null(strstr(out, "\"order_id\":\"a1\""));
    assert_int_equal(h_run(&h, out, sizeof out, "pay", "--store", h.store, "a1", NULL),
                     0);
    /* After "--", nothing is an option: "--json" is the order id, which is invalid. */
    assert_int_equal(h_lapse(&h, out, sizeof out, "status", "--", "--json", NULL), 4);
    /* A command's option given to another command: one usage line. */
    expect_usage(&h, "'--limit' does not apply to 'lapse status'",
                 (const char *[]){"status", "--limit", "3", NULL});
    expect_usage(&h, "'--all' does not apply to 'lapse parked list'",
                 (const char *[]){"parked", "list", "--all", NULL});
    expect_usage(&h, "'--prefetch' does not apply to 'lapse publish'",
                 (const char *[]){"publish", "x1", "--prefetch", "5", NULL});
    expect_usage(&h, "'--json' takes no value",
                 (const char *[]){"status", "--json=yes", NULL});
    expect_usage(&h, "unknown option '-x'", (const char *[]){"status", "-x", NULL});
    /* The test hook that shifted the clock is gone from the shipped binary (issue 10):
     * it could cancel early (sweep) or take a late payment (pay). */
    expect_usage(&h, "unknown option '--clock-skew'",
                 (const char *[]){"--clock-skew", "1h", "sweep", NULL});
    expect_usage(&h, "unknown option '--clock-skew'",
                 (const char *[]){"pay", "x1", "--clock-skew=-1h", NULL});
    cli_teardown(&h);
}

static void test_version_and_help(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "cli-help", "2s", false);
    char *out, *err, *top;
    char want[64];
    snprintf(want, sizeof want, "lapse %s\n", lapse_version());
    const char *const version_args[][3] = {
        {"--version", NULL}, {"-V", NULL}, {"status", "-V", NULL}, {"-V", "frob", NULL}};
    for (size_t i = 0; i < sizeof version_args / sizeof version_args[0]; i++) {
        assert_int_equal(run_both(&h, &out, &err, version_args[i]), 0);
        assert_string_equal(out, want);
        assert_string_equal(err, "");
        free(out);
        free(err);
    }
    assert_string_equal(lapse_version(), LAPSE_VERSION);

    /* `help` is `--help`; it lists every option and every variable. */
    assert_int_equal(run_both(&h, &top, &err, (const char *[]){"--help", NULL}), 0);
    free(err);
    assert_int_equal(run_both(&h, &out, &err, (const char *[]){"help", NULL}), 0);
    assert_string_equal(out, top);
    assert_string_equal(err, "");
    free(out);
    free(err);
    assert_int_equal(run_both(&h, &out, &err, (const char *[]){"-h", NULL}), 0);
    assert_string_equal(out, top);
    free(out);
    free(err);
    for (size_t i = 0; i < cli_n_options; i++) {
        const cli_option_t *opt = &cli_options[i];
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", opt->name);
        bool listed = strstr(top, flag) != NULL;
        if (listed != !(opt->flags & CLI_HIDDEN)) {
            fail_msg("lapse --help %s %s", listed ? "shows" : "leaves out", flag);
        }
        const char *env = opt->property ? lapse_config_property_env(opt->property) : NULL;
        if (env && !strstr(top, env)) {
            fail_msg("lapse --help leaves out %s", env);
        }
    }

    /* Every command: `help CMD` == `CMD --help` == `CMD -h`, exit 0, nothing on stderr.
     */
    for (size_t i = 0; i < cli_n_commands; i++) {
        const cli_command_t *c = &cli_commands[i];
        const char *name = c->name, *action = c->action;
        const char *a_help[5] = {"help", name, action, NULL};
        const char *a_flag[5] = {name, action ? action : "--help",
                                 action ? "--help" : NULL};
        const char *a_h[5] = {name, action ? action : "-h", action ? "-h" : NULL};
        char *by_help, *by_flag;
        assert_int_equal(run_both(&h, &by_help, &err, a_help), 0);
        assert_string_equal(err, "");
        free(err);
        assert_int_equal(run_both(&h, &by_flag, &err, a_flag), 0);
        assert_string_equal(err, "");
        free(err);
        assert_string_equal(by_help, by_flag);
        assert_int_equal(run_both(&h, &out, &err, a_h), 0);
        assert_string_equal(out, by_flag);
        free(out);
        free(err);
        char label[64];
        snprintf(label, sizeof label, "usage: lapse %s%s%s", name, action ? " " : "",
                 action ? action : "");
        if (strncmp(by_flag, label, strlen(label)) != 0) {
            fail_msg("'%s --help' begins '%.40s'", label + 7, by_flag);
        }
        /* Its own options, each with its default and variable when it has them. */
        for (size_t k = 0; k < cli_n_options; k++) {
            const cli_option_t *opt = &cli_options[k];
            if (opt->commands == CLI_GLOBAL || !cli_option_accepts(opt, c->cmd) ||
                (opt->flags & CLI_HIDDEN) ||
                (c->cmd == CLI_CMD_CONFIG && opt->property)) {
                continue;
            }
            char flag[64];
            snprintf(flag, sizeof flag, "--%s", opt->name);
            const char *env =
                opt->property ? lapse_config_property_env(opt->property) : NULL;
            if (!strstr(by_flag, flag) || (env && !strstr(by_flag, env))) {
                fail_msg("'%s --help' leaves out %s", label + 7, flag);
            }
        }
        free(by_help);
        free(by_flag);
    }
    free(top);
    expect_usage(&h, "unknown command 'frob'", (const char *[]){"help", "frob", NULL});
    expect_usage(&h, "unknown action 'parked frob'",
                 (const char *[]){"help", "parked", "frob", NULL});
    h_teardown(&h);
}

/* A store that does not exist: a file in a fresh directory, or a database without
 * lapse's schema. */
static void expect_store_not_found(h_ctx_t *h, const sf_store_t *missing,
                                   const char *const *args) {
    const char *a[16] = {"--store", missing->uri, "--amqp",
                         h->amqp,   "--prefix",   h->prefix};
    size_t n = 6;
    for (size_t i = 0; args[i]; i++) {
        a[n++] = args[i];
    }
    char *out, *err;
    int code = run_both(h, &out, &err, a);
    fprintf(stderr, "%s %s on a missing store -> %d: %s", args[0], args[1] ? args[1] : "",
            code, err);
    assert_int_equal(code, 1);
    assert_string_equal(out, "");
    assert_non_null(strstr(err, "store not found"));
    assert_true(strchr(err, '\n') == err + strlen(err) - 1); /* one line */
    assert_false(sf_exists(missing));
    free(out);
    free(err);
}

static void test_read_only_commands_never_create_a_store(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "cli-ro", "2s", true);
    /* <dir>/typo.db, or a database that lapse never opened. */
    sf_store_t typo;
    assert_int_equal(sf_create(&typo, "cli-ro-typo", h.dir, "typo.db"), 0);
    const char *uri = typo.uri;
    const char *const cases[][4] = {
        {"status", NULL},
        {"status", "--json", NULL},
        {"status", "o1", NULL},
        {"pending", NULL},
        {"sweep", "--dry-run", NULL},
        {"sweep", "-n", NULL},
        {"pay", "o1", NULL},
        {"reconcile", NULL},
        {"reconcile", "--dry-run", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        expect_store_not_found(&h, &typo, cases[i]);
    }
    /* The variable, as a typo in LAPSE_STORE would be. */
    setenv("LAPSE_STORE", uri, 1);
    char *out, *err;
    assert_int_equal(
        run_both(&h, &out, &err, (const char *[]){"pending", "--json", NULL}), 1);
    assert_non_null(strstr(err, "store not found"));
    assert_false(sf_exists(&typo));
    free(out);
    free(err);
    unsetenv("LAPSE_STORE");
    /* parked list reads the broker only: no store either. */
    assert_int_equal(h_run(&h, NULL, 0, "--store", uri, "--amqp", h.amqp, "--prefix",
                           h.prefix, "parked", "list", NULL),
                     0);
    assert_false(sf_exists(&typo));

    /* A command that writes creates it; then the readers find it. */
    assert_int_equal(h_run(&h, NULL, 0, "--store", uri, "--amqp", h.amqp, "--prefix",
                           h.prefix, "--classes", h.classes, "publish", "o1", "--timeout",
                           "2s", NULL),
                     0);
    assert_true(sf_exists(&typo));
    assert_int_equal(h_run(&h, NULL, 0, "--store", uri, "status", "o1", NULL), 0);
    assert_int_equal(h_run(&h, NULL, 0, "--store", uri, "pending", NULL), 0);
    if (h.pg) {
        sf_drop(&typo);
        drop_topology(&h);
    }
    H_SKIP_ON_PG(&h, "the default store sqlite:lapse.db, relative to the working "
                     "directory, is SQLite's");

    /* The default store is relative to the working directory: `lapse status` in a
     * directory without one (as `/` was in the issue) creates no lapse.db there. */
    char cwd[PATH_MAX + 16], out_path[PATH_MAX + 32], err_path[PATH_MAX + 32];
    snprintf(cwd, sizeof cwd, "%s/elsewhere", h.dir);
    assert_int_equal(mkdir(cwd, 0700), 0);
    snprintf(out_path, sizeof out_path, "%s/ro.out", h.dir);
    snprintf(err_path, sizeof err_path, "%s/ro.err", h.dir);
    assert_int_equal(run_raw(&h, cwd, out_path, err_path,
                             (const char *[]){"status", "--amqp", h.amqp, NULL}),
                     1);
    err = slurp(err_path);
    assert_non_null(strstr(err, "store not found: sqlite:lapse.db"));
    free(err);
    char db[PATH_MAX + 48];
    snprintf(db, sizeof db, "%s/lapse.db", cwd);
    assert_int_not_equal(access(db, F_OK), 0);
    cli_teardown(&h);
}

static unsigned mode_of(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fail_msg("stat %s: %s", path, strerror(errno));
    }
    return (unsigned)(st.st_mode & 07777);
}

static void test_new_store_files_are_private(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "cli-mode", "2s", true);
    if (h.pg) {
        drop_topology(&h);
    }
    H_SKIP_ON_PG(&h, "file modes of the SQLite store and its -wal and -shm files");
    static const mode_t umasks[] = {0, 022, 077};
    for (size_t i = 0; i < sizeof umasks / sizeof umasks[0]; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%.*s/mode-%03o.db", PATH_MAX - 32, h.dir,
                 (unsigned)umasks[i]);
        snprintf(h.store, sizeof h.store, "sqlite:%s", path);
        mode_t old = umask(umasks[i]);
        /* A consumer holds the store open, so its -wal and -shm files exist. */
        char log[32];
        snprintf(log, sizeof log, "consumer-%zu.log", i);
        pid_t consumer = h_spawn_consumer(&h, log, NULL);
        umask(old);
        char wal[PATH_MAX + 48], shm[PATH_MAX + 48];
        snprintf(wal, sizeof wal, "%s-wal", path);
        snprintf(shm, sizeof shm, "%s-shm", path);
        for (int t = 0;
             t < h_ms(200) && (h_count_lines(&h, log, "event=consuming") < 1 ||
                               access(wal, F_OK) != 0 || access(shm, F_OK) != 0);
             t++) {
            usleep(50000);
        }
        fprintf(stderr, "umask %03o: db %03o wal %03o shm %03o\n", (unsigned)umasks[i],
                mode_of(path), mode_of(wal), mode_of(shm));
        assert_int_equal(mode_of(path), 0600);
        assert_int_equal(mode_of(wal), 0600);
        assert_int_equal(mode_of(shm), 0600);
        assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    }
    cli_teardown(&h);
}

static void test_stdout_write_error_exits_1(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "cli-full", "2s", false);
    char err_path[PATH_MAX + 32];
    snprintf(err_path, sizeof err_path, "%s/full.err", h.dir);
    /* A big output (written while the command runs) and a small one (at exit). */
    const char *const cases[][3] = {
        {"topology", "export", NULL}, {"--version", NULL}, {"help", "--markdown", NULL}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int code = run_raw(&h, NULL, "/dev/full", err_path, cases[i]);
        char *err = slurp(err_path);
        fprintf(stderr, "%s > /dev/full -> %d: %s", cases[i][0], code, err);
        assert_int_equal(code, 1);
        assert_string_equal(err,
                            "lapse: write error on stdout: No space left on device\n");
        free(err);
    }
    h_teardown(&h);
}

static void expect_no_secret(h_ctx_t *h, int want_code, const char *fragment,
                             const char *const *args) {
    char *out, *err;
    int code = run_both(h, &out, &err, args);
    fprintf(stderr, "secret case [%s %s] -> %d: %s", args[0], args[1] ? args[1] : "",
            code, err);
    assert_int_equal(code, want_code);
    if (strstr(err, "s3cr3t") || strstr(out, "s3cr3t")) {
        fail_msg("the password was shown: %s%s", err, out);
    }
    if (fragment && !strstr(err, fragment)) {
        fail_msg("'%s' not in: %s", fragment, err);
    }
    free(out);
    free(err);
}

static void test_secrets_are_never_echoed(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "cli-secret", "2s", false);
    /* Mistyped flag names: reported by name, the value never. */
    expect_no_secret(&h, 2, "unknown option '--amqp-url'",
                     (const char *[]){"--amqp-url=amqp://u:s3cr3t@h/", "status", NULL});
    expect_no_secret(&h, 2, "unknown option '--amqp-url'",
                     (const char *[]){"status", "--amqp-url=amqp://u:s3cr3t@h/", NULL});
    expect_no_secret(
        &h, 2, "unknown option '--amqp-url'",
        (const char *[]){"status", "--amqp-url", "amqp://u:s3cr3t@h/", NULL});
    expect_no_secret(
        &h, 2, "unknown option '--storage'",
        (const char *[]){"--storage=postgres://u:s3cr3t@db/x", "status", NULL});
    /* Invalid values of secret-bearing options and variables. */
    const char *const bad_urls[] = {
        "http://u:s3cr3t@h/",    "amqps://u:s3cr3t@h/",   "amqp://u:s3cr3t@h:99999/",
        "amqp://u:s3cr3t@h/",    "amqp://u:s3cr3t@h/a/b", "amqp://u:s3 cr3t@h/%2f",
        "amqp://u:s3cr3t@h/%zz",
    };
    for (size_t i = 0; i < sizeof bad_urls / sizeof bad_urls[0]; i++) {
        expect_no_secret(&h, 2, "--amqp",
                         (const char *[]){"--amqp", bad_urls[i], "status", NULL});
        char eq[128];
        snprintf(eq, sizeof eq, "--amqp=%s", bad_urls[i]);
        expect_no_secret(&h, 2, "--amqp", (const char *[]){"config", eq, NULL});
        setenv("LAPSE_AMQP_URL", bad_urls[i], 1);
        expect_no_secret(&h, 2, "LAPSE_AMQP_URL", (const char *[]){"config", NULL});
        unsetenv("LAPSE_AMQP_URL");
    }
    expect_no_secret(
        &h, 2, "--store",
        (const char *[]){"--store", "mysql://u:s3cr3t@db/x", "status", NULL});
    /* A PostgreSQL store that does not answer (nothing listens on port 1): exit 1. */
    expect_no_secret(
        &h, 1, "open store",
        (const char *[]){"--store", "postgres://u:s3cr3t@127.0.0.1:1/x", "status", NULL});
    /* A password where something else was expected. */
    expect_no_secret(&h, 2, "unknown command",
                     (const char *[]){"amqp://u:s3cr3t@h/", "status", NULL});
    expect_no_secret(&h, 2, "classes",
                     (const char *[]){"--classes", "amqp://u:s3cr3t@h/", "config", NULL});
    expect_no_secret(&h, 2, "invalid order id",
                     (const char *[]){"publish", "amqp://u:s3cr3t@h/", NULL});
    expect_no_secret(&h, 2, "invalid order id",
                     (const char *[]){"pay", "amqp://u:s3cr3t@h/", NULL});
    expect_no_secret(&h, 2, "unexpected argument",
                     (const char *[]){"pending", "amqp://u:s3cr3t@h/", NULL});
    /* A long argument: the line is cut after the password was hidden, not before. */
    for (size_t pad = 960; pad < 1040; pad += 7) {
        char arg[1200];
        memset(arg, 'x', pad);
        snprintf(arg + pad, sizeof arg - pad, "amqp://u:s3cr3t@h/");
        expect_no_secret(&h, 2, "unknown command", (const char *[]){arg, NULL});
    }
    /* A good URL with a password: `config` shows it as ***. */
    expect_no_secret(&h, 0, NULL,
                     (const char *[]){"config", "--amqp", "amqp://u:s3cr3t@h/%2f", NULL});
    expect_no_secret(&h, 0, NULL,
                     (const char *[]){"config", "--json", "--amqp",
                                      "amqps://u:s3cr3t@h:5671/%2f", NULL});
    h_teardown(&h);
}

/* `lapse config --json` with args: the setting's value and where it came from. */
static void config_value(h_ctx_t *h, const cli_option_t *opt, const char *const *args,
                         char *value, char *from) {
    char *out, *err;
    int code = run_both(h, &out, &err, args);
    if (code != 0) {
        fail_msg("config for --%s -> %d: %s", opt->name, code, err);
    }
    json_error_t jerr;
    json_t *root = json_loads(out, 0, &jerr);
    assert_non_null(root);
    json_t *row = json_object_get(root, opt->name);
    if (!row) {
        fail_msg("config --json has no \"%s\": %s", opt->name, out);
    }
    snprintf(value, 512, "%s", json_string_value(json_object_get(row, "value")));
    snprintf(from, 64, "%s", json_string_value(json_object_get(row, "from")));
    json_decref(root);
    free(out);
    free(err);
}

/* Table-driven over the option table itself: a new setting is tested by its row. */
static void test_every_setting_has_a_variable_and_the_flag_beats_it(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "cli-vars", "2s", false);
    size_t settings = 0;
    for (size_t i = 0; i < cli_n_options; i++) {
        const cli_option_t *opt = &cli_options[i];
        if (!opt->property) {
            continue;
        }
        settings++;
        const char *env = lapse_config_property_env(opt->property);
        const char *def = lapse_config_property_default(opt->property);
        if (!env || !def || !opt->example) {
            fail_msg("--%s: setting without a variable, default or example", opt->name);
        }
        unsetenv(env);
        char d[512], e[512], f[512], from[64];
        config_value(&h, opt, (const char *[]){"config", "--json", NULL}, d, from);
        assert_string_equal(from, "default");
        /* The variable counts... */
        setenv(env, opt->example, 1);
        config_value(&h, opt, (const char *[]){"config", "--json", NULL}, e, from);
        fprintf(stderr, "--%s: default %s, %s=%s gives %s (from %s)\n", opt->name, d, env,
                opt->example, e, from);
        assert_string_equal(from, env);
        assert_string_not_equal(e, d);
        /* ...and the flag, before or after the command, beats it. */
        char flag[96];
        snprintf(flag, sizeof flag, "--%s", opt->name);
        config_value(&h, opt, (const char *[]){"config", "--json", flag, def, NULL}, f,
                     from);
        assert_string_equal(f, d);
        assert_string_equal(from, flag);
        config_value(&h, opt, (const char *[]){flag, def, "config", "--json", NULL}, f,
                     from);
        assert_string_equal(f, d);
        /* An empty variable counts as unset. */
        setenv(env, "", 1);
        config_value(&h, opt, (const char *[]){"config", "--json", NULL}, f, from);
        assert_string_equal(f, d);
        assert_string_equal(from, "default");
        unsetenv(env);
    }
    fprintf(stderr, "%zu settings\n", settings);
    assert_true(settings >= 11);
    /* Every property that has a variable has an option. */
    for (size_t i = 0; lapse_config_property_name(i); i++) {
        const char *name = lapse_config_property_name(i);
        if (!lapse_config_property_env(name)) {
            continue;
        }
        bool found = false;
        for (size_t k = 0; k < cli_n_options; k++) {
            found = found || (cli_options[k].property &&
                              strcmp(cli_options[k].property, name) == 0);
        }
        if (!found) {
            fail_msg("property %s has no option", name);
        }
    }
    /* A bad consumer variable does not stop a command that does not use it... */
    setenv("LAPSE_PREFETCH", "lots", 1);
    char *out, *err;
    assert_int_equal(
        run_both(&h, &out, &err, (const char *[]){"topology", "export", NULL}), 0);
    free(out);
    free(err);
    /* ...and stops one that does, naming it. */
    assert_int_equal(run_both(&h, &out, &err, (const char *[]){"consume", NULL}), 2);
    assert_true(strncmp(err, "lapse: LAPSE_PREFETCH: ", 23) == 0);
    free(out);
    free(err);
    unsetenv("LAPSE_PREFETCH");
    h_teardown(&h);
}

static void test_readme_reference_is_generated(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "cli-readme", "2s", false);
    const char *src = getenv("LAPSE_SOURCE_DIR");
    assert_non_null(src);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/README.md", src);
    char *readme = slurp(path);
    char *out, *err;
    assert_int_equal(
        run_both(&h, &out, &err, (const char *[]){"help", "--markdown", NULL}), 0);
    assert_string_equal(err, "");
    const char *begin = strstr(readme, "<!-- options:begin");
    const char *end_marker = "<!-- options:end -->\n";
    const char *end = begin ? strstr(begin, end_marker) : NULL;
    if (!begin || !end) {
        fail_msg("README.md has no options:begin/options:end block");
    }
    size_t len = (size_t)(end + strlen(end_marker) - begin);
    if (len != strlen(out) || memcmp(begin, out, len) != 0) {
        fail_msg("README.md's options reference differs from `lapse help --markdown`; "
                 "run scripts/readme-options");
    }
    /* It names every shown option and variable, and no hidden switch. */
    for (size_t i = 0; i < cli_n_options; i++) {
        char flag[64];
        snprintf(flag, sizeof flag, "`--%s", cli_options[i].name);
        bool shown = !(cli_options[i].flags & CLI_HIDDEN);
        assert_int_equal(strstr(out, flag) != NULL, shown);
    }
    free(out);
    free(err);
    free(readme);
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
        cmocka_unit_test(test_options_before_or_after_the_command),
        cmocka_unit_test(test_version_and_help),
        cmocka_unit_test_teardown(test_read_only_commands_never_create_a_store,
                                  unset_env),
        cmocka_unit_test(test_new_store_files_are_private),
        cmocka_unit_test(test_stdout_write_error_exits_1),
        cmocka_unit_test(test_secrets_are_never_echoed),
        cmocka_unit_test(test_every_setting_has_a_variable_and_the_flag_beats_it),
        cmocka_unit_test(test_readme_reference_is_generated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

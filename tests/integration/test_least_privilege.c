/* SPDX-License-Identifier: MIT
 * Issue 10: the permissions the README documents are enough, and used as written. A
 * publisher user publishes; a consumer user consumes, cancels, parks, sends an early
 * message back down the ladder, publishes events and probes the broker's clock; an
 * operator user declares the topology and lists parked messages. Each user has exactly
 * the README's regular expressions, for the test's prefix. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ORDERS 12

/* The README's regular expressions with "lapse" replaced by prefix p (letters, digits
 * and dashes only, so it needs no escaping), in JSON (backslashes doubled). */
static void permissions_json(const char *role, const char *p, char *out, size_t cap) {
    if (strcmp(role, "consumer") == 0) {
        snprintf(out, cap,
                 "{\"configure\":\"^amq\\\\.gen-.*\","
                 "\"write\":\"^(%s\\\\.(parked|events|delay\\\\.\\\\d\\\\d)|amq\\\\."
                 "default)$\","
                 "\"read\":\"^(%s\\\\.expired|amq\\\\.gen-.*)$\"}",
                 p, p);
    } else if (strcmp(role, "publisher") == 0) {
        snprintf(
            out, cap,
            "{\"configure\":\"^$\",\"write\":\"^%s\\\\.(hold|delay\\\\.\\\\d\\\\d)$\","
            "\"read\":\"^$\"}",
            p);
    } else {
        snprintf(
            out, cap,
            "{\"configure\":\"^%s\\\\.\",\"write\":\"^%s\\\\.\",\"read\":\"^%s\\\\.\"}",
            p, p, p);
    }
}

/* A user named lv-<role>-<pid> with password "pw" and the role's permissions on "/"; its
 * URL into url. */
static void make_user(h_ctx_t *h, const char *role, char *url, size_t cap) {
    char name[64], path[128], body[1024];
    snprintf(name, sizeof name, "lv-%s-%d", role, (int)getpid());
    snprintf(path, sizeof path, "/api/users/%s", name);
    int st = h_http(h, "PUT", path, NULL, "{\"password\":\"pw\",\"tags\":\"\"}");
    assert_true(st == 201 || st == 204);
    permissions_json(role, h->prefix, body, sizeof body);
    snprintf(path, sizeof path, "/api/permissions/%%2F/%s", name);
    st = h_http(h, "PUT", path, NULL, body);
    assert_true(st == 201 || st == 204);
    const char *at = strchr(h->amqp, '@');
    assert_non_null(at);
    snprintf(url, cap, "amqp://%s:pw%s", name, at);
}

static void drop_user(h_ctx_t *h, const char *role) {
    char path[128];
    snprintf(path, sizeof path, "/api/users/lv-%s-%d", role, (int)getpid());
    h_http(h, "DELETE", path, NULL, NULL);
}

static void test_least_privilege_users_do_their_jobs(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "lp", "2s", true);
    char guest[sizeof h.amqp];
    snprintf(guest, sizeof guest, "%s", h.amqp);
    char pub_url[sizeof h.amqp], cons_url[sizeof h.amqp], op_url[sizeof h.amqp];
    make_user(&h, "publisher", pub_url, sizeof pub_url);
    make_user(&h, "consumer", cons_url, sizeof cons_url);
    make_user(&h, "operator", op_url, sizeof op_url);
    amqp_connection_state_t conn = h_amqp_open(&h);
    char events[160], tap[160], parked[160], expired[160];
    snprintf(events, sizeof events, "%s.events", h.prefix);
    snprintf(tap, sizeof tap, "%s.tap", h.prefix);
    snprintf(parked, sizeof parked, "%s.parked", h.prefix);
    snprintf(expired, sizeof expired, "%s.expired", h.prefix);
    h_tap(&h, conn, "tap", events, "order.cancelled");

    /* The publisher: a class's holding queue (2s) and the ladder (3s is no class). */
    snprintf(h.amqp, sizeof h.amqp, "%s", pub_url);
    const char *args[] = {"publish", "--batch", "-", NULL};
    int in = -1;
    pid_t pub = h_spawn_stdin(&h, "publish.log", args, &in);
    for (int i = 0; i < ORDERS; i++) {
        char line[96];
        int len =
            snprintf(line, sizeof line, "{\"order_id\":\"ord-%d\",\"timeout\":\"%s\"}\n",
                     i, i % 2 ? "3s" : "2s");
        assert_int_equal(write(in, line, (size_t)len), len);
    }
    close(in);
    assert_int_equal(h_stop(pub, 0, h_ms(30000)), 0);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE scheduled = 1"),
                     ORDERS);

    /* Straight into the expired queue (as guest): a malformed message, to be parked, and
     * an undated copy of ord-0's message, sent back down the ladder once. */
    const char bad[] = "this is not json";
    h_publish_raw(conn, expired, "order.expired", bad, sizeof bad - 1, "mal-1");
    int64_t deadline =
        h_sql_int(&h, "SELECT deadline_ms FROM orders WHERE order_id='ord-0'");
    char body[256];
    char when[64];
    time_t secs = (time_t)(deadline / 1000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    int blen = snprintf(body, sizeof body,
                        "{\"v\":1,\"order_id\":\"ord-0\",\"deadline\":\"%s.%03dZ\","
                        "\"created_at\":\"%s.000Z\"}",
                        when, (int)(deadline % 1000), when);
    h_publish_raw(conn, expired, "order.expired", body, (size_t)blen, "ord-0");

    /* The consumer. */
    snprintf(h.amqp, sizeof h.amqp, "%s", cons_url);
    h_watch_t *watch = h_watch_start(&h);
    pid_t consumer = h_spawn_consumer(&h, "consumer.log", NULL);
    assert_int_equal(h_wait_sql(&h, ORDERS, h_ms(30000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     ORDERS);
    for (int i = 0; i < 200 && h_queue_depth(conn, parked) < 1; i++) {
        usleep(50000);
    }
    assert_int_equal(h_queue_depth(conn, parked), 1);
    assert_int_equal(
        h_wait_sql(&h, 0, h_ms(20000),
                   "SELECT count(*) FROM events WHERE published_at_ms IS NULL"),
        0);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    assert_int_equal(h_count_lines(&h, "consumer.log", "ACCESS_REFUSED"), 0);
    assert_int_equal(h_count_lines(&h, "consumer.log", "event=reconnect"), 0);
    assert_int_equal(h_count_lines(&h, "consumer.log", "event=clock_probe probes=5"), 1);
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=early"), 1);
    size_t total = 0;
    assert_int_equal(h_tap_event_orders(conn, tap, &total), ORDERS);

    /* The operator. */
    snprintf(h.amqp, sizeof h.amqp, "%s", op_url);
    assert_int_equal(h_lapse(&h, NULL, 0, "topology", "declare", NULL), 0);
    char out[8192];
    assert_int_equal(h_lapse(&h, out, sizeof out, "parked", "list", NULL), 0);
    assert_non_null(strstr(out, "ERR_MSG_JSON"));
    assert_int_equal(h_lapse(&h, NULL, 0, "status", NULL), 0);

    snprintf(h.amqp, sizeof h.amqp, "%s", guest);
    h_amqp_close(conn);
    const char *logs[] = {"consumer.log", NULL};
    h_laws_t laws;
    h_check_laws(&h, logs, watch, &laws);
    h_print_matrix("least-privilege", &laws, "");
    H_ASSERT_LAWS(laws);
    drop_user(&h, "publisher");
    drop_user(&h, "consumer");
    drop_user(&h, "operator");
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_least_privilege_users_do_their_jobs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT
 * Issues 10 and 13: the roles of `topology export --roles` (the README's table; the
 * definitions test keeps them equal), imported as the README says, are enough. A
 * publisher user publishes; a consumer user consumes, cancels, parks, sends an early
 * message back down the ladder, publishes events and probes the broker's clock; an
 * operator user declares the topology, lists and replays parked messages. And no more:
 * the publisher cannot consume the expired queue, the consumer cannot purge a holding
 * queue. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ORDERS 12

/* The three users of `lapse topology export --roles` for the test's prefix, imported
 * as the README says (definitions with no password), then each given the password "pw"
 * as `rabbitmqctl change_password` would; role's URL into url. */
static void import_roles(h_ctx_t *h) {
    char *json = malloc(1 << 16);
    assert_non_null(json);
    assert_int_equal(h_lapse(h, json, 1 << 16, "topology", "export", "--roles", NULL), 0);
    assert_int_equal(h_http(h, "POST", "/api/definitions", NULL, json), 204);
    free(json);
}

static void role_url(h_ctx_t *h, const char *role, char *url, size_t cap) {
    char name[sizeof h->prefix + 16];
    snprintf(name, sizeof name, "%s-%s", h->prefix, role);
    /* Imported without a password: the user cannot log in yet, with any password. */
    char saved[sizeof h->amqp];
    snprintf(saved, sizeof saved, "%s", h->amqp);
    const char *at = strchr(saved, '@');
    assert_non_null(at);
    for (int i = 0; i < 2; i++) {
        snprintf(h->amqp, sizeof h->amqp, "amqp://%s:%s%s", name, i ? "pw" : "guest", at);
        assert_int_equal(h_lapse(h, NULL, 0, "status", NULL), 1);
    }
    snprintf(h->amqp, sizeof h->amqp, "%s", saved);
    char line[PATH_MAX + 256];
    snprintf(line, sizeof line,
             "'%s' ctl '%s' change_password '%s' pw >>'%s/node.log' 2>&1",
             getenv("LAPSE_NODE_SCRIPT"), getenv("LAPSE_TEST_NODE"), name, h->dir);
    assert_int_equal(system(line), 0);
    snprintf(url, cap, "amqp://%s:pw%s", name, at);
}

/* The last RPC on conn's channel 1 was refused with 403 ACCESS_REFUSED; prints it. */
static void assert_access_refused(amqp_connection_state_t conn, const char *what) {
    amqp_rpc_reply_t r = amqp_get_rpc_reply(conn);
    assert_int_equal(r.reply_type, AMQP_RESPONSE_SERVER_EXCEPTION);
    assert_int_equal(r.reply.id, AMQP_CHANNEL_CLOSE_METHOD);
    const amqp_channel_close_t *close = r.reply.decoded;
    printf("%s: %d %.*s\n", what, close->reply_code, (int)close->reply_text.len,
           (const char *)close->reply_text.bytes);
    assert_int_equal(close->reply_code, 403);
    amqp_channel_close_ok_t ok = {0};
    amqp_send_method(conn, 1, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
    /* Channel 1 again, so the connection closes cleanly. */
    amqp_channel_open(conn, 1);
    assert_int_equal(amqp_get_rpc_reply(conn).reply_type, AMQP_RESPONSE_NORMAL);
}

static void drop_user(h_ctx_t *h, const char *role) {
    char path[128];
    snprintf(path, sizeof path, "/api/users/%s-%s", h->prefix, role);
    h_http(h, "DELETE", path, NULL, NULL);
}

static void test_least_privilege_users_do_their_jobs(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "lp", "2s", true);
    char guest[sizeof h.amqp];
    snprintf(guest, sizeof guest, "%s", h.amqp);
    char pub_url[sizeof h.amqp], cons_url[sizeof h.amqp], op_url[sizeof h.amqp];
    import_roles(&h);
    role_url(&h, "publisher", pub_url, sizeof pub_url);
    role_url(&h, "consumer", cons_url, sizeof cons_url);
    role_url(&h, "operator", op_url, sizeof op_url);
    amqp_connection_state_t conn = h_amqp_open(&h);
    char parked[160], expired[160];
    snprintf(parked, sizeof parked, "%s.parked", h.prefix);
    snprintf(expired, sizeof expired, "%s.expired", h.prefix);
    const char *tap = h_tap_events(&h, conn);

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
    assert_int_equal(h_wait_outbox_empty(&h, h_ms(20000)), 0);
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
    /* parked replay: back to the expired queue (no consumer runs now), parked empty. */
    assert_int_equal(h_lapse(&h, out, sizeof out, "parked", "replay", "--all", NULL), 0);
    assert_int_equal(h_queue_depth(conn, parked), 0);
    for (int i = 0; i < 100 && h_queue_depth(conn, expired) < 1; i++) {
        usleep(50000);
    }
    assert_int_equal(h_queue_depth(conn, expired), 1);

    /* What the roles may not do: the publisher consume from the expired queue, the
     * consumer purge a holding queue. */
    char hold[160];
    snprintf(hold, sizeof hold, "%s.hold.2s", h.prefix);
    snprintf(h.amqp, sizeof h.amqp, "%s", pub_url);
    amqp_connection_state_t pconn = h_amqp_open(&h);
    amqp_basic_consume(pconn, 1, amqp_cstring_bytes(expired), amqp_empty_bytes, 0, 0, 0,
                       amqp_empty_table);
    assert_access_refused(pconn, "publisher basic.consume expired");
    h_amqp_close(pconn);
    snprintf(h.amqp, sizeof h.amqp, "%s", cons_url);
    amqp_connection_state_t cconn = h_amqp_open(&h);
    amqp_queue_purge(cconn, 1, amqp_cstring_bytes(hold));
    assert_access_refused(cconn, "consumer queue.purge hold");
    /* Nor publish through the default exchange into a queue (amq.default is no write of
     * its: the clock probe goes through <prefix>.probe). The refusal closes the channel,
     * which the next synchronous method reports. */
    amqp_basic_publish(cconn, 1, amqp_empty_bytes, amqp_cstring_bytes(expired), 0, 0,
                       NULL, amqp_cstring_bytes("x"));
    amqp_basic_qos(cconn, 1, 0, 1, 0);
    assert_access_refused(cconn, "consumer publish via amq.default");
    h_amqp_close(cconn);
    assert_int_equal(h_queue_depth(conn, expired), 1);

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

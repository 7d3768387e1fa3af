/* SPDX-License-Identifier: MIT
 * Fault matrix a and g (issue 4): the broker node killed with SIGKILL while 1000 orders
 * are held and the consumer is busy, restarted 5 s later. The consumer reconnects by
 * itself; every unpaid order ends cancelled once, none early, paid ones never. With
 * classic queues dead-lettering is at-most-once, so orders whose message the broker lost
 * in flight are cancelled by `lapse sweep --grace 2s` (counted and reported); with
 * quorum queues (`it_fault_broker quorum`, row g) at-least-once dead-lettering must lose
 * nothing, so the sweep must find nothing to do.
 *
 * This test kills the shared test node: it always restarts it, and the group teardown
 * makes sure it answers again before the next test runs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <lapse/message.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ORDERS     1000
#define CLASS      "6s"
#define CLASS_MS   6000
#define KILL_AFTER 60 /* cancelled orders before the kill: the consumer is busy */
#define DOWN_MS    5000

static bool quorum;

static bool every_twentieth(int i) {
    return i % 20 == 0;
}

/* The number after "key=" in the text, -1 when absent. */
static long long kv(const char *text, const char *key) {
    char needle[64];
    snprintf(needle, sizeof needle, "%s=", key);
    const char *p = strstr(text, needle);
    return p ? atoll(p + strlen(needle)) : -1;
}

/* Even orders take the 6 s class, odd ones the ladder with deadlines spread over 4-10 s:
 * deliveries stream for seconds, and at the kill messages sit in the holding queue, on
 * the ladder's rungs, in the expired queue and in the consumer's hands. */
static int64_t write_orders(h_ctx_t *h) {
    FILE *f = fopen(h_path(h, "orders.jsonl"), "w");
    assert_non_null(f);
    int64_t now = h_now_ms();
    int64_t last = now + CLASS_MS;
    for (int i = 0; i < ORDERS; i++) {
        if (i % 2 == 0) {
            fprintf(f,
                    "{\"order_id\":\"ord-%d\",\"timeout\":\"" CLASS
                    "\",\"holds\":[\"r-%d\"]}\n",
                    i, i);
        } else {
            int64_t deadline = now + 4000 + (int64_t)i * 6000 / ORDERS;
            char when[LAPSE_RFC3339_LEN];
            lapse_time_format_rfc3339(deadline, when);
            fprintf(
                f, "{\"order_id\":\"ord-%d\",\"deadline\":\"%s\",\"holds\":[\"r-%d\"]}\n",
                i, when, i);
            last = deadline > last ? deadline : last;
        }
    }
    fclose(f);
    return last;
}

/* The management API's word on the type of <prefix>.<suffix>. */
static bool queue_is(h_ctx_t *h, const char *suffix, const char *type) {
    const char *mgmt = getenv("LAPSE_TEST_MGMT_URL");
    assert_non_null(mgmt);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "curl -sf --max-time 10 -u guest:guest '%s/api/queues/%%2f/%s.%s' >'%s'",
             mgmt, h->prefix, suffix, h_path(h, "queue.json"));
    if (system(cmd) != 0) {
        return false;
    }
    char want[64];
    snprintf(want, sizeof want, "\"type\":\"%s\"", type);
    return h_count_lines(h, "queue.json", want) == 1;
}

static void test_broker_killed_while_orders_are_held(void **state) {
    (void)state;
    const char *row = quorum ? "g" : "a";
    h_ctx_t h;
    h_setup(&h, quorum ? "fault-g" : "fault-a", CLASS, true);
    int64_t t0 = h_now_ms();
    const char *type = quorum ? "quorum" : "classic";
    assert_true(queue_is(&h, "expired", type));
    assert_true(queue_is(&h, "hold." CLASS, type));
    assert_true(queue_is(&h, "delay.00", type));
    amqp_connection_state_t conn = h_amqp_open(&h);
    const char *tap = h_tap_events(&h, conn);
    h_watch_t *watch = h_watch_start(&h);
    pid_t consumer = h_spawn_consumer(&h, "consumer.log", NULL);

    int64_t last_deadline = write_orders(&h);
    assert_int_equal(
        h_lapse(&h, NULL, 0, "publish", "--batch", h_path(&h, "orders.jsonl"), NULL), 0);
    last_deadline += 1000; /* the class deadlines are set by the publisher, a bit later */
    size_t paid = h_pay_in_time(&h, ORDERS, every_twentieth);
    assert_int_equal(paid, ORDERS / 20);
    const int64_t unpaid = ORDERS - (int64_t)paid;

    int64_t at_kill = h_wait_sql(&h, KILL_AFTER, h_ms(30000),
                                 "SELECT min(count(*), %d) FROM orders"
                                 " WHERE status='cancelled'",
                                 KILL_AFTER);
    assert_int_equal(at_kill, KILL_AFTER);
    int64_t held = h_topology_depth(&h, conn);
    /* The connection dies with the node; it is opened again after the restart. */
    amqp_destroy_connection(conn);
    int64_t t_kill = h_now_ms();
    int kill_rc = h_node(&h, "kill");
    at_kill = h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='cancelled'");
    usleep(DOWN_MS * 1000);
    int restart_rc = h_node(&h, "restart");
    int64_t t_up = h_now_ms();
    fprintf(stderr,
            "node killed with %lld of %lld unpaid cancelled, %lld ready in the topology "
            "just before; down %lld ms\n",
            (long long)at_kill, (long long)unpaid, (long long)held,
            (long long)(t_up - t_kill));
    assert_int_equal(kill_rc, 0);
    assert_int_equal(restart_rc, 0);
    assert_true(at_kill < unpaid / 2);
    assert_true(h_alive(consumer));
    conn = h_amqp_open(&h);

    /* Wait for the consumer to finish on its own: every unpaid order cancelled, or
     * nothing left on the broker, nothing moving for 3 s and past every deadline plus
     * the sweep's grace (the rest was lost in flight). */
    int64_t until = h_now_ms() + h_ms(60000);
    int64_t last_count = -1, last_change = h_now_ms(), resubscribed_at = 0;
    for (;;) {
        int64_t n = h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='cancelled'");
        int64_t now = h_now_ms();
        if (n != last_count) {
            last_count = n;
            last_change = now;
        }
        if (n == unpaid || now > until) {
            break;
        }
        /* Settled: the consumer has been subscribed again for 3 s (it may still be in
         * its reconnect backoff when the node is back, and deliveries it holds unacked
         * are not in the queue counts), nothing moved for 3 s, and the queues are empty
         * (a quorum queue does not count messages waiting to be dead-lettered). */
        if (resubscribed_at == 0 &&
            h_count_lines(&h, "consumer.log", "event=consuming") >= 2) {
            resubscribed_at = now;
        }
        if (resubscribed_at != 0 && now - resubscribed_at > 3000 &&
            now - last_change > 3000 && now > last_deadline + 2500 &&
            h_topology_depth(&h, conn) == 0) {
            break;
        }
        usleep(100000);
    }
    int64_t by_consumer = last_count;
    int64_t t_consumed = h_now_ms();
    size_t reconnects = h_count_lines(&h, "consumer.log", "event=reconnect");
    size_t after_restart = 0;
    {
        /* Cancellations logged after the first reconnect line: the consumer came back. */
        FILE *f = fopen(h_path(&h, "consumer.log"), "r");
        assert_non_null(f);
        char *line = NULL;
        size_t cap = 0;
        bool seen_reconnect = false;
        while (getline(&line, &cap, f) >= 0) {
            seen_reconnect |= strstr(line, "event=reconnect") != NULL;
            after_restart +=
                seen_reconnect && strstr(line, "decision=cancelled ") != NULL;
        }
        free(line);
        fclose(f);
    }

    long long swept = 0;
    if (by_consumer < unpaid) {
        char out[1024];
        int64_t wait = last_deadline + 2100 - h_now_ms();
        if (wait > 0) {
            usleep((useconds_t)wait * 1000);
        }
        assert_int_equal(h_lapse(&h, out, sizeof out, "sweep", "--grace", "2s", NULL), 0);
        fprintf(stderr, "sweep: %s", out);
        swept = kv(out, "cancelled");
    }
    /* The consumer publishes the outbox, the sweep's events included. */
    assert_int_equal(h_wait_outbox_empty(&h, h_ms(20000)), 0);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(15000)), 0);

    static const char *const logs[] = {"consumer.log", "cli.log", NULL};
    h_laws_t laws;
    h_check_laws(&h, logs, watch, &laws);
    size_t tap_total = 0;
    size_t tap_orders = h_tap_event_orders(conn, tap, &tap_total);
    h_amqp_close(conn);
    char extra[256];
    snprintf(extra, sizeof extra,
             "queue_type=%s at_kill=%lld down_ms=%lld reconnects=%zu"
             " cancelled_after_reconnect=%zu by_consumer=%lld swept=%lld"
             " tap_events=%zu tap_orders=%zu settle_ms=%lld runtime_ms=%lld",
             type, (long long)at_kill, (long long)(t_up - t_kill), reconnects,
             after_restart, (long long)by_consumer, swept, tap_total, tap_orders,
             (long long)(t_consumed - t_up), (long long)(h_now_ms() - t0));
    h_print_matrix(row, &laws, extra);

    H_ASSERT_LAWS(laws);
    assert_int_equal(laws.orders, ORDERS);
    assert_int_equal(laws.paid, (int64_t)paid);
    assert_int_equal(laws.cancelled, unpaid);
    assert_int_equal(laws.unpublished, 0);
    assert_true(reconnects >= 1);
    assert_true(after_restart > 0);
    assert_int_equal(tap_orders, (size_t)unpaid);
    if (quorum) {
        /* At-least-once dead-lettering: the broker itself lost nothing. */
        assert_int_equal(swept, 0);
    }
    h_teardown(&h);
}

int main(int argc, char **argv) {
    quorum = argc > 1 && strcmp(argv[1], "quorum") == 0;
    if (quorum) {
        /* Every lapse the harness runs (topology declare, publish, consume, sweep). */
        setenv("LAPSE_QUEUE_TYPE", "quorum", 1);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_broker_killed_while_orders_are_held),
    };
    return cmocka_run_group_tests(tests, NULL, h_group_ensure_node);
}

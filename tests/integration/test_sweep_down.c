/* SPDX-License-Identifier: MIT
 * Issue 10: the broker down longer than the grace, with orders falling due meanwhile.
 * Before, the consumer swept only inside a healthy broker session, so nothing overdue was
 * cancelled until the broker came back. Now its reconnect backoff runs the sweep's direct
 * cancels (they need only the store) by its broker-clock floor, which is anchored to the
 * monotonic clock and so outlives the connection: every unpaid order is cancelled while
 * the node is still down, none early, paid ones never; once the node is back, the
 * consumer reconnects, publishes the events and settles the surviving messages as
 * no-ops.
 *
 * This test kills the shared test node: it always restarts it, and the group teardown
 * makes sure it answers again before the next test runs. */
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

#define ORDERS 40

static bool every_fifth(int i) {
    return i % 5 == 0;
}

static void test_overdue_orders_cancelled_while_the_broker_is_down(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "sweep-down", "4s", true);
    int64_t t0 = h_now_ms();
    h_watch_t *watch = h_watch_start(&h);
    /* A durable queue for the events, so that they have somewhere to go. */
    amqp_connection_state_t conn = h_amqp_open(&h);
    const char *tap = h_tap_events(&h, conn);
    h_amqp_close(conn);
    pid_t consumer = h_spawn_consumer(
        &h, "consumer.log",
        (const char *const[]){"--sweep-every", "1s", "--grace", "2s", NULL});
    for (int t = 0;
         t < h_ms(15000) && !h_count_lines(&h, "consumer.log", "event=consuming");
         t += 50) {
        usleep(50000);
    }
    FILE *f = fopen(h_path(&h, "orders.jsonl"), "w");
    assert_non_null(f);
    for (int i = 0; i < ORDERS; i++) {
        fprintf(f, "{\"order_id\":\"ord-%d\",\"timeout\":\"4s\",\"holds\":[\"r-%d\"]}\n",
                i, i);
    }
    fclose(f);
    assert_int_equal(
        h_lapse(&h, NULL, 0, "publish", "--batch", h_path(&h, "orders.jsonl"), NULL), 0);
    size_t paid = h_pay_in_time(&h, ORDERS, every_fifth);
    int64_t unpaid = ORDERS - (int64_t)paid;

    /* Down before the first deadline, for longer than deadline + grace + a sweep. */
    int64_t first = h_sql_int(&h, "SELECT min(deadline_ms) FROM orders");
    int64_t last = h_sql_int(&h, "SELECT max(deadline_ms) FROM orders");
    assert_int_equal(h_node(&h, "kill"), 0);
    int64_t t_down = h_now_ms();
    assert_true(t_down < first);
    int64_t cancelled =
        h_wait_sql(&h, unpaid, (int)(last - h_now_ms()) + h_ms(10000),
                   "SELECT count(*) FROM orders WHERE status='cancelled'");
    int64_t t_cancelled = h_now_ms();
    /* Still down: the store alone did it. */
    assert_true(h_node(&h, "status") != 0);
    assert_int_equal(cancelled, unpaid);
    assert_true(h_count_lines(&h, "consumer.log", "broker=down") >= 1);
    assert_true(h_alive(consumer));

    assert_int_equal(h_node(&h, "restart"), 0);
    int64_t t_up = h_now_ms();
    /* Back: the events go out, the messages that survived are no-ops. */
    assert_int_equal(h_wait_outbox_empty(&h, h_ms(30000)), 0);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    conn = h_amqp_open(&h);
    size_t tap_total = 0;
    size_t tap_orders = h_tap_event_orders(conn, tap, &tap_total);
    h_amqp_close(conn);

    static const char *const logs[] = {"consumer.log", NULL};
    h_laws_t laws;
    h_check_laws(&h, logs, watch, &laws);
    char extra[256];
    snprintf(extra, sizeof extra,
             "down_ms=%lld cancelled_while_down=%lld last_cancel_after_deadline_ms=%lld "
             "runtime_ms=%lld",
             (long long)(t_up - t_down), (long long)cancelled,
             (long long)(t_cancelled - last), (long long)(h_now_ms() - t0));
    h_print_matrix("down", &laws, extra);
    H_ASSERT_LAWS(laws);
    assert_int_equal(laws.paid, (int64_t)paid);
    assert_int_equal(laws.cancelled, unpaid);
    assert_int_equal(laws.unpublished, 0);
    assert_int_equal(tap_orders, (size_t)unpaid);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_overdue_orders_cancelled_while_the_broker_is_down),
    };
    return cmocka_run_group_tests(tests, NULL, h_group_ensure_node);
}

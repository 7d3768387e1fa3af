/* SPDX-License-Identifier: MIT
 * Never early: messages that reach the consumer before the order's deadline (a replay, a
 * forged deadline) wait for the remainder and are never acted on early. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <lapse/message.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void replay(h_ctx_t *h, amqp_connection_state_t conn, const char *order_id,
                   int64_t deadline_ms) {
    lapse_expiry_msg_t msg = {
        .version = 1, .deadline_ms = deadline_ms, .created_at_ms = lapse_clock_now_ms()};
    snprintf(msg.order_id, sizeof msg.order_id, "%s", order_id);
    char body[512];
    size_t len;
    assert_int_equal(lapse_expiry_msg_encode(&msg, body, sizeof body, &len), LAPSE_OK);
    char exchange[128];
    snprintf(exchange, sizeof exchange, "%s.expired", h->prefix);
    h_publish_raw(conn, exchange, "order.expired", body, len, order_id);
}

static void test_early_messages_wait_for_the_deadline(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "early", "4s", true);
    pid_t consumer = h_spawn_consumer(&h, "consumer.log", NULL);
    amqp_connection_state_t conn = h_amqp_open(&h);

    assert_int_equal(h_lapse(&h, NULL, 0, "publish", "replayed", "--timeout", "4s", NULL),
                     0);
    assert_int_equal(h_lapse(&h, NULL, 0, "publish", "forged", "--timeout", "4s", NULL),
                     0);
    int64_t replayed_deadline =
        h_sql_int(&h, "SELECT deadline_ms FROM orders WHERE order_id='replayed'");
    /* A replay of the real message, four seconds before its time... */
    replay(&h, conn, "replayed", replayed_deadline);
    /* ...and a message whose deadline claims to be past: the store's deadline wins. */
    replay(&h, conn, "forged", lapse_clock_now_ms() - 60000);
    /* A deadline far beyond RabbitMQ's largest TTL for an order nobody published: parked
     * as unknown, and the consumer carries on. */
    replay(&h, conn, "far-future", 32503680000000LL); /* year 3000 */

    assert_int_equal(h_wait_sql(&h, 2, h_ms(20000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     2);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='cancelled' "
                                   "AND cancelled_at_ms < deadline_ms"),
                     0);
    assert_int_equal(
        h_count_lines(&h, "consumer.log", "order_id=replayed decision=early"), 1);
    assert_int_equal(h_count_lines(&h, "consumer.log", "order_id=forged decision=early"),
                     1);
    /* Both were put back down the ladder, as undated (never held by the broker). */
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=early"), 2);
    assert_int_equal(h_count_lines(&h, "consumer.log", "reason=undated"), 2);
    /* The class message and the re-held copy both arrive: one cancels, one is a no-op. */
    for (int t = 0;
         t < h_ms(100) && h_count_lines(&h, "consumer.log", "noop_cancelled") < 2; t++) {
        usleep(100000);
    }
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=cancelled"), 2);
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=noop_cancelled"), 2);
    char rung[128];
    for (int k = 0; k < 28; k++) {
        snprintf(rung, sizeof rung, "%s.delay.%02d", h.prefix, k);
        assert_int_equal(h_queue_depth(conn, rung), 0);
    }
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM events"), 2);
    assert_int_equal(h_count_lines(&h, "consumer.log",
                                   "order_id=far-future decision=parked reason=\"unknown "
                                   "order: far-future\""),
                     1);
    assert_int_equal(h_count_lines(&h, "consumer.log", "event=reconnect"), 0);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    h_amqp_close(conn);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_early_messages_wait_for_the_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

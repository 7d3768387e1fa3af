/* SPDX-License-Identifier: MIT
 * The events exchange disappears: orders are still cancelled on time, their events wait
 * in the outbox, and go out once the exchange is back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

#define ORDERS 5

static void count(void *opaque, const h_msg_t *msg) {
    (void)msg;
    (*(size_t *)opaque)++;
}

static void test_cancelling_goes_on_without_the_events_exchange(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "events-down", "2s", true);
    amqp_connection_state_t conn = h_amqp_open(&h);
    char events_x[128];
    snprintf(events_x, sizeof events_x, "%s.events", h.prefix);
    amqp_exchange_delete(conn, 1, amqp_cstring_bytes(events_x), 0);
    assert_int_equal(amqp_get_rpc_reply(conn).reply_type, AMQP_RESPONSE_NORMAL);

    pid_t consumer = h_spawn_consumer(&h, "consumer.log", NULL);
    for (int i = 0; i < ORDERS; i++) {
        char id[32];
        snprintf(id, sizeof id, "ev-%d", i);
        assert_int_equal(h_lapse(&h, NULL, 0, "publish", id, "--timeout", "2s", NULL), 0);
    }
    assert_int_equal(h_wait_sql(&h, ORDERS, h_ms(20000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     ORDERS);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='cancelled' "
                                   "AND cancelled_at_ms < deadline_ms"),
                     0);
    /* The store commits a batch's cancels before the consumer tries to send their events.
     */
    assert_true(h_wait_lines(&h, "consumer.log", "event=events_failed", 1, h_ms(10000)) >=
                1);
    assert_int_equal(h_sql_int(&h, sf_sql_unpublished(h.sf.backend)), ORDERS);
    assert_true(h_alive(consumer));

    /* The exchange comes back (with a queue bound to it): the backlog goes out. */
    assert_int_equal(h_lapse(&h, NULL, 0, "topology", "declare", NULL), 0);
    h_tap_events(&h, conn);
    assert_int_equal(h_wait_outbox_empty(&h, h_ms(30000)), 0);
    size_t n = 0;
    h_drain(conn, h.tap, 1000, count, &n);
    assert_int_equal(n, ORDERS);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    h_amqp_close(conn);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cancelling_goes_on_without_the_events_exchange),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

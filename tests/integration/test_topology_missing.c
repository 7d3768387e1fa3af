/* SPDX-License-Identifier: MIT
 * Issue 10: the parked exchange and queue deleted, one malformed message at the head of
 * the expired queue. The consumer names what is missing and the fix at session start,
 * cancels every good order behind the message it cannot park (no stalled queue), never
 * acks that message, and parks it once the topology is declared again. */
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

#define GOOD 12

static void test_parked_missing_does_not_stall_the_queue(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "parked-gone", "2s", true);
    amqp_connection_state_t conn = h_amqp_open(&h);
    char parked[160], expired[160];
    snprintf(parked, sizeof parked, "%s.parked", h.prefix);
    snprintf(expired, sizeof expired, "%s.expired", h.prefix);
    amqp_queue_delete(conn, 1, amqp_cstring_bytes(parked), 0, 0);
    assert_int_equal(amqp_get_rpc_reply(conn).reply_type, AMQP_RESPONSE_NORMAL);
    amqp_exchange_delete(conn, 1, amqp_cstring_bytes(parked), 0);
    assert_int_equal(amqp_get_rpc_reply(conn).reply_type, AMQP_RESPONSE_NORMAL);

    /* The malformed message first, at the head of the queue; the good orders behind it,
     * all due by the time the consumer starts. */
    const char bad[] = "this is not json";
    h_publish_raw(conn, expired, "order.expired", bad, sizeof bad - 1, "mal-1");
    const char *args[] = {"publish", "--batch", "-", NULL};
    int in = -1;
    pid_t pub = h_spawn_stdin(&h, "publish.log", args, &in);
    for (int i = 0; i < GOOD; i++) {
        char line[96];
        int len = snprintf(line, sizeof line,
                           "{\"order_id\":\"ord-%d\",\"timeout\":\"2s\"}\n", i);
        assert_int_equal(write(in, line, (size_t)len), len);
    }
    close(in);
    assert_int_equal(h_stop(pub, 0, h_ms(30000)), 0);
    for (int i = 0; i < 200 && h_queue_depth(conn, expired) < GOOD + 1; i++) {
        usleep(50000);
    }
    assert_int_equal(h_queue_depth(conn, expired), GOOD + 1);
    h_watch_t *watch = h_watch_start(&h);

    /* Batches of two (prefetch 4): the one holding the malformed message must not hold
     * up the others forever, as it did when a failed forward failed the whole batch. */
    const char *extra[] = {"--prefetch", "4", NULL};
    pid_t consumer = h_spawn_consumer(&h, "consumer.log", extra);
    assert_int_equal(h_wait_sql(&h, GOOD, h_ms(45000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     GOOD);

    /* One line for each missing entity, naming it and the fix. */
    char needle[512];
    snprintf(needle, sizeof needle,
             "event=topology_missing exchange=%s note=\"exchange '%s' is missing", parked,
             parked);
    assert_int_equal(h_count_lines(&h, "consumer.log", needle), 1);
    snprintf(needle, sizeof needle,
             "event=topology_missing queue=%s note=\"queue '%s' is missing", parked,
             parked);
    assert_int_equal(h_count_lines(&h, "consumer.log", needle), 1);
    assert_int_equal(h_count_lines(&h, "consumer.log", "run 'lapse topology declare'"),
                     2);
    assert_int_equal(
        h_count_lines(&h, "consumer.log", "level=error event=topology_missing"), 2);
    h_wait_lines(&h, "consumer.log", "event=forward_failed", 1, h_ms(10000));
    assert_true(h_count_lines(&h, "consumer.log", "event=forward_failed") >= 1);

    /* The message it cannot park was never acked: it is back in the queue, and the
     * consumer's count says nothing was parked, however often it tried. */
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    assert_int_equal(h_queue_depth(conn, expired), 1);
    assert_int_equal(h_count_lines(&h, "consumer.log", "event=stopped "), 1);
    assert_int_equal(h_count_lines(&h, "consumer.log", " parked=0 "), 1);

    /* The fix the line names: then the message is parked, once. */
    assert_int_equal(h_lapse(&h, NULL, 0, "topology", "declare", NULL), 0);
    consumer = h_spawn_consumer(&h, "consumer2.log", NULL);
    for (int i = 0; i < 200 && h_queue_depth(conn, parked) < 1; i++) {
        usleep(50000);
    }
    assert_int_equal(h_queue_depth(conn, parked), 1);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    assert_int_equal(h_queue_depth(conn, expired), 0);
    assert_int_equal(h_count_lines(&h, "consumer2.log", " parked=1 "), 1);
    assert_int_equal(
        h_count_lines(&h, "consumer2.log", "level=error event=topology_missing"), 0);
    h_amqp_close(conn);

    const char *logs[] = {"consumer.log", "consumer2.log", NULL};
    h_laws_t laws;
    h_check_laws(&h, logs, watch, &laws);
    h_print_matrix("parked-missing", &laws, "");
    H_ASSERT_LAWS(laws);
    assert_int_equal(laws.cancelled, GOOD);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parked_missing_does_not_stall_the_queue),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

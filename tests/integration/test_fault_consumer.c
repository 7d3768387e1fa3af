/* SPDX-License-Identifier: MIT
 * Fault matrix b (issue 4): the consumer killed with SIGKILL mid-batch three times in one
 * run, restarted each time; 1000 orders. Each burst of 250 orders expires while the
 * consumer is stopped (SIGSTOP), so that when it resumes it has a backlog in its hands;
 * the kill lands right after its first commit of the burst is seen in the store, with
 * deliveries committed but not acked and more unacked behind them. Every unpaid order is
 * cancelled exactly once, none early, paid ones never, one event id each. */
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

#define BURSTS    4
#define PER_BURST 250
#define ORDERS    (BURSTS * PER_BURST)
#define KILLS     3

static int burst; /* the burst being published */

static bool every_twentieth_of_burst(int i) {
    return i / PER_BURST == burst && i % 20 == 0;
}

static int64_t cancelled(h_ctx_t *h) {
    return h_sql_int(h, "SELECT count(*) FROM orders WHERE status='cancelled'");
}

static void test_consumer_killed_mid_batch_three_times(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "fault-b", "3s", true);
    int64_t t0 = h_now_ms();
    amqp_connection_state_t conn = h_amqp_open(&h);
    const char *tap = h_tap_events(&h, conn);
    h_watch_t *watch = h_watch_start(&h);

    /* Small batches: a burst takes ten of them. */
    static const char *const extra[] = {"--prefetch", "25", NULL};
    const char *logs[KILLS + 3] = {"consumer-1.log", "consumer-2.log", "consumer-3.log",
                                   "consumer-4.log", NULL};
    pid_t consumer = h_spawn_consumer(&h, logs[0], extra);
    size_t paid = 0;
    int64_t unpaid_so_far = 0;
    char kills[256] = "";
    for (int b = 0; b < BURSTS; b++) {
        char file[32];
        snprintf(file, sizeof file, "burst-%d.jsonl", b);
        FILE *f = fopen(h_path(&h, file), "w");
        assert_non_null(f);
        for (int k = 0; k < PER_BURST; k++) {
            int i = b * PER_BURST + k;
            fprintf(f,
                    "{\"order_id\":\"ord-%d\",\"timeout\":\"3s\",\"holds\":[\"r-%d\"]}\n",
                    i, i);
        }
        fclose(f);
        assert_int_equal(
            h_lapse(&h, NULL, 0, "publish", "--batch", h_path(&h, file), NULL), 0);
        /* Before the burst expires (the store exists once the publisher ran). */
        int64_t base = cancelled(&h);
        burst = b;
        size_t burst_paid =
            h_pay_in_time(&h, (b + 1) * PER_BURST, every_twentieth_of_burst);
        paid += burst_paid;
        unpaid_so_far += PER_BURST - (int64_t)burst_paid;
        if (b < KILLS) {
            /* The burst expires while the consumer is stopped... */
            assert_int_equal(kill(consumer, SIGSTOP), 0);
            int64_t last = h_sql_int(&h, "SELECT max(deadline_ms) FROM orders");
            while (h_now_ms() < last + 500) {
                usleep(20000);
            }
            /* ...and it is killed right after its first commit of it. */
            assert_int_equal(kill(consumer, SIGCONT), 0);
            int64_t seen = base;
            for (int64_t until = h_now_ms() + h_ms(20000);
                 seen == base && h_now_ms() < until;) {
                seen = cancelled(&h);
            }
            assert_int_equal(h_stop(consumer, SIGKILL, h_ms(5000)), 128 + SIGKILL);
            int64_t at_kill = cancelled(&h);
            fprintf(stderr, "kill %d: %lld of %lld cancelled (seen %lld)\n", b + 1,
                    (long long)at_kill, (long long)unpaid_so_far, (long long)seen);
            size_t len = strlen(kills);
            snprintf(kills + len, sizeof kills - len, "%skill%d=%lld/%lld", b ? " " : "",
                     b + 1, (long long)(at_kill - base),
                     (long long)(unpaid_so_far - base));
            /* Mid-burst: some of it done, some not. */
            assert_true(at_kill > base);
            assert_true(at_kill < unpaid_so_far);
            consumer = h_spawn_consumer(&h, logs[b + 1], extra);
        }
        assert_int_equal(
            h_wait_sql(&h, unpaid_so_far, h_ms(30000),
                       "SELECT count(*) FROM orders WHERE status='cancelled'"),
            unpaid_so_far);
    }
    assert_int_equal(paid, ORDERS / 20);
    assert_int_equal(h_wait_outbox_empty(&h, h_ms(15000)), 0);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);

    h_laws_t laws;
    h_check_laws(&h, logs, watch, &laws);
    size_t noops = 0, early = 0;
    for (int k = 0; logs[k]; k++) {
        noops += h_count_lines(&h, logs[k], "decision=noop_cancelled");
        early += h_count_lines(&h, logs[k], "decision=early");
    }
    size_t tap_total = 0;
    size_t tap_orders = h_tap_event_orders(conn, tap, &tap_total);
    h_amqp_close(conn);
    char extra_out[512];
    snprintf(extra_out, sizeof extra_out,
             "%s redelivered_noops=%zu sent_back_early=%zu tap_events=%zu tap_orders=%zu"
             " runtime_ms=%lld",
             kills, noops, early, tap_total, tap_orders, (long long)(h_now_ms() - t0));
    h_print_matrix("b", &laws, extra_out);

    H_ASSERT_LAWS(laws);
    assert_int_equal(laws.orders, ORDERS);
    assert_int_equal(laws.paid, (int64_t)paid);
    assert_int_equal(laws.cancelled, ORDERS - (int64_t)paid);
    assert_int_equal(laws.unpublished, 0);
    assert_int_equal(tap_orders, ORDERS - paid);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_consumer_killed_mid_batch_three_times),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT
 * Test a: 200 orders with 2-3 s windows, half paid in time; exactly the unpaid half ends
 * cancelled, none before its deadline, each once; lag percentiles reported. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define ORDERS 200

static bool is_paid(int i) {
    return i % 4 < 2; /* half, spread over both classes */
}

static void test_unpaid_half_cancelled_once_never_early(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "pipeline", "2s,3s", true);
    pid_t consumer = h_spawn_consumer(&h, "consumer.log", NULL);

    FILE *f = fopen(h_path(&h, "orders.jsonl"), "w");
    assert_non_null(f);
    for (int i = 0; i < ORDERS; i++) {
        fprintf(f,
                "{\"order_id\":\"ord-%d\",\"timeout\":\"%s\",\"holds\":[\"seat-%d\"]}\n",
                i, i % 2 ? "3s" : "2s", i);
    }
    fclose(f);
    assert_int_equal(
        h_lapse(&h, NULL, 0, "publish", "--batch", h_path(&h, "orders.jsonl"), NULL), 0);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE scheduled = 1"),
                     ORDERS);

    /* Pay half of them now, well inside their windows, through the library's store. */
    assert_int_equal(h_pay_in_time(&h, ORDERS, is_paid), ORDERS / 2);

    int64_t cancelled =
        h_wait_sql(&h, ORDERS / 2, h_ms(30000),
                   "SELECT count(*) FROM orders WHERE status='cancelled'");
    assert_int_equal(cancelled, ORDERS / 2);
    /* Let every paid order's message arrive too (acked as a no-op), then look again. */
    for (int t = 0;
         t < 100 && h_count_lines(&h, "consumer.log", "decision=noop_paid") < ORDERS / 2;
         t++) {
        usleep(100000);
    }
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);

    for (int i = 0; i < ORDERS; i++) {
        const char *want = is_paid(i) ? "paid" : "cancelled";
        assert_int_equal(h_sql_int(&h,
                                   "SELECT count(*) FROM orders WHERE order_id='ord-%d' "
                                   "AND status=%Q",
                                   i, want),
                         1);
    }
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='cancelled' "
                                   "AND cancelled_at_ms < deadline_ms"),
                     0);
    /* Holds: released exactly for the cancelled orders. */
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM holds h JOIN orders o USING "
                                   "(order_id) WHERE (o.status='cancelled') != "
                                   "(h.released_at_ms IS NOT NULL)"),
                     0);
    /* One event per cancelled order, one cancel decision each, one no-op per paid one. */
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM events"), ORDERS / 2);
    assert_int_equal(
        h_sql_int(&h, "SELECT count(DISTINCT order_id) FROM events e JOIN orders "
                      "o USING (order_id) WHERE o.status='cancelled'"),
        ORDERS / 2);
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=cancelled"), ORDERS / 2);
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=noop_paid"), ORDERS / 2);
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=parked"), 0);

    int64_t lags[ORDERS];
    size_t n = 0;
    for (int i = 0; i < ORDERS; i++) {
        if (!is_paid(i)) {
            lags[n++] = h_sql_int(&h,
                                  "SELECT cancelled_at_ms - deadline_ms FROM orders "
                                  "WHERE order_id='ord-%d'",
                                  i);
        }
    }
    h_sort(lags, n);
    printf("lag_ms orders=%zu p50=%lld p90=%lld p99=%lld max=%lld\n", n,
           (long long)h_percentile(lags, n, 50), (long long)h_percentile(lags, n, 90),
           (long long)h_percentile(lags, n, 99), (long long)lags[n - 1]);
    assert_true(lags[0] >= 0);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unpaid_half_cancelled_once_never_early),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

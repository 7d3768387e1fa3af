/* SPDX-License-Identifier: MIT
 * Issue 10: the consumer's wall clock steps mid-run (date -s, a VM resumed). libfaketime
 * shifts the consumer's CLOCK_REALTIME only (FAKETIME_DONT_FAKE_MONOTONIC=1), read from a
 * timestamp file the test rewrites; the broker, the publisher and the test keep the real
 * clock.
 *
 * Forward (+5 min): before issue 10 the skew bound kept its old, small samples and the
 * in-process sweep cancelled orders up to the step early. Now the step is seen
 * (event=clock_step), the samples dropped, the broker's clock probed again, and arrivals
 * and the sweep decide by the broker-clock floor: under the 5 ms early watcher nothing is
 * cancelled before its deadline, everything is cancelled, cancelled_at never precedes the
 * deadline.
 *
 * Backward (-20 s): before, intervals ran on the wall clock, so a partial batch, the
 * publishing connection's heartbeats, the owed events and the sweep all waited out the
 * step. Now they run on CLOCK_MONOTONIC: paid orders are settled within a few seconds of
 * their deadlines, the publishing connection (heartbeat 2 s) is never lost, events go out
 * promptly. Unpaid orders are cancelled late by the step (a clock behind the broker's is
 * not corrected: late, never early), none early. */
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

static void set_offset(h_ctx_t *h, const char *offset) {
    /* Written whole and renamed, so the consumer never reads half a file. */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", h_path(h, "faketime"));
    FILE *f = fopen(tmp, "w");
    assert_non_null(f);
    fprintf(f, "%s\n", offset);
    fclose(f);
    char path[4200];
    snprintf(path, sizeof path, "%s", h_path(h, "faketime"));
    assert_int_equal(rename(tmp, path), 0);
}

/* The step the consumer logged (event=clock_step step_ms=N); 0 when none, and the test
 * fails when it logged more than one. */
static long long logged_step(h_ctx_t *h) {
    FILE *f = fopen(h_path(h, "consumer.log"), "r");
    assert_non_null(f);
    char line[1024];
    long long step = 0;
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "event=clock_step step_ms=");
        if (p) {
            step = atoll(p + strlen("event=clock_step step_ms="));
            n++;
        }
    }
    fclose(f);
    assert_true(n <= 1);
    return step;
}

static pid_t spawn_stepped_consumer(h_ctx_t *h, const char *const *args) {
    if (!h_faketime_available()) {
        /* Installed by scripts/setup: only the sanitized build leaves it out (why is
         * printed above); there, this test has nothing to step the clock with. */
        h_teardown(h);
        skip();
    }
    /* A queue for the events, so that they have somewhere to go. */
    amqp_connection_state_t conn = h_amqp_open(h);
    h_tap_events(h, conn);
    h_amqp_close(conn);
    set_offset(h, "+0");
    static char file_env[4200];
    snprintf(file_env, sizeof file_env, "FAKETIME_TIMESTAMP_FILE=%s",
             h_path(h, "faketime"));
    pid_t pid = h_spawn_env(
        h, "consumer.log", args,
        (const char *const[]){H_FAKETIME_ENV, file_env, "FAKETIME_NO_CACHE=1", NULL});
    for (int t = 0;
         t < h_ms(15000) && !h_count_lines(h, "consumer.log", "event=consuming");
         t += 50) {
        usleep(50000);
    }
    assert_true(h_count_lines(h, "consumer.log", "event=consuming") >= 1);
    usleep(1000000); /* the consumer has observed the real clock */
    return pid;
}

static void publish_orders(h_ctx_t *h, int n, int first_s, int last_s) {
    FILE *f = fopen(h_path(h, "orders.jsonl"), "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        int s = first_s + (last_s - first_s) * i / (n - 1);
        fprintf(f, "{\"order_id\":\"ord-%d\",\"timeout\":\"%ds\",\"holds\":[\"r-%d\"]}\n",
                i, s, i);
    }
    fclose(f);
    assert_int_equal(
        h_lapse(h, NULL, 0, "publish", "--batch", h_path(h, "orders.jsonl"), NULL), 0);
}

static void test_wall_clock_steps_forward(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "clock-fwd", "10s", true);
    int64_t t0 = h_now_ms();
    h_watch_t *watch = h_watch_start(&h);
    /* A short grace and a frequent sweep: the direct cancels are where a clock ahead of
     * the broker's cancelled early. */
    pid_t consumer =
        spawn_stepped_consumer(&h, (const char *const[]){"--sweep-every", "1s", "--grace",
                                                         "1s", "consume", NULL});
    enum { N = 24 };
    /* Due from 10 s to 1 min, all within the step's 5 minutes: the old sweep cancelled
     * every one of them at the step, up to 58 s early. */
    publish_orders(&h, N, 10, 60);
    usleep(2000000);
    set_offset(&h, "+300");
    int64_t last = h_sql_int(&h, "SELECT max(deadline_ms) FROM orders");
    int64_t unpaid = h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='pending'");
    int64_t wait_ms = last - h_now_ms() + h_ms(20000);
    assert_int_equal(h_wait_sql(&h, unpaid, (int)wait_ms,
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     unpaid);
    assert_int_equal(h_wait_outbox_empty(&h, h_ms(15000)), 0);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);

    static const char *const logs[] = {"consumer.log", NULL};
    h_laws_t laws;
    h_check_laws(&h, logs, watch, &laws);
    char extra[256];
    long long step = logged_step(&h);
    snprintf(extra, sizeof extra,
             "step_s=+300 logged_step_ms=%lld probes=%zu runtime_ms=%lld", step,
             h_count_lines(&h, "consumer.log", "event=clock_probe "),
             (long long)(h_now_ms() - t0));
    h_print_matrix("clock+", &laws, extra);
    H_ASSERT_LAWS(laws);
    assert_true(laws.watch_polls > 100);
    assert_int_equal(laws.cancelled, unpaid);
    assert_int_equal(laws.unpublished, 0);
    /* The store's record agrees: cancelled_at is the decision clock, never before. */
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='cancelled' "
                                   "AND cancelled_at_ms < deadline_ms"),
                     0);
    assert_true(step > 299000 && step < 301000);
    /* Probed at the start and again after the step. */
    assert_true(h_count_lines(&h, "consumer.log", "event=clock_probe ") >= 2);
    h_teardown(&h);
}

static bool every_fourth(int i) {
    return i % 4 == 0;
}

/* When (the test's clock) the consumer logged its decision on order ord-i, polling the
 * log until `until`; -1 when it did not. */
static int64_t seen_decision(h_ctx_t *h, int i, const char *decision, int64_t until) {
    char needle[96];
    snprintf(needle, sizeof needle, "order_id=ord-%d decision=%s", i, decision);
    while (h_now_ms() < until) {
        if (h_count_lines(h, "consumer.log", needle) > 0) {
            return h_now_ms();
        }
        usleep(20000);
    }
    return -1;
}

static void test_wall_clock_steps_back(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "clock-back", "5s", true);
    int64_t t0 = h_now_ms();
    h_watch_t *watch = h_watch_start(&h);
    /* Heartbeats every 2 s: a publishing connection left unserviced for the step would
     * be closed by the broker within seconds. */
    pid_t consumer = spawn_stepped_consumer(
        &h, (const char *const[]){"--heartbeat", "2", "--sweep-every", "1s", "--grace",
                                  "2s", "consume", NULL});
    set_offset(&h, "-20");
    enum { N = 16 };
    publish_orders(&h, N, 5, 12);
    size_t paid = h_pay_in_time(&h, N, every_fourth);
    assert_int_equal(paid, N / 4);
    /* Paid orders are settled as they arrive: no batch waits out the step. */
    int64_t worst = 0;
    for (int i = 0; i < N; i += 4) {
        int64_t deadline =
            h_sql_int(&h, "SELECT deadline_ms FROM orders WHERE order_id='ord-%d'", i);
        int64_t seen = seen_decision(&h, i, "noop_paid", deadline + h_ms(10000));
        assert_true(seen >= 0);
        worst = seen - deadline > worst ? seen - deadline : worst;
    }
    assert_true(worst < h_ms(4000));
    int64_t unpaid = N - (int64_t)paid;
    assert_int_equal(h_wait_sql(&h, unpaid, h_ms(90000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     unpaid);
    /* Events of the cancellations go out promptly (their delay is monotonic too). */
    assert_int_equal(h_wait_outbox_empty(&h, h_ms(5000)), 0);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);

    static const char *const logs[] = {"consumer.log", NULL};
    h_laws_t laws;
    h_check_laws(&h, logs, watch, &laws);
    char extra[256];
    snprintf(extra, sizeof extra,
             "step_s=-20 paid_settled_within_ms=%lld runtime_ms=%lld", (long long)worst,
             (long long)(h_now_ms() - t0));
    h_print_matrix("clock-", &laws, extra);
    H_ASSERT_LAWS(laws);
    assert_int_equal(laws.paid, (int64_t)paid);
    assert_int_equal(laws.cancelled, unpaid);
    long long step = logged_step(&h);
    assert_true(step < -19000 && step > -21000);
    assert_int_equal(h_count_lines(&h, "consumer.log", "event=out_connection_lost"), 0);
    assert_int_equal(h_count_lines(&h, "consumer.log", "event=reconnect"), 0);
    h_teardown(&h);
}

/* `it_clock_step back` runs the backward step alone. */
int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wall_clock_steps_forward),
        cmocka_unit_test(test_wall_clock_steps_back),
    };
    const struct CMUnitTest back[] = {
        cmocka_unit_test(test_wall_clock_steps_back),
    };
    if (argc > 1 && strcmp(argv[1], "back") == 0) {
        return cmocka_run_group_tests(back, NULL, NULL);
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}

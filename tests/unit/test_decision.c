/* SPDX-License-Identifier: MIT
 * The decision core: every branch of the verdict on a delivery, and the clock bound with
 * its edges (the tolerance, undated, stale, unknown, wall-clock steps). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "decision_int.h"
#include "ladder_int.h"

#include <lapse/message.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* A broker and a host whose clocks agree, at some moment (ms). */
#define T0   INT64_C(1796055520000)
#define MONO INT64_C(5000000) /* the monotonic clock's reading at T0 */

static lapse__clock_t sampled_at(int64_t broker_ms, int64_t mono_ms) {
    lapse__clock_t clk;
    lapse__clock_init(&clk);
    lapse__clock_sample(&clk, mono_ms, broker_ms);
    return clk;
}

/* ---- the clock bound ------------------------------------------------------------- */

static void test_clock_unknown_is_never_zero(void **state) {
    (void)state;
    lapse__clock_t clk;
    lapse__clock_init(&clk);
    assert_int_equal(lapse__clock_floor(&clk, MONO), INT64_MIN);
    assert_int_equal(lapse__clock_ahead_ms(&clk, T0, MONO), INT64_MAX);
    /* Unknown: nothing is due, neither for arrivals nor for the sweep. */
    assert_int_equal(lapse__clock_decide_now(&clk, T0, MONO), LAPSE__NOTHING_DUE);
    assert_int_equal(lapse__clock_sweep_now(&clk, T0, MONO), LAPSE__NOTHING_DUE);
}

static void test_clock_in_step_trusts_the_wall(void **state) {
    (void)state;
    /* x-death said T0 - 800 (whole seconds) when it arrived at MONO: the wall is at most
     * 800 ms ahead, within the tolerance, so arrivals go by the wall clock. */
    lapse__clock_t clk = sampled_at(T0 - 800, MONO);
    assert_int_equal(lapse__clock_floor(&clk, MONO), T0 - 800);
    assert_int_equal(lapse__clock_ahead_ms(&clk, T0, MONO), 800);
    assert_int_equal(lapse__clock_decide_now(&clk, T0, MONO), T0);
    /* The sweep never uses the tolerance: it goes by the floor. */
    assert_int_equal(lapse__clock_sweep_now(&clk, T0, MONO), T0 - 800);
}

static void test_clock_tolerance_edge(void **state) {
    (void)state;
    lapse__clock_t clk = sampled_at(T0 - LAPSE__SKEW_TOLERANCE_MS, MONO);
    assert_int_equal(lapse__clock_decide_now(&clk, T0, MONO), T0);
    clk = sampled_at(T0 - LAPSE__SKEW_TOLERANCE_MS - 1, MONO);
    assert_int_equal(lapse__clock_decide_now(&clk, T0, MONO),
                     T0 - LAPSE__SKEW_TOLERANCE_MS - 1);
}

static void test_clock_ahead_uses_the_floor(void **state) {
    (void)state;
    /* The wall clock runs 3 s ahead of the broker's. */
    lapse__clock_t clk = sampled_at(T0, MONO);
    int64_t wall = T0 + 3000;
    assert_int_equal(lapse__clock_decide_now(&clk, wall, MONO), T0);
    assert_int_equal(lapse__clock_sweep_now(&clk, wall, MONO), T0);
    /* 10 s later, the floor moved with the monotonic clock, less the drift allowance. */
    int64_t later = lapse__clock_decide_now(&clk, wall + 10000, MONO + 10000);
    assert_true(later <= T0 + 10000);
    assert_true(later >= T0 + 10000 - 2);
}

static void test_clock_behind_uses_the_wall(void **state) {
    (void)state;
    /* The wall clock runs behind the broker's: late, never early; the floor above the
     * wall changes nothing. */
    lapse__clock_t clk = sampled_at(T0 + 60000, MONO);
    assert_int_equal(lapse__clock_decide_now(&clk, T0, MONO), T0);
    assert_int_equal(lapse__clock_sweep_now(&clk, T0, MONO), T0);
    assert_int_equal(lapse__clock_ahead_ms(&clk, T0, MONO), 0);
}

static void test_clock_backlog_sample_does_not_lower(void **state) {
    (void)state;
    lapse__clock_t clk = sampled_at(T0, MONO);
    /* A message that waited 40 s in a backlog: dead-lettered at T0 - 30 s, read now. */
    lapse__clock_sample(&clk, MONO + 10000, T0 - 30000);
    assert_int_equal(lapse__clock_floor(&clk, MONO + 10000), T0 + 10000 - 2);
    /* A fresher prompt sample raises it. */
    lapse__clock_sample(&clk, MONO + 10000, T0 + 10000);
    assert_int_equal(lapse__clock_floor(&clk, MONO + 10000), T0 + 10000);
}

static void test_clock_drift_and_stale(void **state) {
    (void)state;
    lapse__clock_t clk = sampled_at(T0, MONO);
    /* After an hour, lowered by 200 ppm of it: 720 ms. */
    int64_t hour = LAPSE__CLOCK_STALE_MS;
    assert_int_equal(lapse__clock_floor(&clk, MONO + hour), T0 + hour - 720);
    /* Past that it is stale: unknown, never 0. */
    assert_int_equal(lapse__clock_floor(&clk, MONO + hour + 1), INT64_MIN);
    assert_int_equal(lapse__clock_sweep_now(&clk, T0 + hour + 1, MONO + hour + 1),
                     LAPSE__NOTHING_DUE);
}

static void test_clock_forward_step_mid_session(void **state) {
    (void)state;
    /* The reproduction of issue 10: a bound learnt before a +5 min step of the wall clock
     * must not let the sweep or an arrival act 5 minutes early. */
    lapse__clock_t clk;
    lapse__clock_init(&clk);
    assert_false(lapse__clock_observe(&clk, T0, MONO, NULL));
    lapse__clock_sample(&clk, MONO, T0 - 500);
    assert_int_equal(lapse__clock_decide_now(&clk, T0, MONO), T0);

    int64_t mono = MONO + 20000;
    int64_t wall = T0 + 20000 + 300000; /* 20 s later, and the wall jumped 5 min */
    /* Even before the step is observed, the floor does not move with the wall. */
    assert_true(lapse__clock_decide_now(&clk, wall, mono) <= T0 + 20000);
    assert_true(lapse__clock_sweep_now(&clk, wall, mono) <= T0 + 20000);

    int64_t step = 0;
    assert_true(lapse__clock_observe(&clk, wall, mono, &step));
    assert_int_equal(step, 300000);
    assert_int_equal(clk.steps, 1);
    /* Samples dropped: the sweep cancels nothing directly until a fresh one exists. */
    assert_int_equal(lapse__clock_sweep_now(&clk, wall, mono), LAPSE__NOTHING_DUE);
    /* A fresh delivery dead-lettered at broker time T0 + 20 s: the floor is the broker's
     * time, and the wall (5 min ahead) is not trusted. */
    lapse__clock_sample(&clk, mono, T0 + 20000);
    assert_int_equal(lapse__clock_decide_now(&clk, wall, mono), T0 + 20000);
    assert_int_equal(lapse__clock_sweep_now(&clk, wall, mono), T0 + 20000);
    /* No second step while the offset stays. */
    assert_false(lapse__clock_observe(&clk, wall + 500, mono + 500, NULL));
}

static void test_clock_backward_step_and_noise(void **state) {
    (void)state;
    lapse__clock_t clk;
    lapse__clock_init(&clk);
    lapse__clock_observe(&clk, T0, MONO, NULL);
    lapse__clock_sample(&clk, MONO, T0);
    /* Scheduling noise up to the step threshold is not a step. */
    assert_false(
        lapse__clock_observe(&clk, T0 + 1000 + LAPSE__CLOCK_STEP_MS, MONO + 1000, NULL));
    assert_int_not_equal(lapse__clock_floor(&clk, MONO + 1000), INT64_MIN);
    int64_t step = 0;
    assert_true(lapse__clock_observe(&clk, T0 - 60000, MONO + 2000, &step));
    assert_true(step < -LAPSE__CLOCK_STEP_MS);
    assert_int_equal(lapse__clock_floor(&clk, MONO + 2000), INT64_MIN);
}

static void test_time_add_saturates(void **state) {
    (void)state;
    assert_int_equal(lapse__time_add(INT64_MAX - 5, 10), INT64_MAX);
    assert_int_equal(lapse__time_add(INT64_MIN + 5, -10), INT64_MIN);
    assert_int_equal(lapse__time_add(T0, 1800000), T0 + 1800000);
    assert_int_equal(lapse__time_add(T0, -T0), 0);
}

/* ---- the verdict ------------------------------------------------------------------ */

static lapse__facts_t settled(lapse_cancel_outcome_t outcome) {
    return (lapse__facts_t){.decoded = true,
                            .settled = true,
                            .outcome = outcome,
                            .deadline_ms = T0,
                            .now_ms = T0,
                            .max_attempts = 10};
}

static void test_decide_cancel_and_noops(void **state) {
    (void)state;
    lapse__verdict_t v;
    lapse__facts_t f = settled(LAPSE_CANCEL_DONE);
    lapse__decide(&f, &v);
    assert_int_equal(v.action, LAPSE__ACT_CANCELLED);
    assert_int_equal(v.delay_ms, 0);
    f = settled(LAPSE_CANCEL_NOOP_PAID);
    lapse__decide(&f, &v);
    assert_int_equal(v.action, LAPSE__ACT_NOOP);
    assert_int_equal(v.why, LAPSE__WHY_PAID);
    f = settled(LAPSE_CANCEL_NOOP_CANCELLED);
    lapse__decide(&f, &v);
    assert_int_equal(v.action, LAPSE__ACT_NOOP);
    assert_int_equal(v.why, LAPSE__WHY_CANCELLED);
    assert_string_equal(lapse__action_name(v.action), "noop");
}

static void test_decide_unknown_and_undecodable_park(void **state) {
    (void)state;
    lapse__verdict_t v;
    lapse__facts_t f = settled(LAPSE_CANCEL_UNKNOWN);
    lapse__decide(&f, &v);
    assert_int_equal(v.action, LAPSE__ACT_PARK);
    assert_int_equal(v.why, LAPSE__WHY_UNKNOWN);
    f = (lapse__facts_t){.decoded = false, .max_attempts = 10};
    lapse__decide(&f, &v);
    assert_int_equal(v.action, LAPSE__ACT_PARK);
    assert_int_equal(v.why, LAPSE__WHY_UNDECODABLE);
    assert_string_equal(lapse__action_name(v.action), "parked");
}

static void test_decide_early_remainder(void **state) {
    (void)state;
    lapse__verdict_t v;
    lapse__facts_t f = settled(LAPSE_CANCEL_EARLY);
    f.deadline_ms = T0 + 29000;
    lapse__decide(&f, &v);
    assert_int_equal(v.action, LAPSE__ACT_EARLY);
    assert_int_equal(v.why, LAPSE__WHY_AHEAD);
    assert_int_equal(v.delay_ms, 29000);
    /* Less than a second (or already past by the consumer's clock): one second, so that
     * it cannot spin. */
    f.deadline_ms = T0 + 1;
    lapse__decide(&f, &v);
    assert_int_equal(v.delay_ms, 1000);
    f.deadline_ms = T0 - 5000;
    lapse__decide(&f, &v);
    assert_int_equal(v.delay_ms, 1000);
    /* Beyond the ladder: its whole span, then again. */
    f.deadline_ms = T0 + LAPSE__LADDER_MAX_MS + 123456;
    lapse__decide(&f, &v);
    assert_int_equal(v.delay_ms, LAPSE__LADDER_MAX_MS);
    /* Undated, or an unknown clock: the reason says so; unknown waits one second. */
    f = settled(LAPSE_CANCEL_EARLY);
    f.undated = true;
    f.deadline_ms = T0 + 7000;
    lapse__decide(&f, &v);
    assert_int_equal(v.why, LAPSE__WHY_UNDATED);
    assert_int_equal(v.delay_ms, 7000);
    f.now_ms = LAPSE__NOTHING_DUE;
    lapse__decide(&f, &v);
    assert_int_equal(v.delay_ms, 1000);
    /* An extreme deadline cannot overflow the remainder. */
    f = settled(LAPSE_CANCEL_EARLY);
    f.deadline_ms = INT64_MAX;
    f.now_ms = INT64_MIN + 1;
    lapse__decide(&f, &v);
    assert_int_equal(v.delay_ms, LAPSE__LADDER_MAX_MS);
}

static void test_decide_early_keeps_attempts(void **state) {
    (void)state;
    lapse__verdict_t v;
    lapse__facts_t f = settled(LAPSE_CANCEL_EARLY);
    f.attempts = 3;
    f.deadline_ms = T0 + 5000;
    lapse__decide(&f, &v);
    assert_int_equal(v.attempts, 3);
}

static void test_retry_delays_and_cap(void **state) {
    (void)state;
    assert_int_equal(lapse__retry_delay_ms(1), 1000);
    assert_int_equal(lapse__retry_delay_ms(2), 2000);
    assert_int_equal(lapse__retry_delay_ms(3), 4000);
    assert_int_equal(lapse__retry_delay_ms(9), 256000);
    assert_int_equal(lapse__retry_delay_ms(10), LAPSE__RETRY_MAX_DELAY_MS);
    assert_int_equal(lapse__retry_delay_ms(1000), LAPSE__RETRY_MAX_DELAY_MS);
    assert_int_equal(lapse__retry_delay_ms(0), 1000);
    assert_int_equal(lapse__retry_delay_ms(-7), 1000);
}

static void test_decide_retry_then_park(void **state) {
    (void)state;
    lapse__verdict_t v;
    lapse__facts_t f = {.decoded = true, .settled = false, .max_attempts = 3};
    lapse__decide(&f, &v);
    assert_int_equal(v.action, LAPSE__ACT_RETRY);
    assert_int_equal(v.why, LAPSE__WHY_STORE_FAILED);
    assert_int_equal(v.attempts, 1);
    assert_int_equal(v.delay_ms, 1000);
    f.attempts = 1;
    lapse__decide(&f, &v);
    assert_int_equal(v.action, LAPSE__ACT_RETRY);
    assert_int_equal(v.attempts, 2);
    assert_int_equal(v.delay_ms, 2000);
    /* The third failure with max_attempts 3: parked, counted. */
    f.attempts = 2;
    lapse__decide(&f, &v);
    assert_int_equal(v.action, LAPSE__ACT_PARK);
    assert_int_equal(v.why, LAPSE__WHY_EXHAUSTED);
    assert_int_equal(v.attempts, 3);
    /* max_attempts 1: the first failure parks. */
    f = (lapse__facts_t){.decoded = true, .settled = false, .max_attempts = 1};
    lapse__decide(&f, &v);
    assert_int_equal(v.action, LAPSE__ACT_PARK);
    assert_int_equal(v.attempts, 1);
}

static void test_names_are_static_and_distinct(void **state) {
    (void)state;
    for (int a = LAPSE__ACT_CANCELLED; a <= LAPSE__ACT_PARK; a++) {
        assert_string_not_equal(lapse__action_name((lapse__action_t)a), "?");
    }
    for (int w = LAPSE__WHY_NONE; w <= LAPSE__WHY_CANCELLED; w++) {
        assert_string_not_equal(lapse__why_name((lapse__why_t)w), "?");
    }
}

/* The decision line is what snprintf writes for the same format, for ids of every
 * length up to the largest, every outcome name, lags at both ends and none. */
static void test_decision_line_is_printf(void **state) {
    (void)state;
    char id[LAPSE_ORDER_ID_MAX + 1];
    const char *names[] = {"cancelled", "noop_paid", "noop_cancelled", "unknown",
                           "early"};
    const int64_t lags[] = {
        0, 1, 9, 10, 999, 1000, -1, -1250, INT64_C(86400000), INT64_MAX, INT64_MIN};
    for (size_t len = 1; len <= LAPSE_ORDER_ID_MAX; len += 7) {
        for (size_t i = 0; i < len; i++) {
            id[i] = "ab-9.:_Z"[(i + len) % 8];
        }
        id[len] = '\0';
        for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
            for (size_t l = 0; l <= sizeof lags / sizeof *lags; l++) {
                bool lagged = l < sizeof lags / sizeof *lags;
                bool redelivered = (len + k + l) % 2 == 0;
                char want[LAPSE__DECISION_LINE_MAX];
                char got[LAPSE__DECISION_LINE_MAX];
                if (lagged) {
                    snprintf(want, sizeof want,
                             "event=decision order_id=%s decision=%s lag_ms=%lld "
                             "redelivered=%d",
                             id, names[k], (long long)lags[l], redelivered ? 1 : 0);
                } else {
                    snprintf(want, sizeof want,
                             "event=decision order_id=%s decision=%s redelivered=%d", id,
                             names[k], redelivered ? 1 : 0);
                }
                assert_ptr_equal(lapse__decision_line(got, id, names[k],
                                                      lagged ? &lags[l] : NULL,
                                                      redelivered),
                                 got);
                assert_string_equal(got, want);
            }
        }
    }
    /* Text longer than the line has room for is cut, never written past it. */
    char longer[2 * LAPSE__DECISION_LINE_MAX];
    memset(longer, 'x', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    char got[LAPSE__DECISION_LINE_MAX + 8];
    memset(got, '#', sizeof got);
    int64_t lag = 5;
    lapse__decision_line(got, "o-1", longer, &lag, true);
    assert_int_equal(strlen(got), LAPSE__DECISION_LINE_MAX - 1);
    assert_memory_equal(got, "event=decision order_id=o-1 decision=xxx", 40);
    for (size_t i = LAPSE__DECISION_LINE_MAX; i < sizeof got; i++) {
        assert_int_equal(got[i], '#');
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clock_unknown_is_never_zero),
        cmocka_unit_test(test_clock_in_step_trusts_the_wall),
        cmocka_unit_test(test_clock_tolerance_edge),
        cmocka_unit_test(test_clock_ahead_uses_the_floor),
        cmocka_unit_test(test_clock_behind_uses_the_wall),
        cmocka_unit_test(test_clock_backlog_sample_does_not_lower),
        cmocka_unit_test(test_clock_drift_and_stale),
        cmocka_unit_test(test_clock_forward_step_mid_session),
        cmocka_unit_test(test_clock_backward_step_and_noise),
        cmocka_unit_test(test_time_add_saturates),
        cmocka_unit_test(test_decide_cancel_and_noops),
        cmocka_unit_test(test_decide_unknown_and_undecodable_park),
        cmocka_unit_test(test_decide_early_remainder),
        cmocka_unit_test(test_decide_early_keeps_attempts),
        cmocka_unit_test(test_retry_delays_and_cap),
        cmocka_unit_test(test_decide_retry_then_park),
        cmocka_unit_test(test_names_are_static_and_distinct),
        cmocka_unit_test(test_decision_line_is_printf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

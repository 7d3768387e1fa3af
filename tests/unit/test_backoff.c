/* SPDX-License-Identifier: MIT
 * Backoff: grows exponentially, stays within [base, cap], jitters, and the sleep stops.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "backoff_int.h"

#include <time.h>

static void test_backoff_stays_between_base_and_ceiling(void **state) {
    (void)state;
    for (unsigned attempt = 0; attempt < 40; attempt++) {
        int64_t ceiling = 100;
        for (unsigned i = 0; i < attempt && ceiling < 5000; i++) {
            ceiling *= 2;
        }
        ceiling = ceiling > 5000 ? 5000 : ceiling;
        for (int k = 0; k < 200; k++) {
            int64_t d = lapse__backoff_ms(attempt, 100, 5000);
            assert_true(d >= 100);
            assert_true(d <= ceiling);
        }
    }
}

static void test_backoff_jitters(void **state) {
    (void)state;
    int64_t first = lapse__backoff_ms(6, 100, 10000);
    bool differs = false;
    for (int k = 0; k < 50 && !differs; k++) {
        differs = lapse__backoff_ms(6, 100, 10000) != first;
    }
    assert_true(differs);
}

static void test_sleep_returns_early_on_stop(void **state) {
    (void)state;
    volatile sig_atomic_t stop = 1;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    assert_false(lapse__sleep_ms(5000, &stop));
    clock_gettime(CLOCK_MONOTONIC, &b);
    assert_true(b.tv_sec - a.tv_sec < 2);
    stop = 0;
    assert_true(lapse__sleep_ms(30, &stop));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backoff_stays_between_base_and_ceiling),
        cmocka_unit_test(test_backoff_jitters),
        cmocka_unit_test(test_sleep_returns_early_on_stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

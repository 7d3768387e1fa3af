/* SPDX-License-Identifier: MIT
 * The delay ladder: a delay as the rungs it waits in, spelled as a routing key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "ladder_int.h"

#include <lapse/publisher.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a message with this key goes through: the rungs whose exchange sends it to their
 * queue, found by walking the bindings' patterns the way a topic exchange matches them.
 */
static int64_t walk(const char *key, int top, int *hops) {
    int64_t waited = 0;
    *hops = 0;
    for (int k = top; k >= 0; k--) {
        char one[LAPSE__LADDER_RK_LEN];
        char zero[LAPSE__LADDER_RK_LEN];
        lapse__ladder_pattern(k, 1, one);
        lapse__ladder_pattern(k, 0, zero);
        int matches_one = 1;
        int matches_zero = 1;
        for (size_t i = 0; i < LAPSE__LADDER_RK_LEN - 1; i++) {
            matches_one &= one[i] == '*' || one[i] == key[i];
            matches_zero &= zero[i] == '*' || zero[i] == key[i];
        }
        /* Exactly one of a rung's two bindings matches every key. */
        assert_int_equal(matches_one + matches_zero, 1);
        if (matches_one) {
            waited += INT64_C(1) << k;
            (*hops)++;
        }
    }
    return waited;
}

static void check_delay(int64_t delay_ms) {
    lapse__ladder_route_t r;
    assert_int_equal(lapse__ladder_route(delay_ms, &r), LAPSE_OK);
    int64_t want = delay_ms <= 1000 ? 1 : (delay_ms + 999) / 1000;
    assert_int_equal(r.seconds, want);
    /* Round up, never down: never early, late by under a second. */
    assert_true(r.seconds * 1000 >= delay_ms);
    assert_true(delay_ms <= 1000 || r.seconds * 1000 - delay_ms < 1000);
    assert_int_equal(strlen(r.routing_key), LAPSE__LADDER_RK_LEN - 1);
    assert_int_equal(lapse__ladder_parse_key(r.routing_key), r.seconds);
    int hops;
    assert_int_equal(walk(r.routing_key, r.top, &hops), r.seconds);
    assert_int_equal(hops, r.hops);
    assert_int_equal(hops, __builtin_popcountll((unsigned long long)r.seconds));
    /* Entering at the top rung misses nothing above it. */
    assert_true(r.seconds >> r.top == 1);
}

static void test_every_delay_up_to_2_pow_20_seconds(void **state) {
    (void)state;
    for (int64_t s = 1; s <= (INT64_C(1) << 20); s++) {
        check_delay(s * 1000);
    }
}

static void test_fractions_round_up(void **state) {
    (void)state;
    const int64_t cases[] = {-5000, 0, 1, 999, 1000, 1001, 1500, 1999, 2000, 2001, 59999};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        check_delay(cases[i]);
    }
    lapse__ladder_route_t r;
    lapse__ladder_route(1001, &r);
    assert_int_equal(r.seconds, 2);
    assert_string_equal(r.routing_key,
                        "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0");
    lapse__ladder_route(30 * 60 * 1000, &r); /* 1800 s = 1024 + 512 + 256 + 8 */
    assert_int_equal(r.hops, 4);
    assert_int_equal(r.top, 10);
}

static void test_random_delays_up_to_the_maximum(void **state) {
    (void)state;
    srand(20261130);
    for (int i = 0; i < 200000; i++) {
        int64_t ms = ((int64_t)rand() << 31 | rand()) % LAPSE__LADDER_MAX_MS + 1;
        check_delay(ms);
    }
    check_delay(LAPSE__LADDER_MAX_MS);
    check_delay(LAPSE__LADDER_MAX_MS - 999);
}

static void test_over_the_maximum_is_refused(void **state) {
    (void)state;
    lapse__ladder_route_t r = {.seconds = -7};
    assert_int_equal(lapse__ladder_route(LAPSE__LADDER_MAX_MS + 1, &r),
                     LAPSE_ERR_INVALID);
    assert_int_equal(lapse__ladder_route(INT64_MAX, &r), LAPSE_ERR_INVALID);
    assert_int_equal(r.seconds, -7);
    /* At least eight years fit. */
    assert_true(LAPSE__LADDER_MAX_S > INT64_C(8) * 36525 * 864);
    assert_int_equal(LAPSE_MAX_DELAY_MS, LAPSE__LADDER_MAX_MS);
}

static void test_deadline_check(void **state) {
    (void)state;
    lapse_error_t err = {0};
    int64_t now = 1764484800000; /* 2025-11-30T06:40:00Z */
    assert_int_equal(lapse_deadline_check(now + 1, now, &err), LAPSE_OK);
    assert_int_equal(lapse_deadline_check(now + LAPSE_MAX_DELAY_MS, now, &err), LAPSE_OK);
    assert_int_equal(lapse_deadline_check(now, now, &err), LAPSE_ERR_INVALID);
    assert_non_null(strstr(err.text, "in the past"));
    assert_int_equal(lapse_deadline_check(now + LAPSE_MAX_DELAY_MS + 1, now, &err),
                     LAPSE_ERR_INVALID);
    assert_non_null(strstr(err.text, "too far ahead"));
}

static void test_keys_that_are_not_ladder_keys(void **state) {
    (void)state;
    const char *bad[] = {"",
                         "order.expired",
                         "0.0.1",
                         "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.2",
                         "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1,0",
                         "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(lapse__ladder_parse_key(bad[i]), -1);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_delay_up_to_2_pow_20_seconds),
        cmocka_unit_test(test_fractions_round_up),
        cmocka_unit_test(test_random_delays_up_to_the_maximum),
        cmocka_unit_test(test_over_the_maximum_is_refused),
        cmocka_unit_test(test_deadline_check),
        cmocka_unit_test(test_keys_that_are_not_ladder_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

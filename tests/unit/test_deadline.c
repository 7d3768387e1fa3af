/* SPDX-License-Identifier: MIT
 * Durations, RFC 3339 times and the clock hook. */
#include <lapse/message.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static void test_duration_parse_accepts_each_unit(void **state) {
    (void)state;
    static const struct {
        const char *text;
        int64_t ms;
    } good[] = {
        {"1500ms", 1500},
        {"1ms", 1},
        {"90s", 90000},
        {"30m", 1800000},
        {"2h", 7200000},
        {"7d", 604800000},
        {"030m", 1800000},
        {"9223372036854775807ms", INT64_MAX},
        {"9223372036854775s", INT64_C(9223372036854775000)},
        {"106751991167d", INT64_C(106751991167) * 86400000},
    };
    for (size_t i = 0; i < ARRAY_LEN(good); i++) {
        int64_t ms = -1;
        if (lapse_duration_parse(good[i].text, &ms) != LAPSE_OK || ms != good[i].ms) {
            fail_msg("\"%s\": got %lld", good[i].text, (long long)ms);
        }
    }
}

static void test_duration_parse_rejects_bad_text(void **state) {
    (void)state;
    static const char *const bad[] = {
        "",
        "ms",
        "30",
        "0s",
        "0ms",
        "00m",
        "-5m",
        "+5m",
        " 5m",
        "5m ",
        "5 m",
        "5M",
        "5mm",
        "5sec",
        "5min",
        "1.5h",
        "1h30m",
        "5ms5",
        "0x10s",
        "9223372036854775808ms", /* INT64_MAX + 1 */
        "9223372036854775808",   /* digits overflow, no unit */
        "9223372036854776s",     /* fits as a number, overflows in ms */
        "106751991168d",         /* first day count past INT64_MAX ms */
        "99999999999999999999999999d",
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        int64_t ms = 42;
        if (lapse_duration_parse(bad[i], &ms) != LAPSE_ERR_CONFIG_DURATION || ms != 42) {
            fail_msg("\"%s\" accepted as %lld", bad[i], (long long)ms);
        }
    }
    int64_t ms;
    assert_int_equal(lapse_duration_parse(NULL, &ms), LAPSE_ERR_CONFIG_DURATION);
    assert_int_equal(lapse_duration_parse("5m", NULL), LAPSE_ERR_CONFIG_DURATION);
}

static void test_duration_format_uses_largest_exact_unit(void **state) {
    (void)state;
    static const struct {
        int64_t ms;
        const char *text;
    } cases[] = {
        {1, "1ms"},
        {1500, "1500ms"},
        {1000, "1s"},
        {90000, "90s"},
        {60000, "1m"},
        {1800000, "30m"},
        {5400000, "90m"},
        {3600000, "1h"},
        {7200000, "2h"},
        {86400000, "1d"},
        {604800000, "7d"},
        {90000000, "25h"},
        {86401000, "86401s"},
        {0, "0ms"},
        {-1800000, "-30m"},
        {-1, "-1ms"},
        {INT64_MAX, "9223372036854775807ms"},
        {INT64_MIN, "-9223372036854775808ms"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char buf[32];
        lapse_duration_format(cases[i].ms, buf, sizeof buf);
        assert_string_equal(buf, cases[i].text);
    }
    /* A short buffer is truncated, never overrun. */
    char small[4] = "zzz";
    lapse_duration_format(1500, small, sizeof small);
    assert_string_equal(small, "150");
    lapse_duration_format(1500, small, 0);
    assert_string_equal(small, "150");
}

/* For people (status, pending, sweep): compound units, largest first, zeros left out. */
static void test_duration_display_for_people(void **state) {
    (void)state;
    static const struct {
        int64_t ms;
        const char *text;
    } cases[] = {
        {0, "0s"},
        {1, "1ms"},
        {999, "999ms"},
        {1000, "1s"},
        {1500, "1s500ms"},
        {59999, "59s999ms"},
        {60000, "1m"},
        {90000, "1m30s"},
        {3600000, "1h"},
        {3601000, "1h1s"},
        {86400000, "1d"},
        {90000000, "1d1h"},
        {86401000, "1d1s"},
        {1800000, "30m"},
        {INT64_C(134217728000), "1553d10h42m8s"},  /* the longest rung: 2^27 s */
        {INT64_C(268435455000), "3106d21h24m15s"}, /* the furthest deadline */
        {-90000, "-1m30s"},
        {-1, "-1ms"},
        {INT64_MAX, "106751991167d7h12m55s807ms"},
        {INT64_MIN, "-106751991167d7h12m55s808ms"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char buf[LAPSE_DURATION_DISPLAY_LEN];
        memset(buf, 'z', sizeof buf);
        lapse_duration_display(cases[i].ms, buf, sizeof buf);
        assert_string_equal(buf, cases[i].text);
        assert_true(strlen(buf) < LAPSE_DURATION_DISPLAY_LEN);
    }
    /* Class names keep their canonical spelling: the two formatters differ on purpose. */
    char canonical[32];
    lapse_duration_format(90000, canonical, sizeof canonical);
    assert_string_equal(canonical, "90s");
    /* Truncated to cap, never overrun; cap 0 writes nothing. */
    char small[5] = "zzzz";
    lapse_duration_display(90000, small, sizeof small);
    assert_string_equal(small, "1m30");
    lapse_duration_display(90000, small, 0);
    assert_string_equal(small, "1m30");
    lapse_duration_display(90000, NULL, 8);
}

static void test_duration_format_round_trips(void **state) {
    (void)state;
    static const int64_t values[] = {1,         999,
                                     1000,      1001,
                                     59999,     60000,
                                     3599999,   3600000,
                                     86399999,  86400000,
                                     172800000, 123456789,
                                     INT64_MAX, INT64_C(604800000) * 52};
    for (size_t i = 0; i < ARRAY_LEN(values); i++) {
        char buf[32];
        int64_t back = 0;
        lapse_duration_format(values[i], buf, sizeof buf);
        assert_int_equal(lapse_duration_parse(buf, &back), LAPSE_OK);
        assert_int_equal(back, values[i]);
    }
}

static void test_time_parse_accepts_valid(void **state) {
    (void)state;
    static const struct {
        const char *text;
        int64_t ms;
    } good[] = {
        {"1970-01-01T00:00:00Z", 0},
        {"1970-01-01T00:00:00.000Z", 0},
        {"1970-01-01T00:00:00.001Z", 1},
        {"2026-11-30T06:30:00.000Z", INT64_C(1796020200000)},
        {"2026-11-30t06:30:00.000z", INT64_C(1796020200000)},
        {"2026-11-30T12:00:00+05:30", INT64_C(1796020200000)},
        {"2026-11-30T01:30:00-05:00", INT64_C(1796020200000)},
        {"2026-11-30T06:30:00+00:00", INT64_C(1796020200000)},
        {"2026-11-30T06:30:00-00:00", INT64_C(1796020200000)},
        {"2026-11-30T06:30:00.5Z", INT64_C(1796020200500)},
        {"2026-11-30T06:30:00.12Z", INT64_C(1796020200120)},
        {"2026-11-30T06:30:00.123456Z", INT64_C(1796020200123)},
        {"2026-11-30T06:30:00.999999999999Z", INT64_C(1796020200999)},
        {"2024-02-29T00:00:00Z", INT64_C(1709164800000)},
        {"2000-02-29T00:00:00Z", INT64_C(951782400000)},
        {"2024-12-31T23:59:59.999Z", INT64_C(1735689599999)},
        {"2038-01-19T03:14:08Z", INT64_C(2147483648000)},
        {"9999-12-31T23:59:59.999Z", INT64_C(253402300799999)},
        {"9999-12-31T23:59:59.999999Z", INT64_C(253402300799999)},
        {"1970-01-01T05:00:00+05:00", 0},
        {"9999-12-31T23:59:59.999+00:01", INT64_C(253402300739999)},
    };
    for (size_t i = 0; i < ARRAY_LEN(good); i++) {
        int64_t ms = -1;
        if (lapse_time_parse_rfc3339(good[i].text, &ms) != LAPSE_OK || ms != good[i].ms) {
            fail_msg("\"%s\": got %lld, want %lld", good[i].text, (long long)ms,
                     (long long)good[i].ms);
        }
    }
}

static void test_time_parse_rejects_invalid(void **state) {
    (void)state;
    static const char *const bad[] = {
        "",
        "garbage",
        "2026-11-30",
        "2026-11-30T06:30:00",     /* no zone */
        "2026-11-30T06:30:00.000", /* no zone */
        "2026-11-30 06:30:00Z",    /* space separator */
        "2026-11-30T06:30Z",       /* no seconds */
        "2026-13-30T06:30:00Z",    /* month 13 */
        "2026-00-30T06:30:00Z",    /* month 0 */
        "2026-11-00T06:30:00Z",    /* day 0 */
        "2026-11-31T06:30:00Z",    /* November has 30 days */
        "2026-02-29T06:30:00Z",    /* not a leap year */
        "1900-02-29T06:30:00Z",    /* century, not a leap year (and too early) */
        "2100-02-29T06:30:00Z",    /* century, not a leap year */
        "2026-02-30T06:30:00Z",
        "2026-04-31T00:00:00Z",
        "2026-11-30T24:00:00Z",
        "2026-11-30T06:60:00Z",
        "2026-12-31T23:59:60Z",     /* leap second */
        "2026-11-30T06:30:00.Z",    /* empty fraction */
        "2026-11-30T06:30:00,5Z",   /* comma fraction */
        "2026-11-30T06:30:00+0530", /* offset without colon */
        "2026-11-30T06:30:00+05",
        "2026-11-30T06:30:00+24:00",
        "2026-11-30T06:30:00+05:60",
        "2026-11-30T06:30:00ZZ",
        "2026-11-30T06:30:00Z ",
        " 2026-11-30T06:30:00Z",
        "26-11-30T06:30:00Z",
        "+2026-11-30T06:30:00Z",
        "20261-11-30T06:30:00Z",
        "2026-1-30T06:30:00Z",
        "2026/11/30T06:30:00Z",
        "1969-12-31T23:59:59.999Z",      /* before the epoch */
        "1970-01-01T00:30:00+01:00",     /* 1969 in UTC */
        "9999-12-31T23:59:59.999-00:01", /* year 10000 in UTC */
        "2026-11-30T06:30:00.000UTC",
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        int64_t ms = 42;
        if (lapse_time_parse_rfc3339(bad[i], &ms) != LAPSE_ERR_MSG_TIME || ms != 42) {
            fail_msg("\"%s\" accepted as %lld", bad[i], (long long)ms);
        }
    }
    int64_t ms;
    assert_int_equal(lapse_time_parse_rfc3339(NULL, &ms), LAPSE_ERR_MSG_TIME);
    assert_int_equal(lapse_time_parse_rfc3339("1970-01-01T00:00:00Z", NULL),
                     LAPSE_ERR_MSG_TIME);
}

static void test_time_format(void **state) {
    (void)state;
    static const struct {
        int64_t ms;
        const char *text;
    } cases[] = {
        {0, "1970-01-01T00:00:00.000Z"},
        {1, "1970-01-01T00:00:00.001Z"},
        {INT64_C(1796020200000), "2026-11-30T06:30:00.000Z"},
        {INT64_C(1796020200500), "2026-11-30T06:30:00.500Z"},
        {INT64_C(1709251199999), "2024-02-29T23:59:59.999Z"},
        {INT64_C(1709251200000), "2024-03-01T00:00:00.000Z"},
        {INT64_C(951782400000), "2000-02-29T00:00:00.000Z"},
        /* Every field's digits apart from its neighbours' (two at a time are copied). */
        {INT64_C(2163160048059), "2038-07-19T13:47:28.059Z"},
        {INT64_C(946631101100), "1999-12-31T09:05:01.100Z"},
        {INT64_C(253402300799999), "9999-12-31T23:59:59.999Z"},
        /* Out of range: clamped to what fits the buffer and parses back. */
        {-1, "1970-01-01T00:00:00.000Z"},
        {INT64_MIN, "1970-01-01T00:00:00.000Z"},
        {INT64_MAX, "9999-12-31T23:59:59.999Z"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char buf[LAPSE_RFC3339_LEN];
        lapse_time_format_rfc3339(cases[i].ms, buf);
        assert_string_equal(buf, cases[i].text);
        assert_int_equal(strlen(buf), LAPSE_RFC3339_LEN - 1);
    }
}

static void test_time_round_trips_every_day(void **state) {
    (void)state;
    /* Every day from 1970 to past 2100 at an odd time of day, plus the far end: checks
     * days_from_civil and civil_from_days against each other across leap rules. */
    char buf[LAPSE_RFC3339_LEN];
    for (int64_t day = 0; day < 50000; day++) {
        int64_t ms = day * 86400000 + 45296789; /* 12:34:56.789 */
        int64_t back = -1;
        lapse_time_format_rfc3339(ms, buf);
        assert_int_equal(lapse_time_parse_rfc3339(buf, &back), LAPSE_OK);
        assert_int_equal(back, ms);
    }
    int64_t last = INT64_C(253402300799999);
    for (int64_t ms = last - INT64_C(86400000) * 1000; ms <= last; ms += 86399999) {
        int64_t back = -1;
        lapse_time_format_rfc3339(ms, buf);
        assert_int_equal(lapse_time_parse_rfc3339(buf, &back), LAPSE_OK);
        assert_int_equal(back, ms);
    }
}

static void test_leap_years(void **state) {
    (void)state;
    int64_t ms;
    assert_int_equal(lapse_time_parse_rfc3339("2024-02-29T12:00:00Z", &ms), LAPSE_OK);
    assert_int_equal(lapse_time_parse_rfc3339("2026-02-29T12:00:00Z", &ms),
                     LAPSE_ERR_MSG_TIME);
    assert_int_equal(lapse_time_parse_rfc3339("2000-02-29T12:00:00Z", &ms), LAPSE_OK);
    assert_int_equal(lapse_time_parse_rfc3339("2100-02-29T12:00:00Z", &ms),
                     LAPSE_ERR_MSG_TIME);
    assert_int_equal(lapse_time_parse_rfc3339("2400-02-29T12:00:00Z", &ms), LAPSE_OK);
    assert_int_equal(lapse_time_parse_rfc3339("2024-02-30T12:00:00Z", &ms),
                     LAPSE_ERR_MSG_TIME);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_duration_parse_accepts_each_unit),
        cmocka_unit_test(test_duration_parse_rejects_bad_text),
        cmocka_unit_test(test_duration_format_uses_largest_exact_unit),
        cmocka_unit_test(test_duration_format_round_trips),
        cmocka_unit_test(test_duration_display_for_people),
        cmocka_unit_test(test_time_parse_accepts_valid),
        cmocka_unit_test(test_time_parse_rejects_invalid),
        cmocka_unit_test(test_time_format),
        cmocka_unit_test(test_time_round_trips_every_day),
        cmocka_unit_test(test_leap_years),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT
 * Durations, RFC 3339 times and the wall clock: pure arithmetic, no locale or time zone.
 */
#include "clock_int.h"

#include <lapse/message.h>

#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define MS_PER_S   INT64_C(1000)
#define MS_PER_MIN (60 * MS_PER_S)
#define MS_PER_H   (60 * MS_PER_MIN)
#define MS_PER_DAY (24 * MS_PER_H)

/* 9999-12-31T23:59:59.999Z: the last instant whose spelling fits LAPSE_RFC3339_LEN. */
#define TIME_MAX_MS INT64_C(253402300799999)

static const struct {
    const char *suffix;
    int64_t ms;
} units[] = {
    /* Longest suffix first so "ms" is not read as "m" followed by junk. */
    {"ms", 1}, {"s", MS_PER_S}, {"m", MS_PER_MIN}, {"h", MS_PER_H}, {"d", MS_PER_DAY},
};

static bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

lapse_status_t lapse_duration_parse(const char *text, int64_t *out_ms) {
    if (text == NULL || out_ms == NULL) {
        return LAPSE_ERR_CONFIG_DURATION;
    }
    const char *p = text;
    int64_t value = 0;
    while (is_digit(*p)) {
        int digit = *p - '0';
        if (value > (INT64_MAX - digit) / 10) {
            return LAPSE_ERR_CONFIG_DURATION;
        }
        value = value * 10 + digit;
        p++;
    }
    if (p == text || value == 0) {
        return LAPSE_ERR_CONFIG_DURATION;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(p, units[i].suffix) == 0) {
            if (value > INT64_MAX / units[i].ms) {
                return LAPSE_ERR_CONFIG_DURATION;
            }
            *out_ms = value * units[i].ms;
            return LAPSE_OK;
        }
    }
    return LAPSE_ERR_CONFIG_DURATION;
}

void lapse_duration_format(int64_t ms, char *buf, size_t cap) {
    if (buf == NULL || cap == 0) {
        return;
    }
    if (ms == 0) {
        snprintf(buf, cap, "0ms");
        return;
    }
    /* Work on the magnitude as unsigned so INT64_MIN has one too. */
    const char *sign = ms < 0 ? "-" : "";
    uint64_t mag = ms < 0 ? (uint64_t)(-(ms + 1)) + 1 : (uint64_t)ms;
    for (size_t i = sizeof units / sizeof units[0]; i-- > 1;) {
        uint64_t unit = (uint64_t)units[i].ms;
        if (mag % unit == 0) {
            snprintf(buf, cap, "%s%llu%s", sign, (unsigned long long)(mag / unit),
                     units[i].suffix);
            return;
        }
    }
    snprintf(buf, cap, "%s%llums", sign, (unsigned long long)mag);
}

void lapse_duration_display(int64_t ms, char *buf, size_t cap) {
    if (buf == NULL || cap == 0) {
        return;
    }
    if (ms == 0) {
        snprintf(buf, cap, "0s");
        return;
    }
    char text[LAPSE_DURATION_DISPLAY_LEN];
    size_t used = 0;
    if (ms < 0) {
        text[used++] = '-';
    }
    /* The magnitude as unsigned, so INT64_MIN has one too. */
    uint64_t mag = ms < 0 ? (uint64_t)(-(ms + 1)) + 1 : (uint64_t)ms;
    for (size_t i = sizeof units / sizeof units[0]; i-- > 0;) {
        uint64_t unit = (uint64_t)units[i].ms;
        if (mag >= unit) {
            /* At most "-106751991167d23h59m59s999ms": 29 bytes, so it always fits. */
            used += (size_t)snprintf(text + used, sizeof text - used, "%llu%s",
                                     (unsigned long long)(mag / unit), units[i].suffix);
            mag %= unit;
        }
    }
    snprintf(buf, cap, "%s", text);
}

/* Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil),
 * written out so the result depends on neither timegm() nor the TZ environment. */
static int64_t days_from_civil(int64_t y, int m, int d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static void civil_from_days(int64_t z, int64_t *y, int *m, int *d) {
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

static bool is_leap(int64_t y) {
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

static int days_in_month(int64_t y, int m) {
    static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return m == 2 && is_leap(y) ? 29 : days[m - 1];
}

/* Read exactly n digits; false if any is missing. */
static bool read_digits(const char **pp, int n, int *out) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!is_digit((*pp)[i])) {
            return false;
        }
        v = v * 10 + ((*pp)[i] - '0');
    }
    *pp += n;
    *out = v;
    return true;
}

static bool expect_char(const char **pp, char c) {
    if (**pp != c) {
        return false;
    }
    (*pp)++;
    return true;
}

lapse_status_t lapse_time_parse_rfc3339(const char *text, int64_t *out_ms) {
    if (text == NULL || out_ms == NULL) {
        return LAPSE_ERR_MSG_TIME;
    }
    const char *p = text;
    int year, month, day, hour, minute, second;
    if (!read_digits(&p, 4, &year) || !expect_char(&p, '-') ||
        !read_digits(&p, 2, &month) || !expect_char(&p, '-') ||
        !read_digits(&p, 2, &day)) {
        return LAPSE_ERR_MSG_TIME;
    }
    if (*p != 'T' && *p != 't') {
        return LAPSE_ERR_MSG_TIME;
    }
    p++;
    if (!read_digits(&p, 2, &hour) || !expect_char(&p, ':') ||
        !read_digits(&p, 2, &minute) || !expect_char(&p, ':') ||
        !read_digits(&p, 2, &second)) {
        return LAPSE_ERR_MSG_TIME;
    }
    if (year < 1970 || month < 1 || month > 12 || day < 1 ||
        day > days_in_month(year, month) || hour > 23 || minute > 59 || second > 59) {
        return LAPSE_ERR_MSG_TIME;
    }

    /* Milliseconds are kept and finer digits truncated (as message.h promises): rounding
     * could carry into the next second, day or year, and sub-millisecond precision means
     * nothing against clock skew between machines. */
    int64_t millis = 0;
    if (*p == '.') {
        p++;
        if (!is_digit(*p)) {
            return LAPSE_ERR_MSG_TIME;
        }
        int64_t scale = 100;
        while (is_digit(*p)) {
            millis += (*p - '0') * scale;
            scale /= 10;
            p++;
        }
    }

    int64_t offset_min = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int sign = *p == '-' ? -1 : 1;
        int off_h, off_m;
        p++;
        if (!read_digits(&p, 2, &off_h) || !expect_char(&p, ':') ||
            !read_digits(&p, 2, &off_m) || off_h > 23 || off_m > 59) {
            return LAPSE_ERR_MSG_TIME;
        }
        offset_min = sign * (off_h * 60 + off_m);
    } else {
        return LAPSE_ERR_MSG_TIME;
    }
    if (*p != '\0') {
        return LAPSE_ERR_MSG_TIME;
    }

    int64_t days = days_from_civil(year, month, day);
    int64_t secs = days * 86400 + hour * 3600 + minute * 60 + second - offset_min * 60;
    int64_t ms = secs * MS_PER_S + millis;
    /* An offset can push a 1970 or 9999 local time outside the range we can spell in UTC.
     */
    if (ms < 0 || ms > TIME_MAX_MS) {
        return LAPSE_ERR_MSG_TIME;
    }
    *out_ms = ms;
    return LAPSE_OK;
}

/* "00" to "99", so that a field's two digits are one copy: the consumer spells two or
 * three times per order (the event's deadline and cancelled_at, its log line). */
static const char TWO_DIGITS[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

static char *put2(char *p, uint32_t v) {
    memcpy(p, TWO_DIGITS + 2 * v, 2);
    return p + 2;
}

void lapse_time_format_rfc3339(int64_t ms, char buf[LAPSE_RFC3339_LEN]) {
    /* Outside the parser's range the spelling would not fit the buffer; clamp so the
     * output is always a valid time that parses back. */
    if (ms < 0) {
        ms = 0;
    } else if (ms > TIME_MAX_MS) {
        ms = TIME_MAX_MS;
    }
    int64_t days = ms / MS_PER_DAY;
    int64_t rem = ms % MS_PER_DAY;
    int64_t year;
    int month, day;
    civil_from_days(days, &year, &month, &day);

    uint32_t in_day = (uint32_t)rem;
    uint32_t y = (uint32_t)year;
    char *p = put2(put2(buf, y / 100), y % 100);
    *p++ = '-';
    p = put2(p, (uint32_t)month);
    *p++ = '-';
    p = put2(p, (uint32_t)day);
    *p++ = 'T';
    p = put2(p, in_day / 3600000u);
    *p++ = ':';
    p = put2(p, in_day % 3600000u / 60000u);
    *p++ = ':';
    p = put2(p, in_day % 60000u / 1000u);
    *p++ = '.';
    *p++ = (char)('0' + in_day % 1000u / 100u);
    p = put2(p, in_day % 100u);
    *p++ = 'Z';
    *p = '\0';
}

int64_t lapse_clock_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * MS_PER_S + ts.tv_nsec / 1000000;
}

int64_t lapse__mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * MS_PER_S + ts.tv_nsec / 1000000;
}

int64_t lapse__time_add(int64_t a, int64_t b) {
    if (b > 0 && a > INT64_MAX - b) {
        return INT64_MAX;
    }
    if (b < 0 && a < INT64_MIN - b) {
        return INT64_MIN;
    }
    return a + b;
}

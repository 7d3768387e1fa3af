/* SPDX-License-Identifier: MIT
 * The `publish --batch` line parser: good lines, and each way a line can be wrong. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "batch_int.h"

#include <stdlib.h>
#include <string.h>

#define NOW 1796022000000LL

static void test_timeout_line_with_holds(void **state) {
    (void)state;
    const char *line =
        "{\"order_id\":\"ord-1\",\"timeout\":\"30m\",\"holds\":[\"a\",\"b\"]}";
    lapse_batch_line_t bl;
    assert_int_equal(lapse_batch_line_parse(line, strlen(line), NOW, &bl, NULL),
                     LAPSE_OK);
    assert_string_equal(bl.order_id, "ord-1");
    assert_int_equal(bl.timeout_ms, 1800000);
    assert_int_equal(bl.deadline_ms, NOW + 1800000);
    assert_int_equal(bl.n_holds, 2);
    assert_string_equal(bl.holds[0], "a");
    assert_string_equal(bl.holds[1], "b");
    lapse_batch_line_clear(&bl);
    assert_null(bl.holds);
}

static void test_deadline_line_without_holds(void **state) {
    (void)state;
    const char *line = "{\"deadline\":\"2026-12-01T18:00:00Z\",\"order_id\":\"x:1\"}";
    lapse_batch_line_t bl;
    assert_int_equal(lapse_batch_line_parse(line, strlen(line), NOW, &bl, NULL),
                     LAPSE_OK);
    assert_int_equal(bl.timeout_ms, 0);
    int64_t want;
    assert_int_equal(lapse_time_parse_rfc3339("2026-12-01T18:00:00Z", &want), LAPSE_OK);
    assert_int_equal(bl.deadline_ms, want);
    assert_int_equal(bl.n_holds, 0);
    lapse_batch_line_clear(&bl);
}

/* Neither: the deadline is the store's to give (an orders map). */
static void test_line_with_only_an_order_id(void **state) {
    (void)state;
    const char *line = "{\"order_id\":\"1042\"}";
    lapse_batch_line_t bl;
    assert_int_equal(lapse_batch_line_parse(line, strlen(line), NOW, &bl, NULL),
                     LAPSE_OK);
    assert_string_equal(bl.order_id, "1042");
    assert_int_equal(bl.timeout_ms, 0);
    assert_int_equal(bl.deadline_ms, 0);
    lapse_batch_line_clear(&bl);
}

static void test_line_need_not_be_nul_terminated(void **state) {
    (void)state;
    const char text[] = "{\"order_id\":\"o\",\"timeout\":\"90s\"}GARBAGE";
    size_t len = strlen("{\"order_id\":\"o\",\"timeout\":\"90s\"}");
    lapse_batch_line_t bl;
    assert_int_equal(lapse_batch_line_parse(text, len, NOW, &bl, NULL), LAPSE_OK);
    assert_int_equal(bl.timeout_ms, 90000);
    lapse_batch_line_clear(&bl);
}

static const struct {
    const char *line;
    lapse_status_t want;
    const char *reason; /* a piece of err.text */
} bad[] = {
    {"", LAPSE_ERR_MSG_JSON, ""},
    {"not json", LAPSE_ERR_MSG_JSON, ""},
    {"[1,2]", LAPSE_ERR_MSG_JSON, "not a JSON object"},
    {"{\"order_id\":\"o\",\"timeout\":\"30m\",\"deadline\":\"2026-12-01T18:00:00Z\"}",
     LAPSE_ERR_MSG_FIELD, "not both"},
    {"{\"timeout\":\"30m\"}", LAPSE_ERR_MSG_FIELD, "order_id"},
    {"{\"order_id\":7,\"timeout\":\"30m\"}", LAPSE_ERR_MSG_FIELD, "order_id"},
    {"{\"order_id\":\"has space\",\"timeout\":\"30m\"}", LAPSE_ERR_MSG_ORDER_ID, ""},
    {"{\"order_id\":\"\",\"timeout\":\"30m\"}", LAPSE_ERR_MSG_ORDER_ID, ""},
    {"{\"order_id\":\"o\",\"timeout\":\"30 minutes\"}", LAPSE_ERR_CONFIG_DURATION,
     "timeout"},
    {"{\"order_id\":\"o\",\"timeout\":1800}", LAPSE_ERR_CONFIG_DURATION, "timeout"},
    {"{\"order_id\":\"o\",\"deadline\":\"tomorrow\"}", LAPSE_ERR_MSG_TIME, "deadline"},
    {"{\"order_id\":\"o\",\"timeout\":\"30m\",\"holds\":\"seat\"}", LAPSE_ERR_MSG_FIELD,
     "holds"},
    {"{\"order_id\":\"o\",\"timeout\":\"30m\",\"holds\":[\"\"]}", LAPSE_ERR_MSG_FIELD,
     "hold"},
    {"{\"order_id\":\"o\",\"timeout\":\"30m\",\"holds\":[3]}", LAPSE_ERR_MSG_FIELD,
     "hold"},
    {"{\"order_id\":\"o\",\"timeout\":\"30m\",\"hold\":[\"a\"]}", LAPSE_ERR_MSG_FIELD,
     "unknown field"},
    {"{\"order_id\":\"o\",\"order_id\":\"p\",\"timeout\":\"30m\"}", LAPSE_ERR_MSG_JSON,
     ""},
    /* Found by tests/fuzz/fuzz_batch: a timeout that puts the deadline past year 9999,
     * which no expiry message can carry, and one that overflowed now + timeout. */
    {"{\"order_id\":\"o\",\"timeout\":\"2111111111111111s\"}", LAPSE_ERR_CONFIG_DURATION,
     "timeout"},
    {"{\"order_id\":\"o\",\"timeout\":\"9223372036854775807ms\"}",
     LAPSE_ERR_CONFIG_DURATION, "timeout"},
};

static void test_bad_lines_are_refused_with_a_reason(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        lapse_batch_line_t bl;
        lapse_error_t err = {0};
        lapse_status_t rc =
            lapse_batch_line_parse(bad[i].line, strlen(bad[i].line), NOW, &bl, &err);
        if (rc != bad[i].want || strstr(err.text, bad[i].reason) == NULL ||
            !err.text[0]) {
            fail_msg("line %zu '%s': got %s '%s', want %s '%s'", i, bad[i].line,
                     lapse_status_name(rc), err.text, lapse_status_name(bad[i].want),
                     bad[i].reason);
        }
        assert_null(bl.holds);
        assert_null(bl.priv_);
    }
}

static void test_limits(void **state) {
    (void)state;
    /* 65 holds: over the limit of 64. */
    char line[4096] = "{\"order_id\":\"o\",\"timeout\":\"30m\",\"holds\":[";
    for (int i = 0; i < 65; i++) {
        strcat(line, i ? ",\"h\"" : "\"h\"");
    }
    strcat(line, "]}");
    lapse_batch_line_t bl;
    assert_int_equal(lapse_batch_line_parse(line, strlen(line), NOW, &bl, NULL),
                     LAPSE_ERR_MSG_FIELD);
    /* A line over the body limit is refused before parsing. */
    size_t big = LAPSE_MSG_MAX_BODY + 1;
    char *huge = malloc(big);
    memset(huge, ' ', big);
    assert_int_equal(lapse_batch_line_parse(huge, big, NOW, &bl, NULL),
                     LAPSE_ERR_MSG_TOO_LARGE);
    free(huge);
}

/* The plain reader decides these (a plain shape, good or bad), exactly as jansson's
 * reader does: same verdict, same fields, same error text. */
static const char *const plain[] = {
    "{\"order_id\":\"p-0\",\"timeout\":\"30m\"}",
    " {\r\n\t\"timeout\" : \"1h30m\" ,\"order_id\":\"a.b:c_d-9\"} \n",
    "{\"order_id\":\"o\",\"deadline\":\"2026-12-01T18:00:00Z\"}",
    "{\"order_id\":\"o\",\"deadline\":\"2026-12-01T18:00:00.250+01:00\"}",
    "{\"order_id\":\"1042\"}",
    "{\"order_id\":\"has space\",\"timeout\":\"30m\"}",
    "{\"order_id\":\"\",\"timeout\":\"30m\"}",
    "{\"order_id\":\"o\",\"timeout\":\"30 minutes\"}",
    "{\"order_id\":\"o\",\"timeout\":\"0s\"}",
    "{\"order_id\":\"o\",\"deadline\":\"tomorrow\"}",
    "{\"order_id\":\"o\",\"timeout\":\"30m\",\"deadline\":\"2026-12-01T18:00:00Z\"}",
    "{\"order_id\":\"o\",\"timeout\":\"2111111111111111s\"}",
    "{\"order_id\":\"o\",\"timeout\":\"9223372036854775807ms\"}",
};

/* ... and leaves these to jansson: holds, escapes, bytes outside printable ASCII, other
 * keys or value types, a key twice, anything malformed. */
static const char *const not_plain[] = {
    "",
    "{}",
    "{\"timeout\":\"30m\"}",
    "{\"order_id\":\"o\",\"timeout\":\"30m\",\"holds\":[\"a\"]}",
    "{\"order_id\":\"\\u0041\",\"timeout\":\"30m\"}",
    "{\"order_id\":\"o\u00e9\",\"timeout\":\"30m\"}",
    "{\"order_id\":\"o\\\"\",\"timeout\":\"30m\"}",
    "{\"order_id\":\"o\x7f\",\"timeout\":\"30m\"}",
    "{\"order_id\":\"o\",\"timeout\":1800}",
    "{\"order_id\":7}",
    "{\"order_id\":\"o\",\"order_id\":\"p\"}",
    "{\"order_id\":\"o\",\"hold\":\"a\"}",
    "{\"order_id\":\"o\",}",
    "{\"order_id\":\"o\"} x",
    "{\"order_id\":\"o\"",
    "{\"order_id\" \"o\"}",
    "[\"order_id\"]",
    "{\"order_id\":\"o\",\"timeout\":"
    "\"000000000000000000000000000000000000000000000000000000000000000000000030m"
    "\"}", /* longer than the 64 bytes the plain reader copies */
};

static void test_the_plain_reader_agrees_with_jansson(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        lapse_batch_line_t a, b;
        lapse_error_t ea = {0}, eb = {0};
        lapse_status_t rc = LAPSE_ERR_NOMEM;
        size_t len = strlen(plain[i]);
        if (!lapse__batch_line_parse_plain(plain[i], len, NOW, &a, &ea, &rc)) {
            fail_msg("line %zu '%s' was not read as plain", i, plain[i]);
        }
        lapse_status_t want = lapse__batch_line_parse_json(plain[i], len, NOW, &b, &eb);
        if (rc != want || strcmp(ea.text, eb.text) != 0) {
            fail_msg("line %zu '%s': plain %s '%s', jansson %s '%s'", i, plain[i],
                     lapse_status_name(rc), ea.text, lapse_status_name(want), eb.text);
        }
        assert_string_equal(a.order_id, b.order_id);
        assert_int_equal(a.timeout_ms, b.timeout_ms);
        assert_int_equal(a.deadline_ms, b.deadline_ms);
        assert_int_equal(a.n_holds, 0);
        assert_null(a.priv_);
        lapse_batch_line_clear(&a);
        lapse_batch_line_clear(&b);
    }
    for (size_t i = 0; i < sizeof not_plain / sizeof not_plain[0]; i++) {
        lapse_batch_line_t a;
        lapse_error_t ea = {0};
        lapse_status_t rc = LAPSE_ERR_NOMEM;
        if (lapse__batch_line_parse_plain(not_plain[i], strlen(not_plain[i]), NOW, &a,
                                          &ea, &rc)) {
            fail_msg("line %zu '%s' was read as plain", i, not_plain[i]);
        }
        assert_int_equal(rc, LAPSE_ERR_NOMEM);
        assert_string_equal(ea.text, "");
        assert_null(a.priv_);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timeout_line_with_holds),
        cmocka_unit_test(test_deadline_line_without_holds),
        cmocka_unit_test(test_line_with_only_an_order_id),
        cmocka_unit_test(test_line_need_not_be_nul_terminated),
        cmocka_unit_test(test_bad_lines_are_refused_with_a_reason),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_the_plain_reader_agrees_with_jansson),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT
 * The status table: every code has a distinct name and message, in its subsystem's range.
 */
#include <lapse/lapse.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

static const struct {
    lapse_status_t code;
    const char *name;
    bool retriable;
    const char *msg;
} table[] = {
#define ROW(name, value, retriable, msg) {LAPSE_##name, #name, (retriable) != 0, msg},
    LAPSE_STATUS_MAP(ROW)
#undef ROW
};

#define N_CODES (sizeof table / sizeof table[0])

/* The subsystem a name claims, as the high byte of the negated code. */
static int subsystem_of(const char *name) {
    static const struct {
        const char *prefix;
        int range;
    } ranges[] = {
        {"ERR_BROKER_", 1},
        {"ERR_STORE_", 2},
        {"ERR_MSG_", 3},
        {"ERR_CONFIG_", 4},
    };
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        if (strncmp(name, ranges[i].prefix, strlen(ranges[i].prefix)) == 0) {
            return ranges[i].range;
        }
    }
    return 0;
}

static void test_every_code_has_name_and_message(void **state) {
    (void)state;
    assert_true(N_CODES > 1);
    for (size_t i = 0; i < N_CODES; i++) {
        const char *name = lapse_status_name(table[i].code);
        const char *msg = lapse_strerror(table[i].code);
        assert_non_null(name);
        assert_non_null(msg);
        assert_true(name[0] != '\0');
        assert_true(msg[0] != '\0');
        assert_string_equal(name, table[i].name);
        assert_string_equal(msg, table[i].msg);
        /* Static strings: the same pointer every time, nothing to free. */
        assert_ptr_equal(name, lapse_status_name(table[i].code));
        assert_ptr_equal(msg, lapse_strerror(table[i].code));
    }
}

static void test_codes_names_and_messages_are_distinct(void **state) {
    (void)state;
    for (size_t i = 0; i < N_CODES; i++) {
        for (size_t j = i + 1; j < N_CODES; j++) {
            if (table[i].code == table[j].code) {
                fail_msg("%s and %s share a value", table[i].name, table[j].name);
            }
            if (strcmp(table[i].name, table[j].name) == 0) {
                fail_msg("name %s twice", table[i].name);
            }
            if (strcmp(table[i].msg, table[j].msg) == 0) {
                fail_msg("%s and %s share a message", table[i].name, table[j].name);
            }
        }
    }
}

static void test_codes_sit_in_their_subsystem_range(void **state) {
    (void)state;
    assert_int_equal(LAPSE_OK, 0);
    assert_string_equal(table[0].name, "OK");
    for (size_t i = 1; i < N_CODES; i++) {
        int code = (int)table[i].code;
        if (code >= 0) {
            fail_msg("%s is not negative", table[i].name);
        }
        if (strncmp(table[i].name, "ERR_", 4) != 0) {
            fail_msg("%s does not start with ERR_", table[i].name);
        }
        int range = -code >> 8;
        if (range != subsystem_of(table[i].name) || (-code & 0xFF) == 0) {
            fail_msg("%s = -0x%04x is outside its range", table[i].name, -code);
        }
    }
}

static void test_retriable_flags_follow_the_map(void **state) {
    (void)state;
    for (size_t i = 0; i < N_CODES; i++) {
        if (lapse_status_is_retriable(table[i].code) != table[i].retriable) {
            fail_msg("%s: retriable flag differs from the map", table[i].name);
        }
    }
    /* The retry loop's expectations, spelled out. */
    assert_false(lapse_status_is_retriable(LAPSE_OK));
    assert_true(lapse_status_is_retriable(LAPSE_ERR_BROKER_CONNECT));
    assert_true(lapse_status_is_retriable(LAPSE_ERR_STORE_BUSY));
    assert_false(lapse_status_is_retriable(LAPSE_ERR_MSG_JSON));
    assert_false(lapse_status_is_retriable(LAPSE_ERR_BROKER_LOGIN));
}

static void test_unknown_code_is_handled(void **state) {
    (void)state;
    static const int unknown[] = {1, 42, -0x0005, -0x0199, -0x0300, -0x0999, INT32_MIN};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        lapse_status_t rc = (lapse_status_t)unknown[i];
        assert_string_equal(lapse_strerror(rc), "unknown status");
        assert_string_equal(lapse_status_name(rc), "UNKNOWN");
        assert_false(lapse_status_is_retriable(rc));
    }
}

static void test_error_set_records_code_and_text(void **state) {
    (void)state;
    lapse_error_t err;
    assert_int_equal(
        lapse_error_set(&err, LAPSE_ERR_MSG_FIELD, "missing field \"%s\"", "v"),
        LAPSE_ERR_MSG_FIELD);
    assert_int_equal(err.code, LAPSE_ERR_MSG_FIELD);
    assert_string_equal(err.text, "missing field \"v\"");

    lapse_error_clear(&err);
    assert_int_equal(err.code, LAPSE_OK);
    assert_string_equal(err.text, "");

    /* Prefixing the current reason with itself as an argument is safe. */
    lapse_error_set(&err, LAPSE_ERR_CONFIG_CLASS, "bad item \"%s\"", "soon");
    lapse_error_set(&err, err.code, "LAPSE_CLASSES: %s", err.text);
    assert_int_equal(err.code, LAPSE_ERR_CONFIG_CLASS);
    assert_string_equal(err.text, "LAPSE_CLASSES: bad item \"soon\"");

    assert_int_equal(lapse_error_set(NULL, LAPSE_ERR_IO, "ignored %d", 1), LAPSE_ERR_IO);
    lapse_error_clear(NULL);
}

static void test_error_set_truncates_safely(void **state) {
    (void)state;
    char long_text[1000];
    memset(long_text, 'a', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = '\0';

    lapse_error_t err;
    memset(&err, 0x5A, sizeof err);
    lapse_error_set(&err, LAPSE_ERR_STORE_SQL, "%s", long_text);
    assert_int_equal(err.code, LAPSE_ERR_STORE_SQL);
    assert_int_equal(strlen(err.text), sizeof err.text - 1);
    assert_memory_equal(err.text, long_text, sizeof err.text - 1);

    /* Exactly full: 159 bytes fit with the terminator. */
    long_text[sizeof err.text - 1] = '\0';
    lapse_error_set(&err, LAPSE_ERR_STORE_SQL, "%s", long_text);
    assert_int_equal(strlen(err.text), sizeof err.text - 1);

    /* A multi-byte character cut by the limit is dropped whole, not left half-written. */
    char utf8[200];
    memset(utf8, 'b', 158);
    memcpy(utf8 + 158, "\xe2\x9c\x93 tail", 9);
    lapse_error_set(&err, LAPSE_ERR_MSG_JSON, "%s", utf8);
    assert_int_equal(strlen(err.text), 158);
    /* One byte earlier the character fits exactly at the end. */
    lapse_error_set(&err, LAPSE_ERR_MSG_JSON, "%s", utf8 + 2);
    assert_int_equal(strlen(err.text), 159);
    assert_memory_equal(err.text + 156, "\xe2\x9c\x93", 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_code_has_name_and_message),
        cmocka_unit_test(test_codes_names_and_messages_are_distinct),
        cmocka_unit_test(test_codes_sit_in_their_subsystem_range),
        cmocka_unit_test(test_retriable_flags_follow_the_map),
        cmocka_unit_test(test_unknown_code_is_handled),
        cmocka_unit_test(test_error_set_records_code_and_text),
        cmocka_unit_test(test_error_set_truncates_safely),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT
 * Log lines: one line each, no control byte reaches the sink or a terminal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "config_int.h"

#include <stdint.h>
#include <string.h>

static char seen[4096];
static int calls;

static void sink(void *opaque, lapse_log_level_t level, const char *line) {
    (void)opaque;
    (void)level;
    calls++;
    strncpy(seen, line, sizeof seen - 1);
}

static void test_escape_control_bytes(void **state) {
    (void)state;
    char out[64];
    assert_string_equal(lapse__escape_ctl("a\nb\rc\x1b[2Jd\x7f", out, sizeof out),
                        "a\\x0ab\\x0dc\\x1b[2Jd\\x7f");
    assert_string_equal(lapse__escape_ctl("plain \"text\" é", out, sizeof out),
                        "plain \"text\" é");
    /* Cut short, never in the middle of an escape. */
    assert_string_equal(lapse__escape_ctl("ab\x01", out, 5), "ab");
    assert_string_equal(lapse__escape_ctl("ab\x01", out, 7), "ab\\x01");
    /* Cut inside a run that needs no escape, and after an escape. */
    assert_string_equal(lapse__escape_ctl("abcdef", out, 4), "abc");
    assert_string_equal(lapse__escape_ctl("\x01"
                                          "abcdef",
                                          out, 7),
                        "\\x01ab");
    assert_string_equal(lapse__escape_ctl("", out, 1), "");
    assert_string_equal(lapse__escape_ctl("x\ty\tz", out, sizeof out), "x\\x09y\\x09z");
}

static void test_log_line_is_escaped(void **state) {
    (void)state;
    lapse_config_t *cfg = lapse_config_new();
    assert_non_null(cfg);
    lapse_config_set_log_cb(cfg, sink, NULL);
    lapse__log(cfg, LAPSE_LOG_WARN, "event=x reason=\"%s\"",
               "forged\nevent=decision\x1b]0;t\x07");
    assert_string_equal(seen,
                        "event=x reason=\"forged\\x0aevent=decision\\x1b]0;t\\x07\"");
    assert_null(strchr(seen, '\n'));
    lapse_config_free(cfg);
}

/* Each level lets through the lines at or below it, and drops the others before they are
 * formatted: a dropped line's argument is never read (a pointer that would crash if it
 * were). */
static void test_level_filters_before_formatting(void **state) {
    (void)state;
    lapse_config_t *cfg = lapse_config_new();
    assert_non_null(cfg);
    lapse_config_set_log_cb(cfg, sink, NULL);
    assert_string_equal(lapse_config_get(cfg, "log_level"), "info");
    static const struct {
        const char *set, *get;
        int passed; /* of one line at each of error, warn, info, debug */
    } cases[] = {{"error", "error", 1},
                 {"warning", "warning", 2},
                 {"warn", "warning", 2},
                 {"info", "info", 3},
                 {"debug", "debug", 4}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(lapse_config_set(cfg, "log_level", cases[i].set, NULL),
                         LAPSE_OK);
        assert_string_equal(lapse_config_get(cfg, "log_level"), cases[i].get);
        calls = 0;
        for (int level = LAPSE_LOG_ERROR; level <= LAPSE_LOG_DEBUG; level++) {
            lapse__log(cfg, (lapse_log_level_t)level, "event=x level_was=%d", level);
        }
        assert_int_equal(calls, cases[i].passed);
    }
    assert_int_equal(lapse_config_set(cfg, "log_level", "warning", NULL), LAPSE_OK);
    calls = 0;
    const char *poison = (const char *)(uintptr_t)0x10;
    lapse__log(cfg, LAPSE_LOG_INFO, "event=decision order_id=%s", poison);
    lapse__log(cfg, LAPSE_LOG_DEBUG, "event=decision order_id=%s", poison);
    assert_int_equal(calls, 0);

    lapse_error_t err;
    assert_int_equal(lapse_config_set(cfg, "log_level", "verbose", &err),
                     LAPSE_ERR_CONFIG_VALUE);
    assert_non_null(strstr(err.text, "\"verbose\""));
    assert_string_equal(lapse_config_get(cfg, "log_level"), "warning");
    assert_string_equal(lapse_config_get(cfg, "log_format"), "text");
    assert_int_equal(lapse_config_set(cfg, "log_format", "json", NULL), LAPSE_OK);
    assert_string_equal(lapse_config_get(cfg, "log_format"), "json");
    assert_int_equal(lapse_config_set(cfg, "log_format", "xml", &err),
                     LAPSE_ERR_CONFIG_VALUE);
    assert_string_equal(lapse_config_get(cfg, "log_format"), "json");
    lapse_config_free(cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escape_control_bytes),
        cmocka_unit_test(test_log_line_is_escaped),
        cmocka_unit_test(test_level_filters_before_formatting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

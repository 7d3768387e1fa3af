/* SPDX-License-Identifier: MIT
 * Log lines: one line each, no control byte reaches the sink or a terminal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "config_int.h"

#include <string.h>

static char seen[4096];

static void sink(void *opaque, lapse_log_level_t level, const char *line) {
    (void)opaque;
    (void)level;
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escape_control_bytes),
        cmocka_unit_test(test_log_line_is_escaped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

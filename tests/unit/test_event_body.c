/* SPDX-License-Identifier: MIT
 * The order.cancelled body (src/event_body.c) is what jansson's compact dump of the same
 * object gives, byte for byte, and refuses exactly what jansson refuses (a hold that is
 * not UTF-8): fixed cases, then many random ones against a jansson reference. Pure. */
#include "store_int.h"

#include <lapse/message.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#define RANDOM_CASES 50000

/* The reference: the object built with jansson and dumped compact (how lapse wrote
 * the body before event_body.c). */
static char *reference(const char *order_id, int64_t deadline_ms, int64_t at_ms,
                       char *const *holds, size_t n_holds) {
    char deadline[LAPSE_RFC3339_LEN], at[LAPSE_RFC3339_LEN];
    lapse_time_format_rfc3339(deadline_ms, deadline);
    lapse_time_format_rfc3339(at_ms, at);
    json_t *array = json_array();
    bool ok = true;
    for (size_t i = 0; ok && i < n_holds; i++) {
        ok = json_array_append_new(array, json_string(holds[i])) == 0;
    }
    json_t *body = json_object();
    json_object_set_new(body, "event", json_string(LAPSE_EVENT_CANCELLED));
    json_object_set_new(body, "order_id", json_string(order_id));
    json_object_set_new(body, "deadline", json_string(deadline));
    json_object_set_new(body, "cancelled_at", json_string(at));
    json_object_set_new(body, "holds", array);
    char *text = ok ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    return text;
}

static bool same(const char *order_id, int64_t deadline_ms, int64_t at_ms,
                 char *const *holds, size_t n_holds) {
    char *want = reference(order_id, deadline_ms, at_ms, holds, n_holds);
    char *got = lapse__event_body(order_id, deadline_ms, at_ms, holds, n_holds);
    if ((want == NULL) != (got == NULL) || (want && strcmp(want, got) != 0)) {
        fprintf(stderr, "jansson: %s\nlapse:   %s\n", want ? want : "(refused)",
                got ? got : "(refused)");
        for (size_t h = 0; h < n_holds; h++) {
            fprintf(stderr, "hold %zu:", h);
            for (const unsigned char *p = (const unsigned char *)holds[h]; *p; p++) {
                fprintf(stderr, " %02x", *p);
            }
            fprintf(stderr, "\n");
        }
        fail();
    }
    bool refused = got == NULL;
    free(want);
    free(got);
    return refused;
}

/* same() on literals: copies, since the body takes char *const *. */
static bool same_lit(const char *order_id, int64_t deadline_ms, int64_t at_ms,
                     const char *const *lits, size_t n_holds) {
    char *holds[16];
    assert_true(n_holds <= 16);
    for (size_t h = 0; h < n_holds; h++) {
        holds[h] = strdup(lits[h]);
        assert_non_null(holds[h]);
    }
    bool refused = same(order_id, deadline_ms, at_ms, holds, n_holds);
    for (size_t h = 0; h < n_holds; h++) {
        free(holds[h]);
    }
    return refused;
}

static void test_fixed_cases(void **state) {
    (void)state;
    assert_false(same_lit("ord-1", 1764484200000, 1764484201234, NULL, 0));
    const char *plain[] = {"seat:12A", "slot 9:30", "x"};
    same_lit("a.b:c-d_e", 0, 1, plain, 3);
    const char *escapes[] = {"q\"uote", "back\\slash", "tab\there", "nl\nline",
                             "cr\r",    "bell\x07",    "\x1f\x01",  "\b\f",
                             "slash/",  "del\x7f"};
    same_lit("ord-2", 1764484200000, 1764484200000, escapes, 10);
    const char *utf8[] = {"caf\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x9a\x86",
                          "\xef\xbf\xbf", "\xf4\x8f\xbf\xbf"};
    same_lit("ord-3", 1, 2, utf8, 5);
    /* Not UTF-8: overlong, a surrogate, past U+10FFFF, a cut sequence, a lone
     * continuation byte. Refused by both, one at a time. */
    const char *bad[] = {
        "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "ab\xe2\x82",
        "\x80",     "\xff",         "\xe0\x80\xaf",     "\xf0\x80\x80\xaf"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *one[] = {"fine", bad[i]};
        assert_true(same_lit("ord-4", 1, 2, one, 2));
    }
}

/* Random holds: bytes drawn mostly from the ones that matter (quotes, controls, the
 * edges of UTF-8), so that valid and invalid sequences both come up often. */
static void test_random_cases_match_jansson(void **state) {
    (void)state;
    static const unsigned char pick[] = {'a',  'Z',  '0',  ' ',  '"',  '\\', '/',  '\n',
                                         '\t', 0x01, 0x1f, 0x7f, 0x80, 0xbf, 0xc0, 0xc2,
                                         0xdf, 0xe0, 0xed, 0xef, 0xf0, 0xf4, 0xf5, 0xff};
    srand(14);
    unsigned refused = 0;
    for (int c = 0; c < RANDOM_CASES; c++) {
        char buf[4][16];
        char *holds[4];
        size_t n = (size_t)(rand() % 5);
        for (size_t h = 0; h < n; h++) {
            size_t len = 1 + (size_t)(rand() % 12);
            for (size_t i = 0; i < len; i++) {
                buf[h][i] = rand() % 3 == 0 ? (char)(0x20 + rand() % 0x5f)
                                            : (char)pick[rand() % sizeof pick];
            }
            buf[h][len] = '\0';
            holds[h] = buf[h];
        }
        int64_t deadline = (int64_t)rand() * 1000 + rand() % 1000;
        char *want = reference("ord", deadline, deadline + 5, holds, n);
        refused += want == NULL;
        free(want);
        same("ord", deadline, deadline + 5, holds, n);
    }
    /* Both kinds came up: the comparison covered refusals and bodies alike. */
    assert_true(refused > RANDOM_CASES / 20);
    assert_true(refused < RANDOM_CASES - RANDOM_CASES / 20);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed_cases),
        cmocka_unit_test(test_random_cases_match_jansson),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

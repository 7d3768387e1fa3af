/* SPDX-License-Identifier: MIT
 * Libraries loaded on first use (src/dynlib.c): a library's table is filled, a missing
 * library or symbol is an error that names the SONAME and the Debian package, the first
 * outcome is kept, and libpq's own table loads by the SONAME the build compiled in. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "dynlib_int.h"
#include "pq_api_int.h"

#include <math.h>
#include <string.h>

#define M_SYMS(X, a) X(a, cos) X(a, ldexp)

static struct { M_SYMS(LAPSE__DYNSYM_FIELD, _) } m;

static const lapse__dynsym_t m_syms[] = {M_SYMS(LAPSE__DYNSYM_ENTRY, m)};

static void test_resolves_every_symbol(void **state) {
    (void)state;
    lapse__dynlib_t libm = LAPSE__DYNLIB_INIT("libm.so.6", m_syms);
    lapse_error_t err = {0};
    assert_int_equal(lapse__dynlib_load(&libm, LAPSE_ERR_IO, &err), LAPSE_OK);
    assert_non_null(m.cos);
    assert_true(m.cos(0.0) == 1.0);
    assert_true(m.ldexp(3.0, 4) == 48.0);
    /* Loaded once: a second call keeps the outcome and the table. */
    assert_int_equal(lapse__dynlib_load(&libm, LAPSE_ERR_IO, &err), LAPSE_OK);
    assert_true(m.ldexp(1.0, 10) == 1024.0);
}

static void test_missing_library_names_soname_and_package(void **state) {
    (void)state;
    void *slot = NULL;
    const lapse__dynsym_t syms[] = {{"anything", &slot}};
    lapse__dynlib_t plain = LAPSE__DYNLIB_INIT("liblapse-test-absent.so.7", syms);
    lapse_error_t err = {0};
    assert_int_equal(lapse__dynlib_load(&plain, LAPSE_ERR_STORE_OPEN, &err),
                     LAPSE_ERR_STORE_OPEN);
    assert_int_equal(err.code, LAPSE_ERR_STORE_OPEN);
    assert_non_null(strstr(err.text, "cannot load liblapse-test-absent.so.7 (Debian "
                                     "package liblapse-test-absent7)"));
    /* Debian puts a hyphen after a name that ends in a digit. */
    lapse__dynlib_t digit = LAPSE__DYNLIB_INIT("liblapse-absent2.so.1", syms);
    assert_int_equal(lapse__dynlib_load(&digit, LAPSE_ERR_IO, &err), LAPSE_ERR_IO);
    assert_non_null(strstr(err.text, "(Debian package liblapse-absent2-1)"));
    assert_null(slot);
    /* Not tried again: the same failure, the same words. */
    char first[sizeof err.text];
    memcpy(first, err.text, sizeof first);
    memset(&err, 0, sizeof err);
    assert_int_equal(lapse__dynlib_load(&digit, LAPSE_ERR_IO, &err), LAPSE_ERR_IO);
    assert_string_equal(err.text, first);
}

static void test_missing_symbol_fails_the_whole_table(void **state) {
    (void)state;
    void *cos_slot = NULL, *none_slot = NULL;
    const lapse__dynsym_t syms[] = {{"cos", &cos_slot},
                                    {"lapse_no_such_symbol", &none_slot}};
    lapse__dynlib_t lib = LAPSE__DYNLIB_INIT("libm.so.6", syms);
    lapse_error_t err = {0};
    assert_int_equal(lapse__dynlib_load(&lib, LAPSE_ERR_IO, &err), LAPSE_ERR_IO);
    assert_string_equal(
        err.text, "libm.so.6 has no symbol lapse_no_such_symbol (Debian package libm6)");
    assert_null(none_slot);
    assert_int_equal(lapse__dynlib_load(&lib, LAPSE_ERR_IO, NULL), LAPSE_ERR_IO);
}

static void test_libpq_loads_by_the_built_soname(void **state) {
    (void)state;
    lapse_error_t err = {0};
    assert_int_equal(lapse__pq_load(&err), LAPSE_OK);
    char *parse_error = NULL;
    PQconninfoOption *opts =
        lapse__pq.PQconninfoParse("host=db.example port=6432", &parse_error);
    assert_non_null(opts);
    bool saw_port = false;
    for (PQconninfoOption *o = opts; o->keyword != NULL; o++) {
        saw_port |= strcmp(o->keyword, "port") == 0 && o->val != NULL &&
                    strcmp(o->val, "6432") == 0;
    }
    lapse__pq.PQconninfoFree(opts);
    assert_true(saw_port);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resolves_every_symbol),
        cmocka_unit_test(test_missing_library_names_soname_and_package),
        cmocka_unit_test(test_missing_symbol_fails_the_whole_table),
        cmocka_unit_test(test_libpq_loads_by_the_built_soname),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

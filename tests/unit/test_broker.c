/* SPDX-License-Identifier: MIT
 * The publish sequence header that matches a basic.return to its publish: stamped once,
 * replacing any stale one a re-published message carries, and read back from any integer
 * kind. Pure: no broker. */
#include "broker_int.h"
#include "headers_int.h"

#include <lapse/message.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

static bool key_is(const amqp_table_entry_t *e, const char *key) {
    return e->key.len == strlen(key) && memcmp(e->key.bytes, key, e->key.len) == 0;
}

static void test_seq_is_added_to_no_headers(void **state) {
    (void)state;
    amqp_table_entry_t out[1];
    amqp_table_t t = lapse__headers_with_seq(NULL, 42, out);
    assert_int_equal(t.num_entries, 1);
    assert_true(key_is(&t.entries[0], LAPSE_HDR_PUBLISH_SEQ));
    assert_int_equal(t.entries[0].value.kind, AMQP_FIELD_KIND_I64);
    assert_int_equal(t.entries[0].value.value.i64, 42);
}

static void test_a_stale_seq_is_replaced_and_the_rest_kept_in_order(void **state) {
    (void)state;
    amqp_table_entry_t in[4] = {
        lapse__entry_i64(LAPSE_HDR_DEADLINE, 1796057253548),
        lapse__entry_i64(LAPSE_HDR_PUBLISH_SEQ, 7), /* from the publish that parked it */
        lapse__entry_str(LAPSE_HDR_DEADLINE_TEXT, "2026-11-30T16:47:33.548Z"),
        lapse__entry_str("x-death", "kept"),
    };
    amqp_table_t old = {.num_entries = 4, .entries = in};
    amqp_table_entry_t out[5];
    amqp_table_t t = lapse__headers_with_seq(&old, 1001, out);
    assert_int_equal(t.num_entries, 4);
    assert_true(key_is(&t.entries[0], LAPSE_HDR_DEADLINE));
    assert_true(key_is(&t.entries[1], LAPSE_HDR_DEADLINE_TEXT));
    assert_true(key_is(&t.entries[2], "x-death"));
    assert_true(key_is(&t.entries[3], LAPSE_HDR_PUBLISH_SEQ));
    assert_int_equal(t.entries[3].value.value.i64, 1001);

    amqp_basic_properties_t props = {._flags = AMQP_BASIC_HEADERS_FLAG, .headers = t};
    assert_int_equal(lapse__hdr_publish_seq(&props), 1001);
}

static void test_seq_is_read_from_any_integer_kind(void **state) {
    (void)state;
    amqp_table_entry_t e = lapse__entry_i64(LAPSE_HDR_PUBLISH_SEQ, 5);
    amqp_basic_properties_t props = {._flags = AMQP_BASIC_HEADERS_FLAG,
                                     .headers = {.num_entries = 1, .entries = &e}};
    assert_int_equal(lapse__hdr_publish_seq(&props), 5);
    e.value.kind = AMQP_FIELD_KIND_I32;
    e.value.value.i32 = 6;
    assert_int_equal(lapse__hdr_publish_seq(&props), 6);
    e.value.kind = AMQP_FIELD_KIND_U32;
    e.value.value.u32 = 7;
    assert_int_equal(lapse__hdr_publish_seq(&props), 7);
    e.value.kind = AMQP_FIELD_KIND_U64;
    e.value.value.u64 = 8;
    assert_int_equal(lapse__hdr_publish_seq(&props), 8);
}

static void test_no_usable_seq_reads_as_zero(void **state) {
    (void)state;
    amqp_basic_properties_t props = {._flags = 0};
    assert_int_equal(lapse__hdr_publish_seq(&props), 0);
    amqp_table_entry_t e = lapse__entry_str(LAPSE_HDR_PUBLISH_SEQ, "12");
    props._flags = AMQP_BASIC_HEADERS_FLAG;
    props.headers = (amqp_table_t){.num_entries = 1, .entries = &e};
    assert_int_equal(lapse__hdr_publish_seq(&props), 0);
    e = lapse__entry_i64(LAPSE_HDR_PUBLISH_SEQ, -3);
    assert_int_equal(lapse__hdr_publish_seq(&props), 0);
    e = lapse__entry_i64("x-lapse-publish-seq-not", 9);
    assert_int_equal(lapse__hdr_publish_seq(&props), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seq_is_added_to_no_headers),
        cmocka_unit_test(test_a_stale_seq_is_replaced_and_the_rest_kept_in_order),
        cmocka_unit_test(test_seq_is_read_from_any_integer_kind),
        cmocka_unit_test(test_no_usable_seq_reads_as_zero),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

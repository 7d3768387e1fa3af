/* SPDX-License-Identifier: MIT
 * One reader and one writer per header (src/headers.c): every AMQP integer kind another
 * client might write, absent headers, wrong kinds, the edges (negative, too large), and
 * each writer read back. Pure. */
#include "broker_int.h"
#include "headers_int.h"

#include <lapse/message.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

/* A value of every integer kind, as far as the kind can hold v. */
typedef struct kind_case {
    uint8_t kind;
    int64_t v;
} kind_case_t;

static const kind_case_t kinds[] = {
    {AMQP_FIELD_KIND_I8, 7},
    {AMQP_FIELD_KIND_U8, 200},
    {AMQP_FIELD_KIND_I16, 3000},
    {AMQP_FIELD_KIND_U16, 60000},
    {AMQP_FIELD_KIND_I32, 100000},
    {AMQP_FIELD_KIND_U32, 4000000000},
    {AMQP_FIELD_KIND_I64, 1LL << 40},
    {AMQP_FIELD_KIND_U64, 1LL << 41},
    {AMQP_FIELD_KIND_TIMESTAMP, 1796057253},
};

static amqp_field_value_t value_of(uint8_t kind, int64_t v) {
    amqp_field_value_t f = {.kind = kind};
    switch (kind) {
        case AMQP_FIELD_KIND_I8:
            f.value.i8 = (int8_t)v;
            break;
        case AMQP_FIELD_KIND_U8:
            f.value.u8 = (uint8_t)v;
            break;
        case AMQP_FIELD_KIND_I16:
            f.value.i16 = (int16_t)v;
            break;
        case AMQP_FIELD_KIND_U16:
            f.value.u16 = (uint16_t)v;
            break;
        case AMQP_FIELD_KIND_I32:
            f.value.i32 = (int32_t)v;
            break;
        case AMQP_FIELD_KIND_U32:
            f.value.u32 = (uint32_t)v;
            break;
        case AMQP_FIELD_KIND_I64:
            f.value.i64 = v;
            break;
        default:
            f.value.u64 = (uint64_t)v;
            break;
    }
    return f;
}

/* props with one header key = e (the entry lives in *e). */
static amqp_basic_properties_t one(amqp_table_entry_t *e, const char *key,
                                   amqp_field_value_t v) {
    e->key = amqp_cstring_bytes(key);
    e->value = v;
    return (amqp_basic_properties_t){._flags = AMQP_BASIC_HEADERS_FLAG,
                                     .headers = {.num_entries = 1, .entries = e}};
}

static void test_int_reads_every_integer_kind(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        amqp_table_entry_t e;
        amqp_basic_properties_t p =
            one(&e, LAPSE_HDR_PARKED_AT, value_of(kinds[i].kind, kinds[i].v));
        int64_t got = -1;
        assert_true(lapse__hdr_int(&p, LAPSE_HDR_PARKED_AT, &got));
        assert_int_equal(got, kinds[i].v);
        assert_int_equal(lapse__hdr_parked_at_ms(&p), kinds[i].v);
        p = one(&e, LAPSE_HDR_DEADLINE, value_of(kinds[i].kind, kinds[i].v));
        assert_int_equal(lapse__hdr_deadline_ms(&p), kinds[i].v);
        p = one(&e, LAPSE_HDR_PUBLISH_SEQ, value_of(kinds[i].kind, kinds[i].v));
        assert_int_equal(lapse__hdr_publish_seq(&p), (uint64_t)kinds[i].v);
    }
}

static void test_int_refuses_other_kinds_and_huge_u64(void **state) {
    (void)state;
    amqp_table_entry_t e;
    amqp_basic_properties_t p = one(&e, LAPSE_HDR_PARKED_AT, (amqp_field_value_t){0});
    e.value = (amqp_field_value_t){.kind = AMQP_FIELD_KIND_UTF8,
                                   .value.bytes = amqp_cstring_bytes("12")};
    int64_t got = 0;
    assert_false(lapse__hdr_int(&p, LAPSE_HDR_PARKED_AT, &got));
    assert_int_equal(lapse__hdr_parked_at_ms(&p), -1);
    e.value = (amqp_field_value_t){.kind = AMQP_FIELD_KIND_F64, .value.f64 = 3.0};
    assert_false(lapse__hdr_int(&p, LAPSE_HDR_PARKED_AT, &got));
    e.value = value_of(AMQP_FIELD_KIND_U64, 0);
    e.value.value.u64 = UINT64_MAX;
    assert_false(lapse__hdr_int(&p, LAPSE_HDR_PARKED_AT, &got));
    /* Absent: no headers at all, or another key. */
    amqp_basic_properties_t none = {._flags = 0};
    assert_false(lapse__hdr_int(&none, LAPSE_HDR_PARKED_AT, &got));
    assert_null(lapse__hdr_find(&none, LAPSE_HDR_PARKED_AT));
    p = one(&e, "x-lapse-parked-at-ms-not", value_of(AMQP_FIELD_KIND_I64, 5));
    assert_int_equal(lapse__hdr_parked_at_ms(&p), -1);
    assert_int_equal(lapse__hdr_deadline_ms(&none), -1);
    assert_int_equal(lapse__hdr_publish_seq(&none), 0);
}

/* The attempts header had two parsers that disagreed: one took i64, i32 and u8 only,
 * the other every integer kind. Now one reads them all, clamped. */
static void test_attempts_from_every_kind_clamped(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        amqp_table_entry_t e;
        amqp_basic_properties_t p =
            one(&e, LAPSE_HDR_ATTEMPTS, value_of(kinds[i].kind, kinds[i].v));
        int want = kinds[i].v > 1000000 ? 1000000 : (int)kinds[i].v;
        assert_int_equal(lapse__hdr_attempts(&p), want);
    }
    amqp_table_entry_t e;
    amqp_basic_properties_t p =
        one(&e, LAPSE_HDR_ATTEMPTS, value_of(AMQP_FIELD_KIND_I16, 3));
    assert_int_equal(lapse__hdr_attempts(&p), 3);
    p = one(&e, LAPSE_HDR_ATTEMPTS, value_of(AMQP_FIELD_KIND_I32, -4));
    assert_int_equal(lapse__hdr_attempts(&p), 0);
    p = one(&e, LAPSE_HDR_ATTEMPTS,
            (amqp_field_value_t){.kind = AMQP_FIELD_KIND_UTF8,
                                 .value.bytes = amqp_cstring_bytes("3")});
    assert_int_equal(lapse__hdr_attempts(&p), 0);
    amqp_basic_properties_t none = {._flags = 0};
    assert_int_equal(lapse__hdr_attempts(&none), 0);
}

static void test_publish_seq_zero_or_negative_reads_as_absent(void **state) {
    (void)state;
    amqp_table_entry_t e;
    amqp_basic_properties_t p =
        one(&e, LAPSE_HDR_PUBLISH_SEQ, value_of(AMQP_FIELD_KIND_I64, -3));
    assert_int_equal(lapse__hdr_publish_seq(&p), 0);
    p = one(&e, LAPSE_HDR_PUBLISH_SEQ, value_of(AMQP_FIELD_KIND_I8, 0));
    assert_int_equal(lapse__hdr_publish_seq(&p), 0);
}

/* x-death: an array of tables, each with a `time` (a timestamp, whole seconds). */
static void test_death_time_is_the_latest_entry(void **state) {
    (void)state;
    amqp_table_entry_t d1[2] = {
        {.key = amqp_cstring_bytes("queue"),
         .value = {.kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes("q")}},
        {.key = amqp_cstring_bytes("time"),
         .value = value_of(AMQP_FIELD_KIND_TIMESTAMP, 1796057250)}};
    amqp_table_entry_t d2[1] = {
        {.key = amqp_cstring_bytes("time"),
         .value = value_of(AMQP_FIELD_KIND_TIMESTAMP, 1796057253)}};
    amqp_field_value_t deaths[3] = {
        {.kind = AMQP_FIELD_KIND_TABLE, .value.table = {.num_entries = 2, .entries = d1}},
        {.kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes("junk")},
        {.kind = AMQP_FIELD_KIND_TABLE, .value.table = {.num_entries = 1, .entries = d2}},
    };
    amqp_table_entry_t e;
    amqp_basic_properties_t p =
        one(&e, "x-death",
            (amqp_field_value_t){.kind = AMQP_FIELD_KIND_ARRAY,
                                 .value.array = {.num_entries = 3, .entries = deaths}});
    assert_int_equal(lapse__hdr_death_time_ms(&p), 1796057253000LL);
    /* Any integer kind for the time is read the same. */
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        d2[0].value = value_of(kinds[i].kind, kinds[i].v);
        int64_t want =
            kinds[i].v * 1000 > 1796057250000LL ? kinds[i].v * 1000 : 1796057250000LL;
        assert_int_equal(lapse__hdr_death_time_ms(&p), want);
    }
    /* A time too large to be in ms is ignored. */
    d2[0].value = value_of(AMQP_FIELD_KIND_I64, INT64_MAX / 10);
    assert_int_equal(lapse__hdr_death_time_ms(&p), 1796057250000LL);
}

static void test_death_time_absent_or_malformed(void **state) {
    (void)state;
    amqp_basic_properties_t none = {._flags = 0};
    assert_int_equal(lapse__hdr_death_time_ms(&none), -1);
    amqp_table_entry_t e;
    amqp_basic_properties_t p = one(&e, "x-death", value_of(AMQP_FIELD_KIND_I64, 5));
    assert_int_equal(lapse__hdr_death_time_ms(&p), -1);
    amqp_field_value_t empty = {.kind = AMQP_FIELD_KIND_ARRAY};
    p = one(&e, "x-death", empty);
    assert_int_equal(lapse__hdr_death_time_ms(&p), -1);
}

static void test_reason_and_parking_keys(void **state) {
    (void)state;
    amqp_table_entry_t e;
    amqp_basic_properties_t p = one(
        &e, LAPSE_HDR_REASON,
        (amqp_field_value_t){.kind = AMQP_FIELD_KIND_BYTES,
                             .value.bytes = amqp_cstring_bytes("unknown order: o-1")});
    char buf[8];
    lapse__hdr_reason(&p, buf, sizeof buf);
    assert_string_equal(buf, "unknown"); /* cut to the buffer */
    char whole[64];
    lapse__hdr_reason(&p, whole, sizeof whole);
    assert_string_equal(whole, "unknown order: o-1");
    e.value = value_of(AMQP_FIELD_KIND_I32, 3);
    lapse__hdr_reason(&p, whole, sizeof whole);
    assert_string_equal(whole, "");
    assert_true(lapse__hdr_is_parking(amqp_cstring_bytes(LAPSE_HDR_REASON)));
    assert_true(lapse__hdr_is_parking(amqp_cstring_bytes(LAPSE_HDR_PARKED_AT)));
    assert_true(lapse__hdr_is_parking(amqp_cstring_bytes(LAPSE_HDR_ATTEMPTS)));
    assert_false(lapse__hdr_is_parking(amqp_cstring_bytes(LAPSE_HDR_DEADLINE)));
    assert_false(lapse__hdr_is_parking(amqp_cstring_bytes("x-death")));
}

/* Each writer's entry is read back by its reader. */
static void test_writers_round_trip_through_the_readers(void **state) {
    (void)state;
    amqp_table_entry_t e[6] = {
        lapse__hdr_attempts_entry(4),
        lapse__hdr_deadline_ms_entry(1796057253548LL),
        lapse__hdr_deadline_text_entry("2026-11-30T16:47:33.548Z"),
        lapse__hdr_reason_entry("ERR_MSG_FIELD: missing field"),
        lapse__hdr_parked_at_entry(1796057000000LL),
        lapse__hdr_publish_seq_entry(77),
    };
    amqp_basic_properties_t p = {._flags = AMQP_BASIC_HEADERS_FLAG,
                                 .headers = {.num_entries = 6, .entries = e}};
    assert_int_equal(lapse__hdr_attempts(&p), 4);
    assert_int_equal(lapse__hdr_deadline_ms(&p), 1796057253548LL);
    const amqp_field_value_t *text = lapse__hdr_find(&p, LAPSE_HDR_DEADLINE_TEXT);
    assert_non_null(text);
    assert_int_equal(text->value.bytes.len, strlen("2026-11-30T16:47:33.548Z"));
    char reason[64];
    lapse__hdr_reason(&p, reason, sizeof reason);
    assert_string_equal(reason, "ERR_MSG_FIELD: missing field");
    assert_int_equal(lapse__hdr_parked_at_ms(&p), 1796057000000LL);
    assert_int_equal(lapse__hdr_publish_seq(&p), 77);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int_reads_every_integer_kind),
        cmocka_unit_test(test_int_refuses_other_kinds_and_huge_u64),
        cmocka_unit_test(test_attempts_from_every_kind_clamped),
        cmocka_unit_test(test_publish_seq_zero_or_negative_reads_as_absent),
        cmocka_unit_test(test_death_time_is_the_latest_entry),
        cmocka_unit_test(test_death_time_absent_or_malformed),
        cmocka_unit_test(test_reason_and_parking_keys),
        cmocka_unit_test(test_writers_round_trip_through_the_readers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

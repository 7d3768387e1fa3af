/* SPDX-License-Identifier: MIT
 * One reader and one writer per header (see headers_int.h): before, the attempts header
 * had two parsers that disagreed on the integer kinds they took. */
#include "headers_int.h"

#include "broker_int.h"

#include <lapse/message.h>

#include <string.h>

static bool key_is(amqp_bytes_t key, const char *name) {
    size_t len = strlen(name);
    return key.len == len && memcmp(key.bytes, name, len) == 0;
}

const amqp_field_value_t *lapse__hdr_find(const amqp_basic_properties_t *props,
                                          const char *name) {
    if (!(props->_flags & AMQP_BASIC_HEADERS_FLAG)) {
        return NULL;
    }
    for (int i = 0; i < props->headers.num_entries; i++) {
        if (key_is(props->headers.entries[i].key, name)) {
            return &props->headers.entries[i].value;
        }
    }
    return NULL;
}

static bool value_int(const amqp_field_value_t *v, int64_t *out) {
    switch (v->kind) {
        case AMQP_FIELD_KIND_I8:
            *out = v->value.i8;
            return true;
        case AMQP_FIELD_KIND_U8:
            *out = v->value.u8;
            return true;
        case AMQP_FIELD_KIND_I16:
            *out = v->value.i16;
            return true;
        case AMQP_FIELD_KIND_U16:
            *out = v->value.u16;
            return true;
        case AMQP_FIELD_KIND_I32:
            *out = v->value.i32;
            return true;
        case AMQP_FIELD_KIND_U32:
            *out = v->value.u32;
            return true;
        case AMQP_FIELD_KIND_I64:
            *out = v->value.i64;
            return true;
        case AMQP_FIELD_KIND_U64:
        case AMQP_FIELD_KIND_TIMESTAMP:
            if (v->value.u64 > (uint64_t)INT64_MAX) {
                return false;
            }
            *out = (int64_t)v->value.u64;
            return true;
        default:
            return false;
    }
}

bool lapse__hdr_int(const amqp_basic_properties_t *props, const char *name,
                    int64_t *out) {
    const amqp_field_value_t *v = lapse__hdr_find(props, name);
    return v && value_int(v, out);
}

int lapse__hdr_attempts(const amqp_basic_properties_t *props) {
    int64_t v = 0;
    if (!lapse__hdr_int(props, LAPSE_HDR_ATTEMPTS, &v) || v < 0) {
        return 0;
    }
    return v > 1000000 ? 1000000 : (int)v;
}

int64_t lapse__hdr_death_time_ms(const amqp_basic_properties_t *props) {
    const amqp_field_value_t *h = lapse__hdr_find(props, "x-death");
    if (!h || h->kind != AMQP_FIELD_KIND_ARRAY) {
        return -1;
    }
    int64_t latest = -1;
    const amqp_array_t *deaths = &h->value.array;
    for (int j = 0; j < deaths->num_entries; j++) {
        if (deaths->entries[j].kind != AMQP_FIELD_KIND_TABLE) {
            continue;
        }
        const amqp_table_t *death = &deaths->entries[j].value.table;
        for (int k = 0; k < death->num_entries; k++) {
            const amqp_table_entry_t *f = &death->entries[k];
            int64_t s;
            /* RabbitMQ writes a timestamp; an integer of seconds is read the same. */
            if (key_is(f->key, "time") && value_int(&f->value, &s) && s >= 0 &&
                s < INT64_MAX / 1000 && s * 1000 > latest) {
                latest = s * 1000;
            }
        }
    }
    return latest;
}

uint64_t lapse__hdr_publish_seq(const amqp_basic_properties_t *props) {
    int64_t v = 0;
    return lapse__hdr_int(props, LAPSE_HDR_PUBLISH_SEQ, &v) && v > 0 ? (uint64_t)v : 0;
}

int64_t lapse__hdr_parked_at_ms(const amqp_basic_properties_t *props) {
    int64_t v = -1;
    return lapse__hdr_int(props, LAPSE_HDR_PARKED_AT, &v) ? v : -1;
}

int64_t lapse__hdr_deadline_ms(const amqp_basic_properties_t *props) {
    int64_t v = -1;
    return lapse__hdr_int(props, LAPSE_HDR_DEADLINE, &v) ? v : -1;
}

void lapse__hdr_reason(const amqp_basic_properties_t *props, char *buf, size_t cap) {
    if (cap == 0) {
        return;
    }
    buf[0] = '\0';
    const amqp_field_value_t *v = lapse__hdr_find(props, LAPSE_HDR_REASON);
    if (!v || (v->kind != AMQP_FIELD_KIND_UTF8 && v->kind != AMQP_FIELD_KIND_BYTES)) {
        return;
    }
    size_t n = v->value.bytes.len < cap - 1 ? v->value.bytes.len : cap - 1;
    memcpy(buf, v->value.bytes.bytes, n);
    buf[n] = '\0';
}

bool lapse__hdr_is_parking(amqp_bytes_t key) {
    return key_is(key, LAPSE_HDR_REASON) || key_is(key, LAPSE_HDR_PARKED_AT) ||
           key_is(key, LAPSE_HDR_ATTEMPTS);
}

amqp_table_entry_t lapse__hdr_attempts_entry(int attempts) {
    return lapse__entry_i64(LAPSE_HDR_ATTEMPTS, attempts);
}

amqp_table_entry_t lapse__hdr_deadline_ms_entry(int64_t deadline_ms) {
    return lapse__entry_i64(LAPSE_HDR_DEADLINE, deadline_ms);
}

amqp_table_entry_t lapse__hdr_deadline_text_entry(const char *text) {
    return lapse__entry_str(LAPSE_HDR_DEADLINE_TEXT, text);
}

amqp_table_entry_t lapse__hdr_reason_entry(const char *reason) {
    return lapse__entry_str(LAPSE_HDR_REASON, reason);
}

amqp_table_entry_t lapse__hdr_parked_at_entry(int64_t ms) {
    return lapse__entry_i64(LAPSE_HDR_PARKED_AT, ms);
}

amqp_table_entry_t lapse__hdr_publish_seq_entry(uint64_t seq) {
    return lapse__entry_i64(LAPSE_HDR_PUBLISH_SEQ,
                            seq > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)seq);
}

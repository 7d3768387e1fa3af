/* SPDX-License-Identifier: MIT
 * libFuzzer target for the `publish --batch` line parser and the duration and RFC 3339
 * parsers beneath it: no crash, no read past the line, every accepted value survives
 * format -> parse unchanged, and every line the plain reader decides gets the very
 * verdict, fields and error text jansson's reader gives it. */
#include "batch_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            __builtin_trap();                                                            \
        }                                                                                \
    } while (0)

/* The unit tests' clock (2026-11-30T07:00:00Z): lines are parsed as if published now. */
#define NOW INT64_C(1796022000000)

#define HOLDS_MAX 64
#define HOLD_MAX  256

static void check_duration_round_trip(int64_t ms) {
    char text[32];
    lapse_duration_format(ms, text, sizeof text);
    int64_t back = 0;
    CHECK(lapse_duration_parse(text, &back) == LAPSE_OK);
    CHECK(back == ms);
}

static void check_time_round_trip(int64_t ms) {
    char text[LAPSE_RFC3339_LEN];
    lapse_time_format_rfc3339(ms, text);
    CHECK(strlen(text) == LAPSE_RFC3339_LEN - 1);
    int64_t back = -1;
    CHECK(lapse_time_parse_rfc3339(text, &back) == LAPSE_OK);
    CHECK(back == ms);
}

/* The plain reader decides a line only as jansson's reader would. */
static void check_readers_agree(const char *line, size_t len) {
    lapse_batch_line_t a, b;
    lapse_error_t ea = {0}, eb = {0};
    lapse_status_t rc = LAPSE_ERR_NOMEM;
    if (!lapse__batch_line_parse_plain(line, len, NOW, &a, &ea, &rc)) {
        CHECK(rc == LAPSE_ERR_NOMEM && ea.text[0] == '\0' && a.priv_ == NULL);
        return;
    }
    lapse_status_t want = lapse__batch_line_parse_json(line, len, NOW, &b, &eb);
    CHECK(rc == want);
    CHECK(strcmp(ea.text, eb.text) == 0);
    CHECK(strcmp(a.order_id, b.order_id) == 0);
    CHECK(a.timeout_ms == b.timeout_ms && a.deadline_ms == b.deadline_ms);
    CHECK(a.n_holds == 0 && b.n_holds == 0 && a.priv_ == NULL);
    lapse_batch_line_clear(&a);
    lapse_batch_line_clear(&b);
}

static void fuzz_line(const char *line, size_t len) {
    if (len <= LAPSE_MSG_MAX_BODY) {
        check_readers_agree(line, len);
    }
    lapse_batch_line_t bl;
    lapse_error_t err = {0};
    lapse_status_t rc = lapse_batch_line_parse(line, len, NOW, &bl, &err);
    if (rc != LAPSE_OK) {
        CHECK(err.code == rc && err.text[0] != '\0');
        CHECK(bl.holds == NULL && bl.n_holds == 0 && bl.priv_ == NULL);
        CHECK(len <= LAPSE_MSG_MAX_BODY || rc == LAPSE_ERR_MSG_TOO_LARGE);
        lapse_batch_line_clear(&bl);
        return;
    }
    CHECK(len <= LAPSE_MSG_MAX_BODY);
    CHECK(lapse_order_id_is_valid(bl.order_id, strlen(bl.order_id)));
    if (bl.timeout_ms != 0) {
        CHECK(bl.timeout_ms > 0);
        check_duration_round_trip(bl.timeout_ms);
        CHECK(bl.deadline_ms == NOW + bl.timeout_ms);
    }
    /* Whichever way the deadline was given, it has to fit in an expiry message. */
    check_time_round_trip(bl.deadline_ms);
    lapse_expiry_msg_t msg = {
        .version = 1, .deadline_ms = bl.deadline_ms, .created_at_ms = NOW};
    memcpy(msg.order_id, bl.order_id, sizeof msg.order_id);
    char body[LAPSE_MSG_MAX_BODY + 1];
    CHECK(lapse_expiry_msg_encode(&msg, body, sizeof body, NULL) == LAPSE_OK);

    CHECK(bl.n_holds <= HOLDS_MAX);
    CHECK((bl.n_holds == 0) == (bl.holds == NULL));
    for (size_t i = 0; i < bl.n_holds; i++) {
        size_t hlen = strlen(bl.holds[i]);
        CHECK(hlen >= 1 && hlen <= HOLD_MAX);
    }
    lapse_batch_line_clear(&bl);
    CHECK(bl.holds == NULL && bl.priv_ == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* libFuzzer's buffer is exactly size bytes, so ASan catches a read past the line. */
    fuzz_line((const char *)data, size);

    /* The same bytes as a C string for the scalar parsers. */
    char *text = malloc(size + 1);
    if (text == NULL) {
        return 0;
    }
    memcpy(text, data, size);
    text[size] = '\0';
    int64_t ms = 0;
    if (lapse_duration_parse(text, &ms) == LAPSE_OK) {
        CHECK(ms > 0);
        check_duration_round_trip(ms);
    }
    if (lapse_time_parse_rfc3339(text, &ms) == LAPSE_OK) {
        check_time_round_trip(ms);
    }
    free(text);

    /* The first eight bytes as a raw value for the formatters. */
    if (size >= sizeof(int64_t)) {
        int64_t raw;
        memcpy(&raw, data, sizeof raw);
        char buf[32];
        lapse_duration_format(raw, buf, sizeof buf);
        CHECK(strlen(buf) < sizeof buf);
        if (raw > 0) {
            check_duration_round_trip(raw);
        }
        char stamp[LAPSE_RFC3339_LEN];
        lapse_time_format_rfc3339(raw, stamp);
        CHECK(lapse_time_parse_rfc3339(stamp, &ms) == LAPSE_OK);
    }
    return 0;
}

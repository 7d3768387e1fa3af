/* SPDX-License-Identifier: MIT
 * libFuzzer target for the expiry message decoder: every body either decodes to a value
 * that survives encode -> decode unchanged, or is refused with a reason and *out intact;
 * and the decoder's fast path for the canonical form agrees with its JSON path. */
#include "message_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A failed check is a crash libFuzzer saves and reports, in every build type. */
#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            __builtin_trap();                                                            \
        }                                                                                \
    } while (0)

static bool is_message_status(lapse_status_t rc) {
    switch (rc) {
        case LAPSE_ERR_MSG_JSON:
        case LAPSE_ERR_MSG_FIELD:
        case LAPSE_ERR_MSG_VERSION:
        case LAPSE_ERR_MSG_ORDER_ID:
        case LAPSE_ERR_MSG_TIME:
        case LAPSE_ERR_MSG_TOO_LARGE:
        case LAPSE_ERR_MSG_UTF8:
            return true;
        default:
            return false;
    }
}

static bool same_msg(const lapse_expiry_msg_t *a, const lapse_expiry_msg_t *b) {
    return a->version == b->version && strcmp(a->order_id, b->order_id) == 0 &&
           a->deadline_ms == b->deadline_ms && a->created_at_ms == b->created_at_ms;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lapse_expiry_msg_t msg;
    memset(&msg, 0x5A, sizeof msg);
    const lapse_expiry_msg_t untouched = msg;
    lapse_error_t err;
    lapse_status_t rc = lapse_expiry_msg_decode(data, size, &msg, &err);

    /* The fast path for the canonical form decides as the JSON path does: the same
     * verdict, reason and message. */
    lapse_expiry_msg_t slow;
    memset(&slow, 0x5A, sizeof slow);
    lapse_error_t slow_err;
    CHECK(lapse__expiry_msg_decode_json(data, size, &slow, &slow_err) == rc);
    CHECK(slow_err.code == err.code && strcmp(slow_err.text, err.text) == 0);
    CHECK(memcmp(&slow, &msg, sizeof msg) == 0);

    /* The verdict never depends on whether a reason was asked for. */
    lapse_expiry_msg_t quiet;
    CHECK(lapse_expiry_msg_decode(data, size, &quiet, NULL) == rc);
    CHECK(err.code == rc);

    if (rc != LAPSE_OK) {
        CHECK(is_message_status(rc));
        CHECK(err.text[0] != '\0');
        CHECK(memchr(err.text, '\0', sizeof err.text) != NULL);
        CHECK(memcmp(&msg, &untouched, sizeof msg) == 0);
        CHECK(size <= LAPSE_MSG_MAX_BODY || rc == LAPSE_ERR_MSG_TOO_LARGE);
        return 0;
    }

    CHECK(size <= LAPSE_MSG_MAX_BODY);
    CHECK(err.text[0] == '\0');
    CHECK(same_msg(&msg, &quiet));
    CHECK(msg.version == 1);
    CHECK(lapse_order_id_is_valid(msg.order_id, strlen(msg.order_id)));
    CHECK(msg.deadline_ms >= 0 && msg.created_at_ms >= 0);

    /* Anything accepted must be re-encodable, and the encoding must mean the same. */
    char body[LAPSE_MSG_MAX_BODY + 1];
    size_t len = 0;
    CHECK(lapse_expiry_msg_encode(&msg, body, sizeof body, &len) == LAPSE_OK);
    CHECK(len > 0 && len == strlen(body));
    lapse_expiry_msg_t again;
    CHECK(lapse_expiry_msg_decode(body, len, &again, &err) == LAPSE_OK);
    CHECK(same_msg(&msg, &again));

    /* The encoding is canonical: encoding the decoded encoding gives the same bytes. */
    char body2[LAPSE_MSG_MAX_BODY + 1];
    size_t len2 = 0;
    CHECK(lapse_expiry_msg_encode(&again, body2, sizeof body2, &len2) == LAPSE_OK);
    CHECK(len2 == len && memcmp(body, body2, len) == 0);

    /* One byte short of room is refused, never truncated. */
    CHECK(lapse_expiry_msg_encode(&msg, body2, len, &len2) == LAPSE_ERR_INVALID);
    CHECK(len2 == 0 && body2[0] == '\0');
    return 0;
}

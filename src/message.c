/* SPDX-License-Identifier: MIT
 * The expiry message codec: JSON body <-> lapse_expiry_msg_t, with a precise reason for
 * every refusal because that reason is what an operator reads on a parked message. */
#include "message_int.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

bool lapse_order_id_is_valid(const char *id, size_t len) {
    if (id == NULL || len == 0 || len > LAPSE_ORDER_ID_MAX) {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)id[i];
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                  (c >= '0' && c <= '9') || c == '.' || c == '_' || c == ':' || c == '-';
        if (!ok) {
            return false;
        }
    }
    return true;
}

/* Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF.
 * A NUL byte is valid UTF-8 but never valid JSON text, and would cut the body short for
 * any C string consumer downstream, so it is refused here too. Returns the offending
 * offset, or len when the whole body is fine. */
static size_t utf8_check(const unsigned char *s, size_t len, bool *is_nul) {
    size_t i = 0;
    *is_nul = false;
    while (i < len) {
        unsigned char c = s[i];
        if (c == 0) {
            *is_nul = true;
            return i;
        }
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) {
                lo = 0xA0; /* overlong */
            } else if (c == 0xED) {
                hi = 0x9F; /* UTF-16 surrogates */
            }
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) {
                lo = 0x90; /* overlong */
            } else if (c == 0xF4) {
                hi = 0x8F; /* above U+10FFFF */
            }
        } else {
            return i; /* continuation byte without a lead, C0/C1 overlong, or F5..FF */
        }
        if (len - i - 1 < need || s[i + 1] < lo || s[i + 1] > hi) {
            return i;
        }
        for (size_t k = 2; k <= need; k++) {
            if ((s[i + k] & 0xC0) != 0x80) {
                return i;
            }
        }
        i += need + 1;
    }
    return len;
}

static const char *json_type_name(const json_t *value) {
    switch (json_typeof(value)) {
        case JSON_OBJECT:
            return "an object";
        case JSON_ARRAY:
            return "an array";
        case JSON_STRING:
            return "a string";
        case JSON_INTEGER:
            return "an integer";
        case JSON_REAL:
            return "a number";
        case JSON_TRUE:
        case JSON_FALSE:
            return "a boolean";
        case JSON_NULL:
            return "null";
    }
    return "of an unknown type";
}

/* The string member `name`, or NULL with err set. */
static const json_t *get_string(const json_t *root, const char *name,
                                lapse_error_t *err) {
    const json_t *value = json_object_get(root, name);
    if (value == NULL) {
        lapse_error_set(err, LAPSE_ERR_MSG_FIELD, "missing field \"%s\"", name);
        return NULL;
    }
    if (!json_is_string(value)) {
        lapse_error_set(err, LAPSE_ERR_MSG_FIELD, "field \"%s\" is %s, not a string",
                        name, json_type_name(value));
        return NULL;
    }
    return value;
}

static lapse_status_t get_time(const json_t *root, const char *name, int64_t *out_ms,
                               lapse_error_t *err) {
    const json_t *value = get_string(root, name, err);
    if (value == NULL) {
        return LAPSE_ERR_MSG_FIELD;
    }
    if (lapse_time_parse_rfc3339(json_string_value(value), out_ms) != LAPSE_OK) {
        return lapse_error_set(err, LAPSE_ERR_MSG_TIME,
                               "field \"%s\" is not a valid RFC 3339 time", name);
    }
    return LAPSE_OK;
}

static lapse_status_t check_order_id(const char *id, size_t len, lapse_error_t *err) {
    if (len == 0) {
        return lapse_error_set(err, LAPSE_ERR_MSG_ORDER_ID, "order_id is empty");
    }
    if (len > LAPSE_ORDER_ID_MAX) {
        return lapse_error_set(err, LAPSE_ERR_MSG_ORDER_ID,
                               "order_id is %zu bytes, more than %d", len,
                               LAPSE_ORDER_ID_MAX);
    }
    if (!lapse_order_id_is_valid(id, len)) {
        return lapse_error_set(err, LAPSE_ERR_MSG_ORDER_ID,
                               "order_id contains a byte outside [A-Za-z0-9._:-]");
    }
    return LAPSE_OK;
}

static lapse_status_t decode_object(const json_t *root, lapse_expiry_msg_t *msg,
                                    lapse_error_t *err) {
    const json_t *v = json_object_get(root, "v");
    if (v == NULL) {
        return lapse_error_set(err, LAPSE_ERR_MSG_FIELD, "missing field \"v\"");
    }
    if (!json_is_integer(v)) {
        return lapse_error_set(err, LAPSE_ERR_MSG_FIELD,
                               "field \"v\" is %s, not an integer", json_type_name(v));
    }
    if (json_integer_value(v) != 1) {
        return lapse_error_set(err, LAPSE_ERR_MSG_VERSION,
                               "unsupported message version %" JSON_INTEGER_FORMAT
                               " (expected 1)",
                               json_integer_value(v));
    }
    msg->version = 1;

    const json_t *id = get_string(root, "order_id", err);
    if (id == NULL) {
        return LAPSE_ERR_MSG_FIELD;
    }
    size_t id_len = json_string_length(id);
    lapse_status_t rc = check_order_id(json_string_value(id), id_len, err);
    if (rc != LAPSE_OK) {
        return rc;
    }
    memcpy(msg->order_id, json_string_value(id), id_len);
    msg->order_id[id_len] = '\0';

    rc = get_time(root, "deadline", &msg->deadline_ms, err);
    if (rc != LAPSE_OK) {
        return rc;
    }
    return get_time(root, "created_at", &msg->created_at_ms, err);
}

/* Whether s (at most end) starts with the literal lit; past it in *s when it does. */
static bool take(const char **s, const char *end, const char *lit, size_t n) {
    if ((size_t)(end - *s) < n || memcmp(*s, lit, n) != 0) {
        return false;
    }
    *s += n;
    return true;
}

#define TAKE(s, end, lit) take(s, end, lit, sizeof(lit) - 1)

/* A string value of printable ASCII without quote or backslash, up to its closing
 * quote, into buf (NUL-terminated, shorter than cap); false for anything else. */
static bool take_plain(const char **s, const char *end, char *buf, size_t cap) {
    size_t n = 0;
    for (const char *p = *s; p < end; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"') {
            buf[n] = '\0';
            *s = p + 1;
            return n > 0;
        }
        if (c < 0x20 || c > 0x7e || c == '\\' || n + 1 >= cap) {
            return false;
        }
        buf[n++] = (char)c;
    }
    return false;
}

/* The one form lapse_expiry_msg_encode writes, read without jansson: exactly
 * {"v":1,"order_id":"ID","deadline":"TIME","created_at":"TIME"}, with a valid id, times
 * that parse and no escapes. Such a body is a JSON object of those four distinct
 * members, so jansson's reading of it gives the same message. Anything else (another
 * order or spacing, escapes, more members, a bad value) returns false, and the JSON
 * path decides: every refusal and its reason come from one place. */
static bool decode_canonical(const char *s, size_t len, lapse_expiry_msg_t *msg) {
    const char *end = s + len;
    char id[LAPSE_ORDER_ID_MAX + 1], deadline[LAPSE_RFC3339_LEN + 8],
        created[LAPSE_RFC3339_LEN + 8];
    if (!TAKE(&s, end, "{\"v\":1,\"order_id\":\"") ||
        !take_plain(&s, end, id, sizeof id) || !TAKE(&s, end, ",\"deadline\":\"") ||
        !take_plain(&s, end, deadline, sizeof deadline) ||
        !TAKE(&s, end, ",\"created_at\":\"") ||
        !take_plain(&s, end, created, sizeof created) || !TAKE(&s, end, "}") ||
        s != end) {
        return false;
    }
    memset(msg, 0, sizeof *msg);
    msg->version = 1;
    size_t id_len = strlen(id);
    if (!lapse_order_id_is_valid(id, id_len) ||
        lapse_time_parse_rfc3339(deadline, &msg->deadline_ms) != LAPSE_OK ||
        lapse_time_parse_rfc3339(created, &msg->created_at_ms) != LAPSE_OK) {
        return false;
    }
    memcpy(msg->order_id, id, id_len + 1);
    return true;
}

lapse_status_t lapse_expiry_msg_decode(const void *body, size_t len,
                                       lapse_expiry_msg_t *out, lapse_error_t *err) {
    lapse_expiry_msg_t msg;
    if (out != NULL && body != NULL && len <= LAPSE_MSG_MAX_BODY &&
        decode_canonical(body, len, &msg)) {
        lapse_error_clear(err);
        *out = msg;
        return LAPSE_OK;
    }
    return lapse__expiry_msg_decode_json(body, len, out, err);
}

lapse_status_t lapse__expiry_msg_decode_json(const void *body, size_t len,
                                             lapse_expiry_msg_t *out,
                                             lapse_error_t *err) {
    lapse_error_clear(err);
    if (out == NULL || (body == NULL && len > 0)) {
        return lapse_error_set(err, LAPSE_ERR_INVALID, "no body or no output");
    }
    /* Refuse before parsing so a hostile body costs nothing but this comparison. */
    if (len > LAPSE_MSG_MAX_BODY) {
        return lapse_error_set(err, LAPSE_ERR_MSG_TOO_LARGE,
                               "body is %zu bytes, more than %d", len,
                               LAPSE_MSG_MAX_BODY);
    }
    if (len == 0) {
        return lapse_error_set(err, LAPSE_ERR_MSG_JSON, "body is empty");
    }
    bool is_nul;
    size_t bad = utf8_check(body, len, &is_nul);
    if (bad < len) {
        if (is_nul) {
            return lapse_error_set(err, LAPSE_ERR_MSG_UTF8, "NUL byte at offset %zu",
                                   bad);
        }
        return lapse_error_set(err, LAPSE_ERR_MSG_UTF8, "invalid UTF-8 at offset %zu",
                               bad);
    }

    /* JSON_DECODE_ANY lets a scalar body parse, so the reason can name what it was. */
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (root == NULL) {
        return lapse_error_set(err, LAPSE_ERR_MSG_JSON, "not valid JSON: %s at offset %d",
                               jerr.text, jerr.position);
    }
    lapse_status_t rc;
    if (!json_is_object(root)) {
        rc = lapse_error_set(err, LAPSE_ERR_MSG_JSON, "body is %s, not a JSON object",
                             json_type_name(root));
    } else {
        /* Decode into a scratch value so *out is untouched on failure. */
        lapse_expiry_msg_t msg;
        memset(&msg, 0, sizeof msg);
        rc = decode_object(root, &msg, err);
        if (rc == LAPSE_OK) {
            *out = msg;
        }
    }
    json_decref(root);
    return rc;
}

lapse_status_t lapse_expiry_msg_encode(const lapse_expiry_msg_t *msg, char *buf,
                                       size_t cap, size_t *len) {
    if (len != NULL) {
        *len = 0;
    }
    if (buf != NULL && cap > 0) {
        buf[0] = '\0';
    }
    if (msg == NULL || buf == NULL) {
        return LAPSE_ERR_INVALID;
    }
    size_t id_len = strnlen(msg->order_id, sizeof msg->order_id);
    if (!lapse_order_id_is_valid(msg->order_id, id_len)) {
        return LAPSE_ERR_MSG_ORDER_ID;
    }
    /* The formatter clamps out-of-range times; a clamped deadline would be a different
     * deadline, so refuse anything that does not survive the round trip. */
    char deadline[LAPSE_RFC3339_LEN], created[LAPSE_RFC3339_LEN];
    int64_t check;
    lapse_time_format_rfc3339(msg->deadline_ms, deadline);
    if (lapse_time_parse_rfc3339(deadline, &check) != LAPSE_OK ||
        check != msg->deadline_ms) {
        return LAPSE_ERR_MSG_TIME;
    }
    lapse_time_format_rfc3339(msg->created_at_ms, created);
    if (lapse_time_parse_rfc3339(created, &check) != LAPSE_OK ||
        check != msg->created_at_ms) {
        return LAPSE_ERR_MSG_TIME;
    }
    /* Plain snprintf makes valid JSON here: neither the id nor the times can contain a
     * byte that needs escaping. Only version 1 is spoken, whatever msg->version says. */
    int n = snprintf(
        buf, cap,
        "{\"v\":1,\"order_id\":\"%s\",\"deadline\":\"%s\",\"created_at\":\"%s\"}",
        msg->order_id, deadline, created);
    if (n < 0 || (size_t)n >= cap) {
        if (cap > 0) {
            buf[0] = '\0';
        }
        return LAPSE_ERR_INVALID;
    }
    if (len != NULL) {
        *len = (size_t)n;
    }
    return LAPSE_OK;
}

/* SPDX-License-Identifier: MIT
 * Parser for one line of `lapse publish --batch` (pure, no I/O). The usual line, an
 * order id and a timeout or a deadline, is read by a plain reader that knows only that
 * shape; every other line goes to jansson. Both end in decide(), so a line gets the same
 * verdict whichever reads it (the fuzzer checks it: tests/fuzz/fuzz_batch.c). jansson
 * took 9.5k of a publisher's 48.7k instructions per order (issue 14). */
#include "batch_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define HOLD_MAX  256
#define HOLDS_MAX 64

static lapse_status_t fail(lapse_batch_line_t *out, json_t *root, lapse_status_t code,
                           lapse_error_t *err, const char *text) {
    json_decref(root);
    memset(out, 0, sizeof *out);
    return lapse_error_set(err, code, "%s", text);
}

/* What a line says once read: the order id (id_len bytes, not NUL-terminated), and
 * whether it has "timeout" / "deadline", each with its text, or NULL when the value is
 * not a string. Fills out on LAPSE_OK; else zeroes it and sets err. */
static lapse_status_t decide(lapse_batch_line_t *out, const char *id, size_t id_len,
                             bool has_timeout, const char *timeout, bool has_deadline,
                             const char *deadline, int64_t now_ms, lapse_error_t *err) {
    if (!lapse_order_id_is_valid(id, id_len)) {
        return fail(out, NULL, LAPSE_ERR_MSG_ORDER_ID, err,
                    "\"order_id\" must be 1-128 bytes of [A-Za-z0-9._:-]");
    }
    memcpy(out->order_id, id, id_len);
    out->order_id[id_len] = '\0';
    if (has_timeout && has_deadline) {
        return fail(out, NULL, LAPSE_ERR_MSG_FIELD, err,
                    "give one of \"timeout\" and \"deadline\", not both");
    }
    if (has_timeout) {
        if (timeout == NULL ||
            lapse_duration_parse(timeout, &out->timeout_ms) != LAPSE_OK) {
            return fail(out, NULL, LAPSE_ERR_CONFIG_DURATION, err,
                        "\"timeout\" must be a duration such as \"30m\"");
        }
        /* The deadline must be a time an expiry message can carry (up to year 9999);
         * check for overflow first, then that its spelling parses back to it. */
        char spelled[LAPSE_RFC3339_LEN];
        int64_t check;
        if (now_ms > INT64_MAX - out->timeout_ms) {
            return fail(out, NULL, LAPSE_ERR_CONFIG_DURATION, err,
                        "\"timeout\" puts the deadline past 9999-12-31");
        }
        out->deadline_ms = now_ms + out->timeout_ms;
        lapse_time_format_rfc3339(out->deadline_ms, spelled);
        if (lapse_time_parse_rfc3339(spelled, &check) != LAPSE_OK ||
            check != out->deadline_ms) {
            return fail(out, NULL, LAPSE_ERR_CONFIG_DURATION, err,
                        "\"timeout\" puts the deadline past 9999-12-31");
        }
    } else if (has_deadline &&
               (deadline == NULL ||
                lapse_time_parse_rfc3339(deadline, &out->deadline_ms) != LAPSE_OK)) {
        return fail(out, NULL, LAPSE_ERR_MSG_TIME, err,
                    "\"deadline\" must be an RFC 3339 time");
    }
    return LAPSE_OK;
}

lapse_status_t lapse__batch_line_parse_json(const char *line, size_t len, int64_t now_ms,
                                            lapse_batch_line_t *out, lapse_error_t *err) {
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root || !json_is_object(root)) {
        return fail(out, root, LAPSE_ERR_MSG_JSON, err,
                    root ? "not a JSON object" : jerr.text);
    }
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        if (strcmp(key, "order_id") != 0 && strcmp(key, "timeout") != 0 &&
            strcmp(key, "deadline") != 0 && strcmp(key, "holds") != 0) {
            lapse_status_t rc =
                lapse_error_set(err, LAPSE_ERR_MSG_FIELD, "unknown field \"%.40s\"", key);
            json_decref(root);
            return rc;
        }
    }
    json_t *id = json_object_get(root, "order_id");
    if (!json_is_string(id)) {
        return fail(out, root, LAPSE_ERR_MSG_FIELD, err,
                    "\"order_id\" missing or not a string");
    }
    json_t *timeout = json_object_get(root, "timeout");
    json_t *deadline = json_object_get(root, "deadline");
    lapse_status_t rc =
        decide(out, json_string_value(id), json_string_length(id), timeout != NULL,
               json_string_value(timeout), deadline != NULL, json_string_value(deadline),
               now_ms, err);
    if (rc != LAPSE_OK) {
        json_decref(root);
        return rc;
    }

    json_t *holds = json_object_get(root, "holds");
    if (holds) {
        if (!json_is_array(holds) || json_array_size(holds) > HOLDS_MAX) {
            return fail(out, root, LAPSE_ERR_MSG_FIELD, err,
                        "\"holds\" must be an array of at most 64 strings");
        }
        size_t n = json_array_size(holds);
        out->holds = n ? calloc(n, sizeof *out->holds) : NULL;
        if (n && !out->holds) {
            return fail(out, root, LAPSE_ERR_NOMEM, err, "out of memory");
        }
        for (size_t i = 0; i < n; i++) {
            json_t *h = json_array_get(holds, i);
            size_t hlen = json_is_string(h) ? json_string_length(h) : 0;
            if (hlen == 0 || hlen > HOLD_MAX || strlen(json_string_value(h)) != hlen) {
                free(out->holds);
                return fail(out, root, LAPSE_ERR_MSG_FIELD, err,
                            "each hold must be a string of 1-256 bytes");
            }
            out->holds[i] = json_string_value(h);
        }
        out->n_holds = n;
    }
    out->priv_ = root;
    return LAPSE_OK;
}

/* The plain reader's cursor. */
typedef struct plain {
    const char *p, *end;
} plain_t;

static void skip_ws(plain_t *r) {
    while (r->p < r->end &&
           (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) {
        r->p++;
    }
}

/* A string of printable ASCII without escapes, at the cursor (past its quotes after):
 * its first byte and length; false for anything else. */
static bool plain_string(plain_t *r, const char **s, size_t *n) {
    if (r->p == r->end || *r->p != '"') {
        return false;
    }
    const char *start = ++r->p;
    while (r->p < r->end && *r->p != '"') {
        unsigned char c = (unsigned char)*r->p;
        if (c < 0x20 || c > 0x7e || c == '\\') {
            return false;
        }
        r->p++;
    }
    if (r->p == r->end) {
        return false;
    }
    *s = start;
    *n = (size_t)(r->p - start);
    r->p++;
    return true;
}

/* A NUL-terminated copy of a plain value for the scalar parsers; NULL when it does not
 * fit (then the line is not plain: the general reader decides it). */
static const char *plain_copy(char *buf, size_t cap, const char *s, size_t n) {
    if (n >= cap) {
        return NULL;
    }
    memcpy(buf, s, n);
    buf[n] = '\0';
    return buf;
}

bool lapse__batch_line_parse_plain(const char *line, size_t len, int64_t now_ms,
                                   lapse_batch_line_t *out, lapse_error_t *err,
                                   lapse_status_t *rc) {
    memset(out, 0, sizeof *out);
    plain_t r = {.p = line, .end = line + len};
    const char *val[3] = {NULL, NULL, NULL}; /* order_id, timeout, deadline */
    size_t val_len[3] = {0, 0, 0};
    static const char *const keys[3] = {"order_id", "timeout", "deadline"};
    skip_ws(&r);
    if (r.p == r.end || *r.p++ != '{') {
        return false;
    }
    for (;;) {
        const char *key, *v;
        size_t key_len, v_len;
        skip_ws(&r);
        if (!plain_string(&r, &key, &key_len)) {
            return false;
        }
        int k = 0;
        while (k < 3 &&
               (strlen(keys[k]) != key_len || memcmp(keys[k], key, key_len) != 0)) {
            k++;
        }
        if (k == 3 || val[k] != NULL) {
            return false; /* another key, or one given twice */
        }
        skip_ws(&r);
        if (r.p == r.end || *r.p++ != ':') {
            return false;
        }
        skip_ws(&r);
        if (!plain_string(&r, &v, &v_len)) {
            return false;
        }
        val[k] = v;
        val_len[k] = v_len;
        skip_ws(&r);
        if (r.p == r.end) {
            return false;
        }
        char c = *r.p++;
        if (c == '}') {
            break;
        }
        if (c != ',') {
            return false;
        }
    }
    skip_ws(&r);
    if (r.p != r.end || val[0] == NULL) {
        return false;
    }
    /* Longer than any duration or RFC 3339 time either reader accepts: both refuse it. */
    char timeout[64], deadline[64];
    const char *t =
        val[1] ? plain_copy(timeout, sizeof timeout, val[1], val_len[1]) : NULL;
    const char *d =
        val[2] ? plain_copy(deadline, sizeof deadline, val[2], val_len[2]) : NULL;
    if ((val[1] && !t) || (val[2] && !d)) {
        return false;
    }
    *rc = decide(out, val[0], val_len[0], val[1] != NULL, t, val[2] != NULL, d, now_ms,
                 err);
    return true;
}

lapse_status_t lapse_batch_line_parse(const char *line, size_t len, int64_t now_ms,
                                      lapse_batch_line_t *out, lapse_error_t *err) {
    memset(out, 0, sizeof *out);
    if (len > LAPSE_MSG_MAX_BODY) {
        return lapse_error_set(err, LAPSE_ERR_MSG_TOO_LARGE, "line longer than %d bytes",
                               LAPSE_MSG_MAX_BODY);
    }
    lapse_status_t rc;
    if (lapse__batch_line_parse_plain(line, len, now_ms, out, err, &rc)) {
        return rc;
    }
    return lapse__batch_line_parse_json(line, len, now_ms, out, err);
}

void lapse_batch_line_clear(lapse_batch_line_t *line) {
    if (!line) {
        return;
    }
    free(line->holds);
    json_decref(line->priv_);
    memset(line, 0, sizeof *line);
}

/* SPDX-License-Identifier: MIT
 * Parser for one line of `lapse publish --batch` (pure, no I/O). */
#include <lapse/batch.h>

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

lapse_status_t lapse_batch_line_parse(const char *line, size_t len, int64_t now_ms,
                                      lapse_batch_line_t *out, lapse_error_t *err) {
    memset(out, 0, sizeof *out);
    if (len > LAPSE_MSG_MAX_BODY) {
        return lapse_error_set(err, LAPSE_ERR_MSG_TOO_LARGE, "line longer than %d bytes",
                               LAPSE_MSG_MAX_BODY);
    }
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
    if (!lapse_order_id_is_valid(json_string_value(id), json_string_length(id))) {
        return fail(out, root, LAPSE_ERR_MSG_ORDER_ID, err,
                    "\"order_id\" must be 1-128 bytes of [A-Za-z0-9._:-]");
    }
    memcpy(out->order_id, json_string_value(id), json_string_length(id) + 1);

    json_t *timeout = json_object_get(root, "timeout");
    json_t *deadline = json_object_get(root, "deadline");
    if (timeout != NULL && deadline != NULL) {
        return fail(out, root, LAPSE_ERR_MSG_FIELD, err,
                    "give one of \"timeout\" and \"deadline\", not both");
    }
    if (timeout) {
        if (!json_is_string(timeout) ||
            lapse_duration_parse(json_string_value(timeout), &out->timeout_ms) !=
                LAPSE_OK) {
            return fail(out, root, LAPSE_ERR_CONFIG_DURATION, err,
                        "\"timeout\" must be a duration such as \"30m\"");
        }
        /* The deadline must be a time an expiry message can carry (up to year 9999);
         * check for overflow first, then that its spelling parses back to it. */
        char spelled[LAPSE_RFC3339_LEN];
        int64_t check;
        if (now_ms > INT64_MAX - out->timeout_ms) {
            return fail(out, root, LAPSE_ERR_CONFIG_DURATION, err,
                        "\"timeout\" puts the deadline past 9999-12-31");
        }
        out->deadline_ms = now_ms + out->timeout_ms;
        lapse_time_format_rfc3339(out->deadline_ms, spelled);
        if (lapse_time_parse_rfc3339(spelled, &check) != LAPSE_OK ||
            check != out->deadline_ms) {
            return fail(out, root, LAPSE_ERR_CONFIG_DURATION, err,
                        "\"timeout\" puts the deadline past 9999-12-31");
        }
    } else if (deadline != NULL &&
               (!json_is_string(deadline) ||
                lapse_time_parse_rfc3339(json_string_value(deadline),
                                         &out->deadline_ms) != LAPSE_OK)) {
        return fail(out, root, LAPSE_ERR_MSG_TIME, err,
                    "\"deadline\" must be an RFC 3339 time");
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

void lapse_batch_line_clear(lapse_batch_line_t *line) {
    if (!line) {
        return;
    }
    free(line->holds);
    json_decref(line->priv_);
    memset(line, 0, sizeof *line);
}

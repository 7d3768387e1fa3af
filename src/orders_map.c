/* SPDX-License-Identifier: MIT
 * The orders map (--orders-map): its JSON read and checked, one clear line per problem.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include <lapse/message.h>

#include "orders_map_int.h"

#define MAP_FILE_MAX (1024 * 1024)

#define MAP_ERR(err, ...) lapse_error_set((err), LAPSE_ERR_CONFIG_MAP, __VA_ARGS__)

/* A non-empty string of at most max bytes, copied into out. */
static lapse_status_t get_text(json_t *root, const char *key, bool required, char *out,
                               size_t max, lapse_error_t *err) {
    json_t *v = json_object_get(root, key);
    out[0] = '\0';
    if (v == NULL) {
        return required ? MAP_ERR(err, "orders map: \"%s\" is missing", key) : LAPSE_OK;
    }
    if (!json_is_string(v) || json_string_length(v) == 0) {
        return MAP_ERR(err, "orders map: \"%s\" must be a non-empty string", key);
    }
    if (json_string_length(v) > max ||
        strlen(json_string_value(v)) != json_string_length(v)) {
        return lapse_error_set(
            err, LAPSE_ERR_CONFIG_MAP,
            "orders map: \"%s\" is longer than %zu bytes or holds a NUL", key, max);
    }
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return LAPSE_OK;
}

/* "table" or "schema.table"; the parts are unquoted names. */
static lapse_status_t get_table(json_t *root, lapse__orders_map_t *out,
                                lapse_error_t *err) {
    char full[2 * LAPSE__MAP_NAME_MAX + 2];
    lapse_status_t rc = get_text(root, "table", true, full, sizeof full - 1, err);
    if (rc != LAPSE_OK) {
        return rc;
    }
    char *dot = strchr(full, '.');
    const char *table = full;
    if (dot != NULL) {
        *dot = '\0';
        table = dot + 1;
        if (strchr(table, '.') != NULL || full[0] == '\0' ||
            strlen(full) > LAPSE__MAP_NAME_MAX) {
            return MAP_ERR(err, "orders map: \"%s\" must be TABLE or SCHEMA.TABLE",
                           "table");
        }
        memcpy(out->table_schema, full, strlen(full) + 1);
    }
    if (table[0] == '\0' || strlen(table) > LAPSE__MAP_NAME_MAX) {
        return MAP_ERR(err, "orders map: \"%s\" must be TABLE or SCHEMA.TABLE", "table");
    }
    memcpy(out->table, table, strlen(table) + 1);
    return LAPSE_OK;
}

static lapse_status_t get_pending(json_t *root, lapse__orders_map_t *out,
                                  lapse_error_t *err) {
    json_t *v = json_object_get(root, "pending");
    if (v == NULL) {
        return MAP_ERR(err,
                       "orders map: \"%s\" is missing (the status values of an order "
                       "waiting for payment)",
                       "pending");
    }
    json_t *list = v;
    if (json_is_string(v)) {
        list = json_pack("[O]", v);
    } else if (!json_is_array(v) || json_array_size(v) == 0) {
        return MAP_ERR(err,
                       "orders map: \"%s\" must be a status value or a non-empty array "
                       "of them",
                       "pending");
    }
    lapse_status_t rc = LAPSE_OK;
    if (json_array_size(list) > LAPSE__MAP_PENDING_MAX) {
        rc = lapse_error_set(err, LAPSE_ERR_CONFIG_MAP,
                             "orders map: \"pending\" has more than %d values",
                             LAPSE__MAP_PENDING_MAX);
    }
    for (size_t i = 0; rc == LAPSE_OK && i < json_array_size(list); i++) {
        json_t *wrap = json_pack("{sO}", "pending", json_array_get(list, i));
        rc = get_text(wrap, "pending", true, out->pending[i], LAPSE__MAP_VALUE_MAX, err);
        json_decref(wrap);
        out->n_pending += rc == LAPSE_OK;
    }
    if (list != v) {
        json_decref(list);
    }
    return rc;
}

static lapse_status_t get_deadline(json_t *root, lapse__orders_map_t *out,
                                   lapse_error_t *err) {
    json_t *v = json_object_get(root, "deadline");
    if (v == NULL) {
        return MAP_ERR(err,
                       "orders map: \"%s\" is missing (a timestamptz column, or "
                       "{\"column\": .., \"window\": ..})",
                       "deadline");
    }
    if (json_is_string(v)) {
        return get_text(root, "deadline", true, out->deadline, LAPSE__MAP_NAME_MAX, err);
    }
    if (!json_is_object(v)) {
        return MAP_ERR(err,
                       "orders map: \"%s\" must be a column name or {\"column\": .., "
                       "\"window\": ..}",
                       "deadline");
    }
    const char *key = NULL;
    json_t *value = NULL;
    json_object_foreach(v, key, value) {
        if (strcmp(key, "column") != 0 && strcmp(key, "window") != 0) {
            return MAP_ERR(err, "orders map: unknown key \"deadline.%s\"", key);
        }
    }
    if (!json_is_string(json_object_get(v, "column")) ||
        !json_is_string(json_object_get(v, "window"))) {
        return MAP_ERR(err, "orders map: \"deadline\" needs a \"column\" and a "
                            "\"window\" (strings)");
    }
    char window[32];
    lapse_status_t rc =
        get_text(v, "column", true, out->deadline, LAPSE__MAP_NAME_MAX, err);
    if (rc == LAPSE_OK) {
        rc = get_text(v, "window", true, window, sizeof window - 1, err);
    }
    if (rc == LAPSE_OK && (lapse_duration_parse(window, &out->window_ms) != LAPSE_OK ||
                           out->window_ms <= 0)) {
        rc =
            MAP_ERR(err,
                    "orders map: \"deadline.window\" must be a duration such as \"30m\", "
                    "not \"%s\"",
                    window);
    }
    return rc;
}

static lapse_status_t get_on_cancel(json_t *root, lapse__orders_map_t *out,
                                    lapse_error_t *err) {
    json_t *v = json_object_get(root, "on_cancel");
    if (v == NULL) {
        return LAPSE_OK;
    }
    if (!json_is_array(v)) {
        return MAP_ERR(err, "orders map: \"%s\" must be an array of SQL statements",
                       "on_cancel");
    }
    if (json_array_size(v) > LAPSE__MAP_ON_CANCEL_MAX) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_MAP,
                               "orders map: \"on_cancel\" has more than %d statements",
                               LAPSE__MAP_ON_CANCEL_MAX);
    }
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *s = json_array_get(v, i);
        if (!json_is_string(s) || json_string_length(s) == 0 ||
            strlen(json_string_value(s)) != json_string_length(s)) {
            return MAP_ERR(
                err, "orders map: every \"%s\" statement must be a non-empty string",
                "on_cancel");
        }
        if ((out->on_cancel[i] = strdup(json_string_value(s))) == NULL) {
            return lapse_error_set(err, LAPSE_ERR_NOMEM, "orders map");
        }
        out->n_on_cancel++;
    }
    return LAPSE_OK;
}

static const char *const KEYS[] = {"table",        "id",       "status",
                                   "pending",      "paid",     "cancelled",
                                   "cancelled_at", "deadline", "on_cancel"};

static bool known_key(const char *key) {
    for (size_t i = 0; i < sizeof KEYS / sizeof KEYS[0]; i++) {
        if (strcmp(KEYS[i], key) == 0) {
            return true;
        }
    }
    return false;
}

lapse_status_t lapse__orders_map_parse(const char *text, size_t len,
                                       lapse__orders_map_t *out, lapse_error_t *err) {
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_MAP,
                               "orders map: not JSON: %s (line %d)", jerr.text,
                               jerr.line);
    }
    lapse_status_t rc = LAPSE_OK;
    if (!json_is_object(root)) {
        rc = MAP_ERR(err, "orders map: %s", "the map must be a JSON object");
    }
    const char *key = NULL;
    json_t *value = NULL;
    json_object_foreach(root, key, value) {
        if (rc == LAPSE_OK && !known_key(key)) {
            rc = MAP_ERR(err, "orders map: unknown key \"%s\"", key);
        }
    }
    if (rc == LAPSE_OK) {
        rc = get_table(root, out, err);
    }
    if (rc == LAPSE_OK) {
        rc = get_text(root, "id", true, out->id, LAPSE__MAP_NAME_MAX, err);
    }
    if (rc == LAPSE_OK) {
        rc = get_text(root, "status", true, out->status, LAPSE__MAP_NAME_MAX, err);
    }
    if (rc == LAPSE_OK) {
        rc = get_pending(root, out, err);
    }
    if (rc == LAPSE_OK) {
        rc = get_text(root, "paid", true, out->paid, LAPSE__MAP_VALUE_MAX, err);
    }
    if (rc == LAPSE_OK) {
        rc = get_text(root, "cancelled", true, out->cancelled, LAPSE__MAP_VALUE_MAX, err);
    }
    if (rc == LAPSE_OK) {
        rc = get_text(root, "cancelled_at", false, out->cancelled_at, LAPSE__MAP_NAME_MAX,
                      err);
    }
    if (rc == LAPSE_OK) {
        rc = get_deadline(root, out, err);
    }
    if (rc == LAPSE_OK) {
        rc = get_on_cancel(root, out, err);
    }
    for (size_t i = 0; rc == LAPSE_OK && i < out->n_pending; i++) {
        if (strcmp(out->pending[i], out->paid) == 0 ||
            strcmp(out->pending[i], out->cancelled) == 0) {
            rc = MAP_ERR(err,
                         "orders map: the pending value \"%s\" is also paid or cancelled",
                         out->pending[i]);
        }
    }
    if (rc == LAPSE_OK && strcmp(out->paid, out->cancelled) == 0) {
        rc = MAP_ERR(err, "orders map: paid and cancelled are the same value \"%s\"",
                     out->paid);
    }
    json_decref(root);
    return rc;
}

lapse_status_t lapse__orders_map_load(const char *path, lapse__orders_map_t *out,
                                      lapse_error_t *err) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_MAP, "orders map %s: %s", path,
                               strerror(errno));
    }
    char *text = malloc(MAP_FILE_MAX + 1);
    size_t len = text != NULL ? fread(text, 1, MAP_FILE_MAX + 1, f) : 0;
    bool failed = text == NULL || ferror(f);
    fclose(f);
    lapse_status_t rc;
    if (failed) {
        rc = lapse_error_set(err, LAPSE_ERR_CONFIG_MAP, "orders map %s: cannot read it",
                             path);
    } else if (len > MAP_FILE_MAX) {
        rc = lapse_error_set(err, LAPSE_ERR_CONFIG_MAP,
                             "orders map %s: larger than 1 MiB", path);
    } else {
        rc = lapse__orders_map_parse(text, len, out, err);
    }
    free(text);
    return rc;
}

void lapse__orders_map_free(lapse__orders_map_t *map) {
    if (map == NULL) {
        return;
    }
    for (size_t i = 0; i < map->n_on_cancel; i++) {
        free(map->on_cancel[i]);
    }
    memset(map, 0, sizeof *map);
}

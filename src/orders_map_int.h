/* SPDX-License-Identifier: MIT
 * Internal: the shop's own orders table, as described by an orders map (--orders-map,
 * DESIGN.md "The shop's own orders table"). This file reads and checks the map's JSON;
 * the store checks it against the live schema. */
#ifndef LAPSE_ORDERS_MAP_INT_H
#define LAPSE_ORDERS_MAP_INT_H

#include <lapse/lapse.h>

#include <stddef.h>
#include <stdint.h>

#define LAPSE__MAP_NAME_MAX      63 /* PostgreSQL's NAMEDATALEN - 1 */
#define LAPSE__MAP_VALUE_MAX     255
#define LAPSE__MAP_PENDING_MAX   16
#define LAPSE__MAP_ON_CANCEL_MAX 16

/**
 * A parsed orders map. Names are as written in the map (unquoted; the store quotes them);
 * table_schema is "" when the table was not schema-qualified. The on_cancel statements
 * are owned by the map (lapse__orders_map_free).
 */
typedef struct lapse__orders_map {
    char table_schema[LAPSE__MAP_NAME_MAX + 1];
    char table[LAPSE__MAP_NAME_MAX + 1];
    char id[LAPSE__MAP_NAME_MAX + 1];
    char status[LAPSE__MAP_NAME_MAX + 1];
    char pending[LAPSE__MAP_PENDING_MAX][LAPSE__MAP_VALUE_MAX + 1];
    size_t n_pending;
    char paid[LAPSE__MAP_VALUE_MAX + 1];
    char cancelled[LAPSE__MAP_VALUE_MAX + 1];
    char cancelled_at[LAPSE__MAP_NAME_MAX + 1]; /* "" when not given */
    char deadline[LAPSE__MAP_NAME_MAX + 1];     /* the deadline column, or the column the
                                                   window counts from */
    int64_t window_ms;                          /* 0: deadline is the deadline itself */
    char *on_cancel[LAPSE__MAP_ON_CANCEL_MAX];
    size_t n_on_cancel;
} lapse__orders_map_t;

/**
 * Parse the map's JSON text (len bytes). Every problem is one line in err naming it
 * (LAPSE_ERR_CONFIG_MAP): not JSON, an unknown or missing key, a value of the wrong kind,
 * an empty value, a name longer than 63 bytes, a pending value equal to paid or
 * cancelled, more than 16 pending values or on_cancel statements.
 * @param out filled on LAPSE_OK; free it with lapse__orders_map_free (also on failure).
 */
lapse_status_t lapse__orders_map_parse(const char *text, size_t len,
                                       lapse__orders_map_t *out, lapse_error_t *err);

/** Read and parse the file at path (at most 1 MiB). */
lapse_status_t lapse__orders_map_load(const char *path, lapse__orders_map_t *out,
                                      lapse_error_t *err);

/** Free the statements; the struct is left empty. Accepts NULL. */
void lapse__orders_map_free(lapse__orders_map_t *map);

#endif

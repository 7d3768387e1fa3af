/* SPDX-License-Identifier: MIT
 * Internal: the PostgreSQL store on the shop's own orders table (--orders-map). The map
 * is checked against the live schema here, and the statements of store_pg_sql.h get
 * their placeholders filled from it; store_pg.c runs them. */
#ifndef LAPSE_STORE_PG_MAP_INT_H
#define LAPSE_STORE_PG_MAP_INT_H

#include <libpq-fe.h>

#include "orders_map_int.h"

/* The bound values every mapped statement gets after its own parameters, in this order.
 */
enum {
    LAPSE__MAP_V_PENDING = 0, /* text[]: the pending status values */
    LAPSE__MAP_V_PAID,        /* text */
    LAPSE__MAP_V_CANCELLED,   /* text */
    LAPSE__MAP_V_WINDOW,      /* bigint: the window in ms, 0 for a deadline column */
    LAPSE__MAP_V_CURSOR,      /* timestamptz: an exact keyset cursor, or NULL */
    LAPSE__MAP_N_VALUES
};

/** A map checked against the live schema. Owned by whoever opened it. */
typedef struct lapse__pg_map {
    lapse__orders_map_t map;
    char table[300];         /* "schema"."table" AS o */
    char table_name[260];    /* schema.table, for messages */
    char id[160];            /* o."id" */
    char status[160];        /* o."status" */
    char status_bare[140];   /* "status" */
    char status_type[140];   /* its type, for casts */
    char id_type[140];       /* the id's type, for casts */
    char deadline[160];      /* o."pay_deadline" */
    char set_cancelled[160]; /* , "cancelled_at" = now()  or "" */
    char cancelled_ms[220];  /* that column in ms, or NULL::bigint */
    Oid id_oid;
    bool id_integer;       /* ids must be decimal digits */
    char *pending_literal; /* the text[] value of {PENDING} */
    char window_text[32];
    const char *values[LAPSE__MAP_N_VALUES]; /* into the fields above; CURSOR NULL */
    Oid value_types[LAPSE__MAP_N_VALUES];
    char warning[1024]; /* "" or one line for the operator (a missing index) */
} lapse__pg_map_t;

/**
 * Load the map at path and check it against the database behind conn: the table
 * exists, the columns exist with fitting types, the status values fit an enum status,
 * and every on_cancel statement prepares. Missing index: a warning in out->warning.
 * @return new map (lapse__pg_map_free), or NULL with err set (LAPSE_ERR_CONFIG_MAP, one
 *         line naming the problem; a store error when the database could not answer).
 */
lapse__pg_map_t *lapse__pg_map_open(PGconn *conn, const char *path, lapse_status_t *rc,
                                    lapse_error_t *err);

void lapse__pg_map_free(lapse__pg_map_t *m);

/**
 * Fill tmpl's placeholders: "@." stays (store_pg.c fills it), names come from the map,
 * value placeholders become $<n_own+1>.. in LAPSE__MAP_V_* order.
 * @return new string (free()), NULL when out of memory.
 */
char *lapse__pg_map_expand(const lapse__pg_map_t *m, const char *tmpl, int n_own);

/** Whether id can be an id of the table at all (an integer id needs digits only). */
bool lapse__pg_map_id_fits(const lapse__pg_map_t *m, const char *id);

/**
 * Run the on_cancel statements for order_id, in the caller's transaction.
 * @return LAPSE_OK, or LAPSE_ERR_STORE_SQL (retriable failures as LAPSE_ERR_STORE_BUSY)
 *         with the statement's number and the database's message in err.
 */
lapse_status_t lapse__pg_map_on_cancel(PGconn *conn, const lapse__pg_map_t *m,
                                       const char *order_id, lapse_error_t *err);

#endif

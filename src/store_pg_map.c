/* SPDX-License-Identifier: MIT
 * The PostgreSQL store on the shop's own orders table: the map checked against the live
 * schema, the statements' placeholders filled from it, the on_cancel statements run.
 * Names are quoted with PQescapeIdentifier; values are bound parameters; nothing here is
 * built from what a message carries. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_pg_map_int.h"

#include "pq_api_int.h"

#define OID_TIMESTAMPTZ 1184
#define OID_TEXT        25
#define OID_TEXT_ARRAY  1009
#define OID_INT8        20
#define OID_INT2        21
#define OID_INT4        23

/* Copies the quoted identifier of name into out ("" on failure: out of memory). */
static bool quote(PGconn *conn, const char *name, char *out, size_t cap) {
    char *q = lapse__pq.PQescapeIdentifier(conn, name, strlen(name));
    bool ok = q != NULL && strlen(q) < cap;
    snprintf(out, cap, "%s", ok ? q : "");
    lapse__pq.PQfreemem(q);
    return ok;
}

/* A text[] literal of the pending values (every element quoted, " and \ escaped). */
static char *pending_literal(const lapse__orders_map_t *map) {
    size_t cap = 3;
    for (size_t i = 0; i < map->n_pending; i++) {
        cap += 2 * strlen(map->pending[i]) + 3;
    }
    char *lit = malloc(cap);
    if (lit == NULL) {
        return NULL;
    }
    char *p = lit;
    *p++ = '{';
    for (size_t i = 0; i < map->n_pending; i++) {
        if (i > 0) {
            *p++ = ',';
        }
        *p++ = '"';
        for (const char *c = map->pending[i]; *c != '\0'; c++) {
            if (*c == '"' || *c == '\\') {
                *p++ = '\\';
            }
            *p++ = *c;
        }
        *p++ = '"';
    }
    *p++ = '}';
    *p = '\0';
    return lit;
}

/* One column of the table, as the catalog has it. */
typedef struct column {
    Oid type;
    char type_name[128];
    char typtype;  /* 'e': an enum */
    char category; /* 'S' string, 'N' numeric, ... */
    int attnum;
    bool found;
} column_t;

static lapse_status_t find_column(PGconn *conn, const char *table_oid, const char *name,
                                  column_t *out, lapse_error_t *err) {
    const char *params[2] = {table_oid, name};
    PGresult *res = lapse__pq.PQexecParams(
        conn,
        "SELECT a.atttypid, format_type(a.atttypid, a.atttypmod), t.typtype, "
        "t.typcategory,"
        " a.attnum FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t"
        " ON t.oid = a.atttypid WHERE a.attrelid = $1::oid AND a.attname = $2"
        " AND a.attnum > 0 AND NOT a.attisdropped",
        2, NULL, params, NULL, NULL, 0);
    lapse_status_t rc = LAPSE_OK;
    memset(out, 0, sizeof *out);
    if (lapse__pq.PQresultStatus(res) != PGRES_TUPLES_OK) {
        rc = lapse_error_set(err, LAPSE_ERR_STORE_OPEN, "orders map: reading columns: %s",
                             lapse__pq.PQresultErrorMessage(res));
    } else if (lapse__pq.PQntuples(res) == 1) {
        out->found = true;
        out->type = (Oid)strtoul(lapse__pq.PQgetvalue(res, 0, 0), NULL, 10);
        snprintf(out->type_name, sizeof out->type_name, "%s",
                 lapse__pq.PQgetvalue(res, 0, 1));
        out->typtype = lapse__pq.PQgetvalue(res, 0, 2)[0];
        out->category = lapse__pq.PQgetvalue(res, 0, 3)[0];
        out->attnum = atoi(lapse__pq.PQgetvalue(res, 0, 4));
    }
    lapse__pq.PQclear(res);
    return rc;
}

/* Column role (for the message), its map key, and the check of its type. */
static lapse_status_t need_column(lapse__pg_map_t *m, PGconn *conn, const char *table_oid,
                                  const char *key, const char *name, column_t *col,
                                  lapse_error_t *err) {
    lapse_status_t rc = find_column(conn, table_oid, name, col, err);
    if (rc == LAPSE_OK && !col->found) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_MAP,
                               "orders map: column \"%s\" (\"%s\") does not exist in %s",
                               name, key, m->table_name);
    }
    return rc;
}

static lapse_status_t wrong_type(lapse_error_t *err, const lapse__pg_map_t *m,
                                 const char *name, const column_t *col,
                                 const char *want) {
    return lapse_error_set(err, LAPSE_ERR_CONFIG_MAP,
                           "orders map: column %s.%s is %s; want %s", m->table_name, name,
                           col->type_name, want);
}

/* An enum status must have every mapped value as a label. */
static lapse_status_t check_enum_values(PGconn *conn, const lapse__pg_map_t *m,
                                        const column_t *col, lapse_error_t *err) {
    char oid[16];
    snprintf(oid, sizeof oid, "%u", col->type);
    const lapse__orders_map_t *map = &m->map;
    const char *values[LAPSE__MAP_PENDING_MAX + 2];
    size_t n = 0;
    for (size_t i = 0; i < map->n_pending; i++) {
        values[n++] = map->pending[i];
    }
    values[n++] = map->paid;
    values[n++] = map->cancelled;
    lapse_status_t rc = LAPSE_OK;
    for (size_t i = 0; rc == LAPSE_OK && i < n; i++) {
        const char *params[2] = {oid, values[i]};
        PGresult *res =
            lapse__pq.PQexecParams(conn,
                                   "SELECT 1 FROM pg_catalog.pg_enum WHERE enumtypid ="
                                   " $1::oid AND enumlabel = $2",
                                   2, NULL, params, NULL, NULL, 0);
        if (lapse__pq.PQresultStatus(res) != PGRES_TUPLES_OK) {
            rc =
                lapse_error_set(err, LAPSE_ERR_STORE_OPEN, "orders map: reading enum: %s",
                                lapse__pq.PQresultErrorMessage(res));
        } else if (lapse__pq.PQntuples(res) == 0) {
            rc = lapse_error_set(err, LAPSE_ERR_CONFIG_MAP,
                                 "orders map: status value \"%s\" is not a label of %s",
                                 values[i], col->type_name);
        }
        lapse__pq.PQclear(res);
    }
    return rc;
}

/* Every on_cancel statement must prepare with the order id ($1, of the id's type). */
static lapse_status_t check_on_cancel(PGconn *conn, const lapse__pg_map_t *m,
                                      lapse_error_t *err) {
    for (size_t i = 0; i < m->map.n_on_cancel; i++) {
        PGresult *res = lapse__pq.PQprepare(conn, "", m->map.on_cancel[i], 1, &m->id_oid);
        bool ok = lapse__pq.PQresultStatus(res) == PGRES_COMMAND_OK;
        char msg[400];
        snprintf(msg, sizeof msg, "%s", ok ? "" : lapse__pq.PQresultErrorMessage(res));
        msg[strcspn(msg, "\n")] = '\0';
        lapse__pq.PQclear(res);
        if (!ok) {
            return lapse_error_set(
                err, LAPSE_ERR_CONFIG_MAP,
                "orders map: on_cancel statement %zu does not prepare: %s", i + 1, msg);
        }
    }
    return LAPSE_OK;
}

/* An index whose first column is the deadline column serves the sweeps' walk. */
static void check_index(PGconn *conn, lapse__pg_map_t *m, const char *table_oid,
                        const column_t *dl) {
    char attnum[16];
    snprintf(attnum, sizeof attnum, "%d", dl->attnum);
    const char *params[2] = {table_oid, attnum};
    PGresult *res = lapse__pq.PQexecParams(
        conn,
        "SELECT 1 FROM pg_catalog.pg_index WHERE indrelid = $1::oid"
        " AND indkey[0] = $2::int2",
        2, NULL, params, NULL, NULL, 0);
    if (lapse__pq.PQresultStatus(res) == PGRES_TUPLES_OK &&
        lapse__pq.PQntuples(res) == 0) {
        snprintf(m->warning, sizeof m->warning,
                 "orders map: no index of %s starts with %s, which sweeps walk pending "
                 "orders by; create one: CREATE INDEX ON %s (%s)",
                 m->table_name, m->map.deadline, m->table_name, m->map.deadline);
    }
    lapse__pq.PQclear(res);
}

static lapse_status_t find_table(PGconn *conn, lapse__pg_map_t *m, char *oid, size_t cap,
                                 lapse_error_t *err) {
    const lapse__orders_map_t *map = &m->map;
    const char *params[2] = {map->table, map->table_schema};
    PGresult *res = lapse__pq.PQexecParams(
        conn,
        "SELECT c.oid, n.nspname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace "
        "n"
        " ON n.oid = c.relnamespace WHERE c.relname = $1 AND c.relkind IN ('r', 'p')"
        " AND (n.nspname = $2 OR ($2 = '' AND pg_catalog.pg_table_is_visible(c.oid)))",
        2, NULL, params, NULL, NULL, 0);
    lapse_status_t rc = LAPSE_OK;
    if (lapse__pq.PQresultStatus(res) != PGRES_TUPLES_OK) {
        rc = lapse_error_set(err, LAPSE_ERR_STORE_OPEN, "orders map: reading tables: %s",
                             lapse__pq.PQresultErrorMessage(res));
    } else if (lapse__pq.PQntuples(res) != 1) {
        rc = lapse_error_set(err, LAPSE_ERR_CONFIG_MAP,
                             "orders map: table %s%s%s does not exist", map->table_schema,
                             map->table_schema[0] != '\0' ? "." : "", map->table);
    } else {
        snprintf(oid, cap, "%s", lapse__pq.PQgetvalue(res, 0, 0));
        char schema[140], name[140];
        if (!quote(conn, lapse__pq.PQgetvalue(res, 0, 1), schema, sizeof schema) ||
            !quote(conn, map->table, name, sizeof name)) {
            rc = lapse_error_set(err, LAPSE_ERR_NOMEM, "orders map");
        }
        snprintf(m->table, sizeof m->table, "%s.%s AS o", schema, name);
        snprintf(m->table_name, sizeof m->table_name, "%s.%s",
                 lapse__pq.PQgetvalue(res, 0, 1), map->table);
    }
    lapse__pq.PQclear(res);
    return rc;
}

/* The columns, their types, and the SQL fragments made from them. */
static lapse_status_t check_columns(PGconn *conn, lapse__pg_map_t *m, const char *oid,
                                    lapse_error_t *err) {
    const lapse__orders_map_t *map = &m->map;
    column_t id, st, dl, ca;
    lapse_status_t rc = need_column(m, conn, oid, "id", map->id, &id, err);
    if (rc == LAPSE_OK) {
        rc = need_column(m, conn, oid, "status", map->status, &st, err);
    }
    if (rc == LAPSE_OK) {
        rc = need_column(m, conn, oid, "deadline", map->deadline, &dl, err);
    }
    if (rc == LAPSE_OK && map->cancelled_at[0] != '\0') {
        rc = need_column(m, conn, oid, "cancelled_at", map->cancelled_at, &ca, err);
    }
    if (rc != LAPSE_OK) {
        return rc;
    }
    m->id_integer = id.type == OID_INT2 || id.type == OID_INT4 || id.type == OID_INT8;
    if (!m->id_integer && id.category != 'S') {
        return wrong_type(err, m, map->id, &id, "text, varchar or an integer type");
    }
    if (st.category != 'S' && st.typtype != 'e') {
        return wrong_type(err, m, map->status, &st, "text, varchar or an enum");
    }
    if (dl.type != OID_TIMESTAMPTZ) {
        return wrong_type(err, m, map->deadline, &dl, "timestamp with time zone");
    }
    if (map->cancelled_at[0] != '\0' && ca.type != OID_TIMESTAMPTZ) {
        return wrong_type(err, m, map->cancelled_at, &ca, "timestamp with time zone");
    }
    if (st.typtype == 'e' && (rc = check_enum_values(conn, m, &st, err)) != LAPSE_OK) {
        return rc;
    }
    m->id_oid = id.type;
    snprintf(m->id_type, sizeof m->id_type, "%s", id.type_name);
    snprintf(m->status_type, sizeof m->status_type, "%s", st.type_name);
    char q[140];
    bool ok = quote(conn, map->id, q, sizeof q);
    snprintf(m->id, sizeof m->id, "o.%s", q);
    ok = ok && quote(conn, map->status, q, sizeof q);
    snprintf(m->status, sizeof m->status, "o.%s", q);
    snprintf(m->status_bare, sizeof m->status_bare, "%s", q);
    ok = ok && quote(conn, map->deadline, q, sizeof q);
    snprintf(m->deadline, sizeof m->deadline, "o.%s", q);
    if (map->cancelled_at[0] != '\0') {
        ok = ok && quote(conn, map->cancelled_at, q, sizeof q);
        snprintf(m->set_cancelled, sizeof m->set_cancelled, ", %s = now()", q);
        snprintf(m->cancelled_ms, sizeof m->cancelled_ms,
                 "(floor(extract(epoch FROM o.%s) * 1000))::bigint", q);
    } else {
        snprintf(m->cancelled_ms, sizeof m->cancelled_ms, "NULL::bigint");
    }
    if (!ok) {
        return lapse_error_set(err, LAPSE_ERR_NOMEM, "orders map");
    }
    check_index(conn, m, oid, &dl);
    return LAPSE_OK;
}

lapse__pg_map_t *lapse__pg_map_open(PGconn *conn, const char *path, lapse_status_t *rc,
                                    lapse_error_t *err) {
    lapse__pg_map_t *m = calloc(1, sizeof *m);
    if (m == NULL) {
        *rc = lapse_error_set(err, LAPSE_ERR_NOMEM, "orders map");
        return NULL;
    }
    char oid[16] = "";
    *rc = lapse__orders_map_load(path, &m->map, err);
    if (*rc == LAPSE_OK) {
        *rc = find_table(conn, m, oid, sizeof oid, err);
    }
    if (*rc == LAPSE_OK) {
        *rc = check_columns(conn, m, oid, err);
    }
    if (*rc == LAPSE_OK) {
        *rc = check_on_cancel(conn, m, err);
    }
    if (*rc == LAPSE_OK && (m->pending_literal = pending_literal(&m->map)) == NULL) {
        *rc = lapse_error_set(err, LAPSE_ERR_NOMEM, "orders map");
    }
    if (*rc != LAPSE_OK) {
        lapse__pg_map_free(m);
        return NULL;
    }
    snprintf(m->window_text, sizeof m->window_text, "%lld", (long long)m->map.window_ms);
    m->values[LAPSE__MAP_V_PENDING] = m->pending_literal;
    m->values[LAPSE__MAP_V_PAID] = m->map.paid;
    m->values[LAPSE__MAP_V_CANCELLED] = m->map.cancelled;
    m->values[LAPSE__MAP_V_WINDOW] = m->window_text;
    m->values[LAPSE__MAP_V_CURSOR] = NULL;
    m->value_types[LAPSE__MAP_V_PENDING] = OID_TEXT_ARRAY;
    m->value_types[LAPSE__MAP_V_PAID] = OID_TEXT;
    m->value_types[LAPSE__MAP_V_CANCELLED] = OID_TEXT;
    m->value_types[LAPSE__MAP_V_WINDOW] = OID_INT8;
    m->value_types[LAPSE__MAP_V_CURSOR] = OID_TIMESTAMPTZ;
    return m;
}

void lapse__pg_map_free(lapse__pg_map_t *m) {
    if (m != NULL) {
        lapse__orders_map_free(&m->map);
        free(m->pending_literal);
        free(m);
    }
}

bool lapse__pg_map_id_fits(const lapse__pg_map_t *m, const char *id) {
    if (!m->id_integer) {
        return true;
    }
    size_t n = strlen(id);
    /* Digits as the database prints them back: no sign, no leading zero. */
    if (n == 0 || n > 18 || (id[0] == '0' && n > 1)) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (id[i] < '0' || id[i] > '9') {
            return false;
        }
    }
    return true;
}

/* The text of placeholder name, or NULL when it is a value (n: its index). */
static const char *fragment(const lapse__pg_map_t *m, const char *name, size_t len,
                            int *value) {
    static const char *const VALUES[] = {"PENDING", "PAID", "CANCELLED", "WIN", "CURSOR"};
    for (int i = 0; i < LAPSE__MAP_N_VALUES; i++) {
        if (strlen(VALUES[i]) == len && strncmp(name, VALUES[i], len) == 0) {
            *value = i;
            return NULL;
        }
    }
    *value = -1;
    static const char DL[] = "({DLC} + {WIN} * interval '1 millisecond')";
    static const char DLMS[] = "(floor(extract(epoch FROM {DL}) * 1000))::bigint";
    static const char CLASS[] =
        "CASE WHEN {ST}::text = ANY ({PENDING}) THEN 'pending' WHEN {ST}::text ="
        " {CANCELLED} THEN 'cancelled' ELSE 'paid' END";
    /* The shop's row of lapse's bookkeeping row s, found by the shop's id so that an
     * index on it serves: an integer id is compared as one (an int2 or int4 key serves a
     * bigint too), and only an id written as the database writes the number (no sign
     * but a minus, no leading zero, at most 18 digits, as lapse__pg_map_id_fits admits)
     * is cast, so no other text can fail the statement; it matches no row, as it did
     * when the shop's id was compared as text. (No braces in the pattern: they would be
     * taken for placeholders.) */
    static const char ID_IS_S_INT[] =
        "{ID} = CASE WHEN s.order_id ~ '^(0|-?[1-9][0-9]*)$'"
        " AND length(ltrim(s.order_id, '-')) <= 18 THEN s.order_id::bigint END";
    static const char ID_IS_S_TEXT[] = "{ID}::text = s.order_id";
    const struct {
        const char *name;
        const char *text;
    } names[] = {{"T", m->table},
                 {"ID", m->id},
                 {"IDT", m->id_type},
                 {"ST", m->status},
                 {"STN", m->status_bare},
                 {"STT", m->status_type},
                 {"DLC", m->deadline},
                 {"SET_CA", m->set_cancelled},
                 {"CA_MS", m->cancelled_ms},
                 {"DL", DL},
                 {"DLMS", DLMS},
                 {"CLASS", CLASS},
                 {"ID_IS_S", m->id_integer ? ID_IS_S_INT : ID_IS_S_TEXT}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strlen(names[i].name) == len && strncmp(name, names[i].name, len) == 0) {
            return names[i].text;
        }
    }
    return "";
}

/* One pass: every {NAME} replaced; *again when a fragment brought new placeholders. */
static char *expand_once(const lapse__pg_map_t *m, const char *tmpl, int n_own,
                         bool *again) {
    size_t cap = strlen(tmpl) + 1;
    for (const char *p = strchr(tmpl, '{'); p != NULL; p = strchr(p + 1, '{')) {
        cap += 400; /* the longest fragment, generously */
    }
    char *out = malloc(cap);
    if (out == NULL) {
        return NULL;
    }
    char *o = out;
    *again = false;
    for (const char *p = tmpl; *p != '\0';) {
        const char *close = *p == '{' ? strchr(p, '}') : NULL;
        if (close == NULL) {
            *o++ = *p++;
            continue;
        }
        int value = -1;
        const char *text = fragment(m, p + 1, (size_t)(close - p - 1), &value);
        if (text == NULL) {
            o += sprintf(o, "$%d", n_own + 1 + value);
        } else {
            size_t len = strlen(text);
            memcpy(o, text, len);
            o += len;
            *again = *again || strchr(text, '{') != NULL;
        }
        p = close + 1;
    }
    *o = '\0';
    return out;
}

char *lapse__pg_map_expand(const lapse__pg_map_t *m, const char *tmpl, int n_own) {
    char *sql = NULL;
    bool again = true;
    for (int pass = 0; again && pass < 4; pass++) {
        char *next = expand_once(m, sql != NULL ? sql : tmpl, n_own, &again);
        free(sql);
        if ((sql = next) == NULL) {
            return NULL;
        }
    }
    return sql;
}

lapse_status_t lapse__pg_map_on_cancel(PGconn *conn, const lapse__pg_map_t *m,
                                       const char *order_id, lapse_error_t *err) {
    for (size_t i = 0; i < m->map.n_on_cancel; i++) {
        const char *params[1] = {order_id};
        PGresult *res = lapse__pq.PQexecParams(conn, m->map.on_cancel[i], 1, &m->id_oid,
                                               params, NULL, NULL, 0);
        ExecStatusType st = lapse__pq.PQresultStatus(res);
        if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
            /* Copied out before the result is freed. */
            const char *field = lapse__pq.PQresultErrorField(res, PG_DIAG_SQLSTATE);
            char state[8] = "";
            snprintf(state, sizeof state, "%s", field != NULL ? field : "");
            char msg[400];
            snprintf(msg, sizeof msg, "%s", lapse__pq.PQresultErrorMessage(res));
            msg[strcspn(msg, "\n")] = '\0';
            lapse__pq.PQclear(res);
            /* Connection trouble, a lock or deadlock: worth another try soon. */
            bool retriable = state[0] == '\0' || strncmp(state, "08", 2) == 0 ||
                             strncmp(state, "40", 2) == 0 ||
                             strcmp(state, "55P03") == 0 ||
                             strncmp(state, "57P0", 4) == 0;
            return lapse_error_set(
                err, retriable ? LAPSE_ERR_STORE_BUSY : LAPSE_ERR_STORE_SQL,
                "on_cancel statement %zu for order %s: %s%s%s", i + 1, order_id, msg,
                state[0] != '\0' ? " SQLSTATE " : "", state);
        }
        lapse__pq.PQclear(res);
    }
    return LAPSE_OK;
}

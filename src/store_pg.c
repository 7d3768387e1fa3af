/* SPDX-License-Identifier: MIT
 * The PostgreSQL store backend (libpq): the server's clock decides, batches are arrays
 * bound as parameters, rows are claimed with SKIP LOCKED, a lost connection is
 * re-established on the next call. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "clock_int.h"
#include "pq_api_int.h"
#include "store_int.h"
#include "store_pg_map_int.h"

#include "store_pg_sql.h"
/* How long a claim on unscheduled orders lasts (lapse_pending_filter_t.claim_ms is the
 * caller's; this bounds it). */
#define CLAIM_MAX_MS (INT64_C(24) * 3600 * 1000)
/* The server clock is read again when the last reading is older than this. */
#define CLOCK_REFRESH_MS 1000

typedef struct pg_store {
    lapse_store_t base; /* first: a lapse_store_t * is a pg_store_t * */
    PGconn *conn;
    char *uri;
    char *schema;            /* as given */
    char *sql[PS_COUNT_];    /* PG_STMT_SQL with the schema filled in */
    int64_t clock_server_ms; /* the server's clock read at clock_mono_ms */
    int64_t clock_mono_ms;   /* 0: never read */
    /* The shop's own orders table (--orders-map), or NULL: lapse's own orders. */
    lapse__pg_map_t *map;
    int n_own[PS_COUNT_]; /* parameters the caller binds; the map's values follow */
    bool mapped[PS_COUNT_];
    /* The exact deadline of the last order a mapped pending page returned, so that the
     * next page starts exactly after it (the cursor the caller keeps is in whole ms). */
    char cursor_exact[64]; /* its deadline column's text */
    char cursor_id[LAPSE_ORDER_ID_MAX + 1];
    int64_t cursor_ms;
    char cursor_ts[64]; /* the {CURSOR} value of the statement running, "" for NULL */
} pg_store_t;

static pg_store_t *as_pg(lapse_store_t *store) {
    return (pg_store_t *)store;
}

/* ---- errors ---- */

/* Failures worth retrying: the connection (class 08), the server shutting down or
 * starting (57P0x), too many connections (53300), serialization and deadlock (40xxx),
 * a lock or statement timeout (55P03, 57014), idle-in-transaction timeout (25P03). */
static bool retriable_state(const char *state) {
    if (state == NULL) {
        return true; /* no SQLSTATE: libpq lost the connection */
    }
    return strncmp(state, "08", 2) == 0 || strncmp(state, "57P0", 4) == 0 ||
           strncmp(state, "40", 2) == 0 || strcmp(state, "53300") == 0 ||
           strcmp(state, "55P03") == 0 || strcmp(state, "57014") == 0 ||
           strcmp(state, "25P03") == 0 ||
           /* a read-only standby after a failover to the same address */
           strcmp(state, "25006") == 0;
}

/* The first line of libpq's message, without its trailing newline. */
static void first_line(const char *msg, char *out, size_t cap) {
    snprintf(out, cap, "%s", msg != NULL && msg[0] != '\0' ? msg : "unknown error");
    out[strcspn(out, "\n")] = '\0';
}

/* Every copy of uri's password in msg (a libpq message) becomes ***. */
static void hide_password(const char *uri, char *msg) {
    PQconninfoOption *opts = lapse__pq.PQconninfoParse(uri, NULL);
    for (PQconninfoOption *o = opts; o != NULL && o->keyword != NULL; o++) {
        if (o->val == NULL || o->val[0] == '\0' ||
            (strcmp(o->keyword, "password") != 0 &&
             strcmp(o->keyword, "sslpassword") != 0)) {
            continue;
        }
        size_t n = strlen(o->val);
        for (char *at = strstr(msg, o->val); at != NULL; at = strstr(at + n, o->val)) {
            memset(at, '*', n);
        }
    }
    lapse__pq.PQconninfoFree(opts);
}

static lapse_status_t fail_result(pg_store_t *s, const PGresult *res, const char *what,
                                  lapse_error_t *err) {
    const char *state =
        res != NULL ? lapse__pq.PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    char msg[512];
    first_line(res != NULL ? lapse__pq.PQresultErrorMessage(res)
                           : lapse__pq.PQerrorMessage(s->conn),
               msg, sizeof msg);
    if (res == NULL || lapse__pq.PQstatus(s->conn) != CONNECTION_OK) {
        state = NULL;
    }
    return lapse_error_set(
        err, retriable_state(state) ? LAPSE_ERR_STORE_BUSY : LAPSE_ERR_STORE_SQL,
        "%s: %s%s%s", what, msg, state != NULL ? " SQLSTATE " : "",
        state != NULL ? state : "");
}

/* ---- the connection ---- */

/* lapse's defaults, given to libpq before dbname so that the URI's own settings win; one
 * whose libpq environment variable is set is left to it. A network that goes silent
 * fails a statement within about 15 s (keepalives, tcp_user_timeout) instead of TCP's
 * quarter of an hour; a multi-host URI picks the primary. GSSAPI encryption is asked for
 * (gssencmode=prefer or require), not probed: libpq's default, prefer, looks for Kerberos
 * credentials before every TCP connection, and that probe alone set up Kerberos in a
 * process that has none: 0.5 MB of a PostgreSQL consumer's 8.6 MB peak RSS (issue 14).
 * GSSAPI authentication (pg_hba.conf's gss method) needs no encryption and still works;
 * SSL is libpq's as ever (sslmode). */
static const struct {
    const char *key, *value, *env;
} PG_DEFAULTS[] = {
    {"fallback_application_name", "lapse", NULL},
    {"keepalives_idle", "10", NULL},
    {"keepalives_interval", "5", NULL},
    {"keepalives_count", "2", NULL},
    {"tcp_user_timeout", "15000", NULL},
    {"target_session_attrs", "read-write", NULL},
    {"connect_timeout", "10", "PGCONNECT_TIMEOUT"},
    {"gssencmode", "disable", "PGGSSENCMODE"},
};
#define PG_N_DEFAULTS (sizeof PG_DEFAULTS / sizeof PG_DEFAULTS[0])

static lapse_status_t connect_db(pg_store_t *s, lapse_error_t *err) {
    const char *keys[PG_N_DEFAULTS + 2], *values[PG_N_DEFAULTS + 2];
    size_t n_keys = 0;
    for (size_t i = 0; i < PG_N_DEFAULTS; i++) {
        if (PG_DEFAULTS[i].env == NULL || getenv(PG_DEFAULTS[i].env) == NULL) {
            keys[n_keys] = PG_DEFAULTS[i].key;
            values[n_keys++] = PG_DEFAULTS[i].value;
        }
    }
    keys[n_keys] = "dbname";
    values[n_keys++] = s->uri;
    keys[n_keys] = values[n_keys] = NULL;
    /* libpq's parse errors quote the offending token, which may be the password
     * ("invalid percent-encoded token: ..."): parse first, and say what is wrong
     * without the token. */
    char *parse_error = NULL;
    PQconninfoOption *parsed = lapse__pq.PQconninfoParse(s->uri, &parse_error);
    if (parsed == NULL) {
        char msg[256];
        first_line(parse_error != NULL ? parse_error : "out of memory", msg, sizeof msg);
        lapse__pq.PQfreemem(parse_error);
        /* What libpq quotes becomes "...". */
        char shown[sizeof msg];
        size_t n = 0;
        bool quoted = false;
        for (const char *c = msg; *c != '\0' && n + 4 < sizeof shown; c++) {
            if (*c == '"') {
                quoted = !quoted;
                if (quoted) {
                    memcpy(shown + n, "\"...", 4);
                    n += 4;
                } else {
                    shown[n++] = '"';
                }
            } else if (!quoted) {
                shown[n++] = *c;
            }
        }
        shown[n] = '\0';
        return lapse_error_set(err, LAPSE_ERR_STORE_OPEN,
                               "PostgreSQL: the store URI does not parse: %s", shown);
    }
    lapse__pq.PQconninfoFree(parsed);
    if (s->conn != NULL) {
        lapse__pq.PQfinish(s->conn);
    }
    s->conn = lapse__pq.PQconnectdbParams(keys, values, 1);
    if (s->conn == NULL) {
        return lapse_error_set(err, LAPSE_ERR_NOMEM, "PostgreSQL: out of memory");
    }
    if (lapse__pq.PQstatus(s->conn) != CONNECTION_OK) {
        char msg[512];
        first_line(lapse__pq.PQerrorMessage(s->conn), msg, sizeof msg);
        hide_password(s->uri, msg);
        /* A server that is down, restarting or full is retriable; a URI libpq cannot
         * parse, a refused login or a missing database is not. */
        bool fatal =
            lapse__pq.PQconnectionNeedsPassword(s->conn) ||
            strstr(msg, "invalid") != NULL || strstr(msg, "authentication") != NULL ||
            strstr(msg, "does not exist") != NULL || strstr(msg, "password") != NULL;
        return lapse_error_set(err, fatal ? LAPSE_ERR_STORE_OPEN : LAPSE_ERR_STORE_BUSY,
                               "PostgreSQL: %s", msg);
    }
    return LAPSE_OK;
}

/* A connection that broke (a restarted or failed-over server, a terminated backend) is
 * replaced before the next statement; the statement that saw it break has already
 * failed as retriable, so no transaction is ever half replayed. */
static lapse_status_t ensure_conn(pg_store_t *s, lapse_error_t *err) {
    if (s->conn != NULL && lapse__pq.PQstatus(s->conn) == CONNECTION_OK) {
        return LAPSE_OK;
    }
    return connect_db(s, err);
}

/* Runs statement id with text parameters (NULL: SQL NULL); *out receives the result
 * (PQclear it) when it returned rows, else it is cleared here. */
static lapse_status_t exec_v(pg_store_t *s, pg_stmt_id_t id, PGresult **out, int n,
                             const char *const *params, lapse_error_t *err) {
    if (out != NULL) {
        *out = NULL;
    }
    const char *all[16];
    Oid types[16] = {0};
    if (s->mapped[id]) {
        /* The map's values follow the caller's parameters, typed, so that a statement
         * that does not use one of them still parses. */
        for (int i = 0; i < n; i++) {
            all[i] = params[i];
        }
        for (int v = 0; v < LAPSE__MAP_N_VALUES; v++) {
            all[n + v] = s->map->values[v];
            types[n + v] = s->map->value_types[v];
        }
        if (s->cursor_ts[0] != '\0') {
            all[n + LAPSE__MAP_V_CURSOR] = s->cursor_ts;
        }
        params = all;
        n += LAPSE__MAP_N_VALUES;
    }
    PGresult *res = lapse__pq.PQexecParams(
        s->conn, s->sql[id], n, s->mapped[id] ? types : NULL, params, NULL, NULL, 0);
    ExecStatusType st = res != NULL ? lapse__pq.PQresultStatus(res) : PGRES_FATAL_ERROR;
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        lapse_status_t rc = fail_result(s, res, PG_STMT_NAME[id], err);
        lapse__pq.PQclear(res);
        return rc;
    }
    if (out != NULL) {
        *out = res;
    } else {
        lapse__pq.PQclear(res);
    }
    return LAPSE_OK;
}

/* Simple-protocol commands (BEGIN with its settings, COMMIT, ROLLBACK, DDL). */
static lapse_status_t exec_simple(pg_store_t *s, const char *sql, const char *what,
                                  lapse_error_t *err) {
    PGresult *res = lapse__pq.PQexec(s->conn, sql);
    ExecStatusType st = res != NULL ? lapse__pq.PQresultStatus(res) : PGRES_FATAL_ERROR;
    lapse_status_t rc = LAPSE_OK;
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        rc = fail_result(s, res, what, err);
    }
    lapse__pq.PQclear(res);
    return rc;
}

static lapse_status_t begin(pg_store_t *s, lapse_error_t *err) {
    lapse_status_t rc = ensure_conn(s, err);
    return rc == LAPSE_OK ? exec_simple(s, PG_BEGIN, "BEGIN", err) : rc;
}

/* Ends a transaction: commits when rc is LAPSE_OK, else rolls back. A commit whose
 * answer was lost with the connection may or may not have happened: it is reported as
 * retriable, and every write here is a compare-and-set, so doing it again is safe. */
static lapse_status_t end(pg_store_t *s, lapse_status_t rc, lapse_error_t *err) {
    if (rc == LAPSE_OK) {
        return exec_simple(s, "COMMIT", "COMMIT", err);
    }
    if (lapse__pq.PQstatus(s->conn) == CONNECTION_OK &&
        lapse__pq.PQtransactionStatus(s->conn) != PQTRANS_IDLE) {
        PGresult *res = lapse__pq.PQexec(s->conn, "ROLLBACK");
        lapse__pq.PQclear(res);
    }
    return rc;
}

/* ---- parameters ---- */

/* A growing text buffer; ok turns false once memory ran out. */
typedef struct buf {
    char *p;
    size_t n, cap;
    bool ok;
} buf_t;

static void buf_put(buf_t *b, const char *s, size_t len) {
    if (!b->ok) {
        return;
    }
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap == 0 ? 256 : b->cap;
        while (cap < b->n + len + 1) {
            cap *= 2;
        }
        char *grown = realloc(b->p, cap);
        if (grown == NULL) {
            b->ok = false;
            return;
        }
        b->p = grown;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = '\0';
}

static void buf_str(buf_t *b, const char *s) {
    buf_put(b, s, strlen(s));
}

/* A text[] literal: every element double-quoted, with " and \ escaped. */
typedef struct arr {
    buf_t b;
    size_t n;
} arr_t;

static void arr_init(arr_t *a) {
    *a = (arr_t){.b = {.ok = true}};
    buf_str(&a->b, "{");
}

static void arr_text(arr_t *a, const char *s) {
    buf_str(&a->b, a->n++ == 0 ? "\"" : ",\"");
    /* The runs between the bytes to escape go in whole (an event body is mostly runs). */
    for (const char *p = s; *p != '\0';) {
        size_t run = strcspn(p, "\"\\");
        buf_put(&a->b, p, run);
        p += run;
        if (*p != '\0') {
            buf_put(&a->b, "\\", 1);
            buf_put(&a->b, p++, 1);
        }
    }
    buf_put(&a->b, "\"", 1);
}

static void arr_int(arr_t *a, int64_t v) {
    char num[32];
    snprintf(num, sizeof num, "%s%lld", a->n++ == 0 ? "" : ",", (long long)v);
    buf_str(&a->b, num);
}

/* The literal, or NULL when memory ran out (then arr_free still frees). */
static const char *arr_end(arr_t *a) {
    buf_str(&a->b, "}");
    return a->b.ok ? a->b.p : NULL;
}

static void arr_free(arr_t *a) {
    free(a->b.p);
    *a = (arr_t){0};
}

/* Empty again, keeping the memory (a literal that ran out of it stays failed). */
static void arr_reset(arr_t *a) {
    a->b.n = 0;
    a->n = 0;
    buf_str(&a->b, "{");
}

static const char *int_text(char buf[32], int64_t v) {
    snprintf(buf, 32, "%lld", (long long)v);
    return buf;
}

static int64_t col_int(const PGresult *res, int row, int col) {
    return lapse__pq.PQgetisnull(res, row, col)
               ? -1
               : strtoll(lapse__pq.PQgetvalue(res, row, col), NULL, 10);
}

static lapse_status_t nomem(lapse_error_t *err, const char *what) {
    return lapse_error_set(err, LAPSE_ERR_NOMEM, "%s", what);
}

/* Fills out->holds from a JSON array of strings (NULL text: none). */
static lapse_status_t parse_holds(const char *json, lapse_order_t *out,
                                  lapse_error_t *err) {
    if (json == NULL || json[0] == '\0') {
        return LAPSE_OK;
    }
    json_t *arr = json_loads(json, 0, NULL);
    lapse_status_t rc = LAPSE_OK;
    size_t n = json_is_array(arr) ? json_array_size(arr) : 0;
    if (!json_is_array(arr)) {
        rc = lapse_error_set(err, LAPSE_ERR_STORE_SQL, "holds: not a JSON array");
    } else if (n > 0 && (out->holds = calloc(n, sizeof(char *))) == NULL) {
        rc = nomem(err, "reading holds");
    }
    for (size_t i = 0; rc == LAPSE_OK && i < n; i++) {
        const char *v = json_string_value(json_array_get(arr, i));
        if (v == NULL || (out->holds[i] = strdup(v)) == NULL) {
            rc = nomem(err, "reading holds");
            break;
        }
        out->n_holds++;
    }
    json_decref(arr);
    return rc;
}

/* ---- the clock ---- */

static lapse_status_t pg_now(lapse_store_t *store, int64_t *now_ms, lapse_error_t *err) {
    pg_store_t *s = as_pg(store);
    int64_t mono = lapse__mono_ms();
    if (s->clock_mono_ms == 0 || mono - s->clock_mono_ms >= CLOCK_REFRESH_MS) {
        PGresult *res = NULL;
        lapse_status_t rc = ensure_conn(s, err);
        if (rc == LAPSE_OK) {
            rc = exec_v(s, PS_NOW, &res, 0, NULL, err);
        }
        if (rc != LAPSE_OK) {
            return rc;
        }
        /* Read half way through the round trip, as near as can be known. */
        int64_t after = lapse__mono_ms();
        s->clock_server_ms = col_int(res, 0, 0);
        s->clock_mono_ms = mono + (after - mono) / 2;
        lapse__pq.PQclear(res);
        mono = after;
    }
    *now_ms = s->clock_server_ms + (mono - s->clock_mono_ms);
    return LAPSE_OK;
}

/* ---- orders ---- */

/* Statement id with one array parameter, the literal in list (freed here): in a
 * transaction of its own, for its lock_timeout (a row someone holds fails it as
 * retriable after 2 s instead of stalling it), or alone. */
static lapse_status_t exec_list(pg_store_t *s, pg_stmt_id_t id, arr_t *list, bool txn,
                                lapse_error_t *err) {
    const char *p[1] = {arr_end(list)};
    lapse_status_t rc = p[0] == NULL ? nomem(err, PG_STMT_NAME[id])
                        : txn        ? begin(s, err)
                                     : ensure_conn(s, err);
    if (rc == LAPSE_OK) {
        rc = exec_v(s, id, NULL, 1, p, err);
    }
    arr_free(list);
    return txn ? end(s, rc, err) : rc;
}

static bool id_fits(const pg_store_t *s, const char *order_id) {
    return s->map == NULL || lapse__pg_map_id_fits(s->map, order_id);
}

/* qsort has no context argument in C11: the batch being sorted (one thread per handle,
 * but several handles may sort at once, hence thread-local). */
static _Thread_local const lapse_new_order_t *sort_orders;

static int by_order_id(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    int c = strcmp(sort_orders[x].order_id, sort_orders[y].order_id);
    /* Stable: an id given twice is inserted as the caller gave it first. */
    return c != 0 ? c : (x > y) - (x < y);
}

static lapse_status_t pg_insert_orders(lapse_store_t *store,
                                       const lapse_new_order_t *orders, size_t n,
                                       lapse_status_t *results, lapse_error_t *err) {
    pg_store_t *s = as_pg(store);
    arr_t ids, deadlines, created;
    arr_init(&ids);
    arr_init(&deadlines);
    arr_init(&created);
    /* In id order: two batches that share ids then lock their rows in the same order and
     * cannot deadlock each other. */
    size_t *by_id = malloc((n > 0 ? n : 1) * sizeof *by_id);
    if (by_id == NULL) {
        return nomem(err, "insert_orders");
    }
    for (size_t i = 0; i < n; i++) {
        by_id[i] = i;
        /* An id the shop's table cannot hold (letters for an integer id) is no order. */
        results[i] =
            id_fits(s, orders[i].order_id) ? LAPSE_OK : LAPSE_ERR_STORE_NOT_FOUND;
    }
    sort_orders = orders;
    qsort(by_id, n, sizeof *by_id, by_order_id);
    for (size_t k = 0; k < n; k++) {
        size_t i = by_id[k];
        if (results[i] == LAPSE_OK) {
            arr_text(&ids, orders[i].order_id);
            arr_int(&deadlines, orders[i].deadline_ms);
            arr_int(&created, orders[i].created_at_ms);
        }
    }
    free(by_id);
    const char *params[3] = {arr_end(&ids), arr_end(&deadlines), arr_end(&created)};
    PGresult *fresh = NULL, *existing = NULL;
    arr_t hold_ids, hold_names;
    arr_init(&hold_ids);
    arr_init(&hold_names);
    lapse_status_t rc =
        params[0] && params[1] && params[2] ? begin(s, err) : nomem(err, "insert_orders");
    if (rc == LAPSE_OK) {
        rc = exec_v(s, PS_ORDERS_INSERT, &fresh, 3, params, err);
    }
    if (rc == LAPSE_OK && (size_t)lapse__pq.PQntuples(fresh) < ids.n) {
        rc = exec_v(s, PS_ORDERS_READ, &existing, 1, params, err);
    }
    /* New orders get their holds; an order that existed is judged by its row, like
     * SQLite's (a re-publish never changes holds). */
    for (size_t i = 0; rc == LAPSE_OK && i < n; i++) {
        if (results[i] != LAPSE_OK) {
            continue;
        }
        bool is_new = false;
        for (int r = 0; !is_new && r < lapse__pq.PQntuples(fresh); r++) {
            is_new = strcmp(lapse__pq.PQgetvalue(fresh, r, 0), orders[i].order_id) == 0;
        }
        /* An id given twice in one batch: the first is new, the second a re-publish. */
        for (size_t j = 0; is_new && j < i; j++) {
            is_new = strcmp(orders[j].order_id, orders[i].order_id) != 0;
        }
        if (is_new) {
            for (size_t h = 0; h < orders[i].n_holds; h++) {
                arr_text(&hold_ids, orders[i].order_id);
                arr_text(&hold_names, orders[i].holds[h]);
            }
            continue;
        }
        lapse_order_t row;
        lapse_order_init(&row);
        bool found = false;
        for (int r = 0; existing != NULL && !found && r < lapse__pq.PQntuples(existing);
             r++) {
            if (strcmp(lapse__pq.PQgetvalue(existing, r, 0), orders[i].order_id) == 0) {
                found = true;
                rc = lapse__order_status_parse(lapse__pq.PQgetvalue(existing, r, 1),
                                               &row.status);
                row.deadline_ms = col_int(existing, r, 2);
            }
        }
        if (!found && s->map != NULL) {
            results[i] = LAPSE_ERR_STORE_NOT_FOUND; /* the shop has no such order */
        } else if (!found) {
            rc = lapse_error_set(err, LAPSE_ERR_STORE_SQL,
                                 "order %s: insert ignored but no row",
                                 orders[i].order_id);
        } else if (rc != LAPSE_OK) {
            lapse_error_set(err, rc, "order %s: unknown status", orders[i].order_id);
        } else {
            results[i] = lapse__insert_verdict(&row, orders[i].deadline_ms);
        }
    }
    if (rc == LAPSE_OK && hold_ids.n > 0) {
        const char *hp[2] = {arr_end(&hold_ids), arr_end(&hold_names)};
        rc = hp[0] && hp[1] ? exec_v(s, PS_HOLDS_INSERT, NULL, 2, hp, err)
                            : nomem(err, "insert_orders");
    }
    lapse__pq.PQclear(fresh);
    lapse__pq.PQclear(existing);
    arr_free(&ids);
    arr_free(&deadlines);
    arr_free(&created);
    arr_free(&hold_ids);
    arr_free(&hold_names);
    return end(s, rc, err);
}

static lapse_status_t pg_mark_scheduled(lapse_store_t *store,
                                        const char *const *order_ids, size_t n,
                                        lapse_error_t *err) {
    pg_store_t *s = as_pg(store);
    arr_t ids;
    arr_init(&ids);
    for (size_t i = 0; i < n; i++) {
        arr_text(&ids, order_ids[i]);
    }
    return exec_list(s, PS_ORDERS_SCHEDULE, &ids, true, err);
}

/* Reads one order (and its holds) in one statement, so both come from one snapshot. */
static lapse_status_t read_order(pg_store_t *s, const char *order_id, lapse_order_t *out,
                                 bool *found, lapse_error_t *err) {
    PGresult *res = NULL;
    const char *params[1] = {order_id};
    *found = false;
    if (!id_fits(s, order_id)) {
        return LAPSE_OK;
    }
    lapse_status_t rc = exec_v(s, PS_ORDER_GET, &res, 1, params, err);
    *found = rc == LAPSE_OK && lapse__pq.PQntuples(res) == 1;
    if (*found) {
        if (lapse__order_status_parse(lapse__pq.PQgetvalue(res, 0, 0), &out->status) !=
            LAPSE_OK) {
            rc = lapse_error_set(err, LAPSE_ERR_STORE_SQL, "order %s: unknown status",
                                 order_id);
        }
        out->deadline_ms = col_int(res, 0, 1);
        out->created_at_ms = col_int(res, 0, 2);
        out->paid_at_ms = col_int(res, 0, 3);
        out->cancelled_at_ms = col_int(res, 0, 4);
        out->scheduled = col_int(res, 0, 5) != 0;
        if (rc == LAPSE_OK && !lapse__pq.PQgetisnull(res, 0, 6)) {
            rc = parse_holds(lapse__pq.PQgetvalue(res, 0, 6), out, err);
        }
    }
    lapse__pq.PQclear(res);
    return rc;
}

static lapse_status_t pg_pay(lapse_store_t *store, const char *order_id, int64_t now_ms,
                             lapse_error_t *err) {
    (void)now_ms; /* the server's clock decides */
    pg_store_t *s = as_pg(store);
    PGresult *res = NULL;
    const char *params[1] = {order_id};
    lapse_status_t rc = begin(s, err);
    if (rc == LAPSE_OK && id_fits(s, order_id)) {
        rc = exec_v(s, PS_ORDER_PAY, &res, 1, params, err);
    }
    bool paid = rc == LAPSE_OK && res != NULL && lapse__pq.PQntuples(res) == 1;
    lapse__pq.PQclear(res);
    if (rc == LAPSE_OK && !paid) {
        lapse_order_t order;
        bool found = false;
        lapse_order_init(&order);
        rc = read_order(s, order_id, &order, &found, err);
        if (rc == LAPSE_OK) {
            rc = lapse__pay_verdict(order_id, found ? &order : NULL, err);
        }
        lapse_order_clear(&order);
        /* A refusal is an answer, not a failed transaction: end it cleanly. */
        if (rc != LAPSE_OK && rc != LAPSE_ERR_STORE_BUSY && rc != LAPSE_ERR_STORE_SQL) {
            lapse_error_t ignored;
            end(s, LAPSE_OK, &ignored);
            return rc;
        }
    }
    return end(s, rc, err);
}

static lapse_status_t pg_get(lapse_store_t *store, const char *order_id,
                             lapse_order_t *out, lapse_error_t *err) {
    pg_store_t *s = as_pg(store);
    size_t id_len = strlen(order_id);
    if (id_len > LAPSE_ORDER_ID_MAX) {
        return lapse_error_set(err, LAPSE_ERR_STORE_NOT_FOUND, "order id too long");
    }
    lapse_order_t order;
    lapse_order_init(&order);
    memcpy(order.order_id, order_id, id_len + 1);
    bool found = false;
    lapse_status_t rc = ensure_conn(s, err);
    if (rc == LAPSE_OK) {
        rc = read_order(s, order_id, &order, &found, err);
    }
    if (rc == LAPSE_OK && !found) {
        rc = lapse_error_set(err, LAPSE_ERR_STORE_NOT_FOUND, "order %s not found",
                             order_id);
    }
    if (rc != LAPSE_OK) {
        lapse_order_clear(&order);
        return rc;
    }
    lapse_order_clear(out);
    *out = order;
    return LAPSE_OK;
}

static lapse_status_t pg_count(lapse_store_t *store, int64_t counts[3],
                               lapse_error_t *err) {
    pg_store_t *s = as_pg(store);
    PGresult *res = NULL;
    counts[0] = counts[1] = counts[2] = 0;
    lapse_status_t rc = ensure_conn(s, err);
    if (rc == LAPSE_OK) {
        rc = exec_v(s, PS_ORDER_COUNT, &res, 0, NULL, err);
    }
    for (int r = 0; rc == LAPSE_OK && r < lapse__pq.PQntuples(res); r++) {
        lapse_order_status_t status;
        if (lapse__order_status_parse(lapse__pq.PQgetvalue(res, r, 0), &status) ==
            LAPSE_OK) {
            counts[status] = col_int(res, r, 1);
        }
    }
    lapse__pq.PQclear(res);
    return rc;
}

/* ---- cancellation ---- */

/* The batch's items by order id (then position), so that each row the database returns
 * finds its items by binary search, not by a walk of the batch. */
typedef struct by_id {
    const char *id;
    size_t i;
} by_id_t;

static int by_id_cmp(const void *a, const void *b) {
    const by_id_t *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c != 0 ? c : (x->i > y->i) - (x->i < y->i);
}

/* The first entry of index (n entries) with id, or n when there is none. */
static size_t first_of(const by_id_t *index, size_t n, const char *id) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(index[mid].id, id) < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < n && strcmp(index[lo].id, id) == 0 ? lo : n;
}

/* The first row (of n, column 0 sorted byte-wise) whose value is id, or n. */
static int first_row(const PGresult *res, int n, const char *id) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (strcmp(lapse__pq.PQgetvalue(res, mid, 0), id) < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < n && strcmp(lapse__pq.PQgetvalue(res, lo, 0), id) == 0 ? lo : n;
}

/* The parameters of one INSERT of events: a statement goes out once these hold
 * PG_EVENTS_INSERT_BYTES. A batch's events in one statement made a consumer hold them
 * twice at its peak, in these arrays (past malloc's mmap threshold, fresh pages each
 * batch) and in libpq's output buffer, grown to 128 KiB for them (issue 14). */
#define PG_EVENTS_INSERT_BYTES (24 * 1024)

typedef struct ev_rows {
    arr_t orders, bodies;
} ev_rows_t;

/* Insert the events in rows (at least one), write their seqs back into items (found
 * through index) and empty rows for the next ones. */
static lapse_status_t insert_events(pg_store_t *s, lapse_cancel_item_t *items, size_t n,
                                    const by_id_t *index, ev_rows_t *rows, int64_t now,
                                    lapse_error_t *err) {
    char now_text[32], claim_text[32];
    /* The canceller publishes its own events straight away (lapse_store_events_pending
     * with their seqs); the claim keeps competing relays off them meanwhile. */
    const char *p[4] = {arr_end(&rows->orders), arr_end(&rows->bodies),
                        int_text(now_text, now),
                        int_text(claim_text, now + LAPSE_STORE_EVENT_CLAIM_MS)};
    PGresult *ins = NULL;
    lapse_status_t rc = p[0] && p[1] ? exec_v(s, PS_EVENTS_INSERT, &ins, 4, p, err)
                                     : nomem(err, "cancel: events");
    for (int r = 0; rc == LAPSE_OK && r < lapse__pq.PQntuples(ins); r++) {
        size_t k = first_of(index, n, lapse__pq.PQgetvalue(ins, r, 1));
        if (k < n) {
            items[index[k].i].event_seq = col_int(ins, r, 0);
        }
    }
    lapse__pq.PQclear(ins);
    arr_reset(&rows->orders);
    arr_reset(&rows->bodies);
    return rc;
}

/* The events of the cancelled items: bodies built from each order's holds (holds: the
 * rows HOLDS_RELEASE released, sorted by order then resource; borrowed), inserted a
 * few at a time (PG_EVENTS_INSERT_BYTES), in items' order, seqs written back. */
static lapse_status_t record_events(pg_store_t *s, lapse_cancel_item_t *items, size_t n,
                                    const by_id_t *index, const PGresult *holds,
                                    int64_t now, lapse_error_t *err) {
    lapse_status_t rc = LAPSE_OK;
    ev_rows_t rows;
    arr_init(&rows.orders);
    arr_init(&rows.bodies);
    int row = 0;
    int nrows = lapse__pq.PQntuples(holds);
    for (size_t i = 0; rc == LAPSE_OK && i < n; i++) {
        lapse_cancel_item_t *it = &items[i];
        if (it->outcome != LAPSE_CANCEL_DONE) {
            continue;
        }
        /* This order's holds: HOLDS_RELEASE sorts by order id, byte-wise. */
        char *names[64];
        char **hold = names;
        size_t n_hold = 0, cap = sizeof names / sizeof names[0];
        for (row = first_row(holds, nrows, it->order_id);
             row < nrows &&
             strcmp(lapse__pq.PQgetvalue(holds, row, 0), it->order_id) == 0;
             row++) {
            if (n_hold == cap) {
                char **grown = malloc(2 * cap * sizeof(char *));
                if (grown == NULL) {
                    rc = nomem(err, "cancel: holds");
                    break;
                }
                memcpy(grown, hold, n_hold * sizeof(char *));
                if (hold != names) {
                    free(hold);
                }
                hold = grown;
                cap *= 2;
            }
            hold[n_hold++] = lapse__pq.PQgetvalue(holds, row, 1);
        }
        char *body = rc == LAPSE_OK ? lapse__event_body(it->order_id, it->deadline_ms,
                                                        now, hold, n_hold)
                                    : NULL;
        if (hold != names) {
            free(hold);
        }
        if (rc == LAPSE_OK && body == NULL) {
            rc = nomem(err, "cancel: event body");
        }
        if (rc == LAPSE_OK) {
            arr_text(&rows.orders, it->order_id);
            arr_text(&rows.bodies, body);
            if (rows.orders.b.n + rows.bodies.b.n >= PG_EVENTS_INSERT_BYTES) {
                rc = insert_events(s, items, n, index, &rows, now, err);
            }
        }
        free(body);
    }
    if (rc == LAPSE_OK && rows.orders.n > 0) {
        rc = insert_events(s, items, n, index, &rows, now, err);
    }
    arr_free(&rows.orders);
    arr_free(&rows.bodies);
    return rc;
}

static lapse_status_t pg_cancel_batch(lapse_store_t *store, lapse_cancel_item_t *items,
                                      size_t n, int64_t now_ms, lapse_error_t *err) {
    pg_store_t *s = as_pg(store);
    by_id_t *index = malloc(n * sizeof *index);
    if (index == NULL) {
        return nomem(err, "cancel_batch");
    }
    for (size_t i = 0; i < n; i++) {
        index[i] = (by_id_t){.id = items[i].order_id, .i = i};
    }
    qsort(index, n, sizeof *index, by_id_cmp);
    arr_t ids, due;
    arr_init(&ids);
    arr_init(&due);
    for (size_t i = 0; i < n; i++) {
        items[i].outcome = LAPSE_CANCEL_UNKNOWN;
        items[i].deadline_ms = 0;
        items[i].event_seq = 0;
        items[i].now_ms = now_ms;
        if (id_fits(s, items[i].order_id)) {
            arr_text(&ids, items[i].order_id);
        }
    }
    const char *ids_lit = arr_end(&ids);
    PGresult *locked = NULL;
    lapse_status_t rc = ids_lit != NULL ? begin(s, err) : nomem(err, "cancel_batch");
    /* Lock what can be locked now; a row someone else holds is skipped, not waited for.
     */
    const char *p1[1] = {ids_lit};
    if (rc == LAPSE_OK) {
        rc = exec_v(s, PS_CANCEL_LOCK, &locked, 1, p1, err);
    }
    int64_t server_now = rc == LAPSE_OK ? col_int(locked, 0, 0) : 0;
    /* now_ms 0 is "nothing is due" on every store. */
    int64_t now = now_ms == 0 ? 0 : server_now;
    size_t n_locked = 0, n_due = 0;
    for (size_t i = 0; i < n; i++) {
        items[i].now_ms = now;
    }
    for (int r = 0; rc == LAPSE_OK && r < lapse__pq.PQntuples(locked); r++) {
        if (lapse__pq.PQgetisnull(locked, r, 1)) {
            continue; /* the one row of an empty lock set */
        }
        const char *id = lapse__pq.PQgetvalue(locked, r, 1);
        lapse_order_status_t status;
        if (lapse__order_status_parse(lapse__pq.PQgetvalue(locked, r, 2), &status) !=
            LAPSE_OK) {
            rc =
                lapse_error_set(err, LAPSE_ERR_STORE_SQL, "order %s: unknown status", id);
            break;
        }
        int64_t deadline = col_int(locked, r, 3);
        /* Every item of this order; a duplicate id in one batch is cancelled once, by
         * its first item, and the others are no-ops. */
        for (size_t k = first_of(index, n, id); k < n && strcmp(index[k].id, id) == 0;
             k++) {
            lapse_cancel_item_t *it = &items[index[k].i];
            bool first = k == 0 || strcmp(index[k - 1].id, id) != 0;
            it->deadline_ms = deadline;
            if (status == LAPSE_ORDER_PENDING && now != 0 && deadline <= now) {
                it->outcome = first ? LAPSE_CANCEL_DONE : LAPSE_CANCEL_NOOP_CANCELLED;
                if (first) {
                    arr_text(&due, id);
                    n_due++;
                }
            } else {
                it->outcome = lapse__cancel_verdict(status);
            }
            n_locked++;
        }
    }
    /* The rest either does not exist or is locked by another transaction. */
    if (rc == LAPSE_OK && n_locked < n) {
        PGresult *exist = NULL;
        rc = exec_v(s, PS_ORDERS_EXIST, &exist, 1, p1, err);
        for (int r = 0; rc == LAPSE_OK && r < lapse__pq.PQntuples(exist); r++) {
            const char *id = lapse__pq.PQgetvalue(exist, r, 0);
            for (size_t k = first_of(index, n, id); k < n && strcmp(index[k].id, id) == 0;
                 k++) {
                if (items[index[k].i].outcome == LAPSE_CANCEL_UNKNOWN) {
                    items[index[k].i].outcome = LAPSE_CANCEL_BUSY;
                }
            }
        }
        lapse__pq.PQclear(exist);
    }
    const char *due_lit = arr_end(&due);
    if (rc == LAPSE_OK && n_due > 0) {
        char now_text[32];
        const char *p2[2] = {due_lit, int_text(now_text, now)};
        PGresult *upd = NULL;
        rc = due_lit != NULL ? exec_v(s, PS_ORDERS_CANCEL, &upd, 2, p2, err)
                             : nomem(err, "cancel_batch");
        if (rc == LAPSE_OK && strtoull(lapse__pq.PQcmdTuples(upd), NULL, 10) != n_due) {
            /* Locked and checked above, so this cannot happen; if it ever does, nothing
             * is written rather than an event for an order that was not cancelled. */
            rc = lapse_error_set(err, LAPSE_ERR_STORE_SQL,
                                 "cancel: %s of %zu rows changed",
                                 lapse__pq.PQcmdTuples(upd), n_due);
        }
        lapse__pq.PQclear(upd);
        /* The holds released are the holds the events name: one statement for both. */
        PGresult *holds = NULL;
        if (rc == LAPSE_OK) {
            rc = exec_v(s, PS_HOLDS_RELEASE, &holds, 2, p2, err);
        }
        /* The shop's own release of what each order held, in this transaction: one
         * failing statement rolls the whole batch back. */
        for (size_t i = 0; rc == LAPSE_OK && s->map != NULL && i < n; i++) {
            if (items[i].outcome == LAPSE_CANCEL_DONE) {
                rc = lapse__pg_map_on_cancel(s->conn, s->map, items[i].order_id, err);
            }
        }
        if (rc == LAPSE_OK) {
            rc = record_events(s, items, n, index, holds, now, err);
        }
        lapse__pq.PQclear(holds);
    }
    lapse__pq.PQclear(locked);
    arr_free(&ids);
    arr_free(&due);
    free(index);
    rc = end(s, rc, err);
    if (rc != LAPSE_OK) {
        for (size_t i = 0; i < n; i++) {
            items[i].outcome = LAPSE_CANCEL_UNKNOWN;
            items[i].deadline_ms = 0;
            items[i].event_seq = 0;
        }
    }
    return rc;
}

/* ---- the outbox ---- */

static void clear_result(void *res) {
    lapse__pq.PQclear(res);
}

static int by_seq(const void *a, const void *b) {
    int64_t x = ((const lapse_event_t *)a)->seq, y = ((const lapse_event_t *)b)->seq;
    return (x > y) - (x < y);
}

static lapse_status_t pg_events_pending(lapse_store_t *store, size_t limit,
                                        const int64_t *seqs, size_t n_seqs,
                                        lapse__event_list_t *out, lapse_error_t *err) {
    pg_store_t *s = as_pg(store);
    char lim[32], claim[32];
    int64_t bound = limit > (size_t)INT64_MAX ? INT64_MAX : (int64_t)limit;
    PGresult *res = NULL;
    arr_t list;
    arr_init(&list);
    lapse_status_t rc = ensure_conn(s, err);
    if (rc == LAPSE_OK && seqs != NULL) {
        for (size_t k = 0; k < n_seqs; k++) {
            arr_int(&list, seqs[k]);
        }
        const char *p[2] = {arr_end(&list), int_text(lim, bound)};
        rc = p[0] != NULL ? exec_v(s, PS_EVENTS_BY_SEQ, &res, 2, p, err)
                          : nomem(err, "events");
    } else if (rc == LAPSE_OK) {
        const char *p[2] = {int_text(lim, bound),
                            int_text(claim, LAPSE_STORE_EVENT_CLAIM_MS)};
        rc = exec_v(s, PS_EVENTS_CLAIM, &res, 2, p, err);
    }
    /* The events' strings stay in res, which the list owns from here on: no copy of
     * a page of events beside the result that holds them (issue 14). */
    out->owner = res; /* out comes empty (lapse_store_events_pending) */
    out->owner_free = clear_result;
    for (int r = 0; rc == LAPSE_OK && r < lapse__pq.PQntuples(res) && out->n < limit;
         r++) {
        if (!lapse__event_list_borrow(
                out, col_int(res, r, 0), lapse__pq.PQgetvalue(res, r, 1),
                lapse__pq.PQgetvalue(res, r, 2), lapse__pq.PQgetvalue(res, r, 3))) {
            rc = nomem(err, "reading events");
        }
    }
    /* UPDATE ... RETURNING comes in no particular order. */
    if (rc == LAPSE_OK && out->n > 1) {
        qsort(out->items, out->n, sizeof(out->items[0]), by_seq);
    }
    arr_free(&list);
    return rc;
}

static lapse_status_t pg_events_mark_published(lapse_store_t *store, const int64_t *seqs,
                                               size_t n, int64_t now_ms,
                                               lapse_error_t *err) {
    (void)now_ms; /* the server's clock dates it, like everything else here */
    pg_store_t *s = as_pg(store);
    arr_t list;
    arr_init(&list);
    for (size_t i = 0; i < n; i++) {
        arr_int(&list, seqs[i]);
    }
    return exec_list(s, PS_EVENTS_PUBLISHED, &list, true, err);
}

static lapse_status_t pg_events_release(lapse_store_t *store, const int64_t *seqs,
                                        size_t n, lapse_error_t *err) {
    pg_store_t *s = as_pg(store);
    arr_t list;
    arr_init(&list);
    for (size_t i = 0; i < n; i++) {
        arr_int(&list, seqs[i]);
    }
    return exec_list(s, PS_EVENTS_RELEASE, &list, false, err);
}

static lapse_status_t pg_events_count(lapse_store_t *store, int64_t *pending,
                                      lapse_error_t *err) {
    pg_store_t *s = as_pg(store);
    PGresult *res = NULL;
    lapse_status_t rc = ensure_conn(s, err);
    if (rc == LAPSE_OK) {
        rc = exec_v(s, PS_EVENTS_COUNT, &res, 0, NULL, err);
    }
    if (rc == LAPSE_OK) {
        *pending = col_int(res, 0, 0);
    }
    lapse__pq.PQclear(res);
    return rc;
}

/* ---- the pending walk ---- */

static int by_deadline_id(const void *a, const void *b) {
    const lapse_order_t *x = a, *y = b;
    if (x->deadline_ms != y->deadline_ms) {
        return (x->deadline_ms > y->deadline_ms) - (x->deadline_ms < y->deadline_ms);
    }
    return strcmp(x->order_id, y->order_id);
}

static lapse_status_t pg_pending_page(lapse_store_t *store,
                                      const lapse_pending_filter_t *filter,
                                      int64_t after_deadline_ms, const char *after_id,
                                      lapse__order_page_t *page, lapse_error_t *err) {
    pg_store_t *s = as_pg(store);
    char t[5][32];
    int64_t claim = filter->claim_ms < CLAIM_MAX_MS ? filter->claim_ms : CLAIM_MAX_MS;
    bool claiming = filter->only_unscheduled && claim > 0;
    pg_stmt_id_t id = claiming                   ? PS_UNSCHEDULED_CLAIM
                      : filter->only_unscheduled ? PS_UNSCHEDULED_PAGE
                                                 : PS_PENDING_PAGE;
    const char *p[7] = {int_text(t[0], after_deadline_ms),
                        after_id,
                        int_text(t[1], filter->due_before_ms),
                        int_text(t[2], filter->created_before_ms),
                        int_text(t[3], (int64_t)page->cap),
                        filter->with_holds ? "true" : "false",
                        int_text(t[4], claim)};
    PGresult *res = NULL;
    lapse_status_t rc = ensure_conn(s, err);
    /* A mapped walk goes on exactly after the last order it returned when the caller's
     * cursor is that order; otherwise from the cursor's millisecond on (an order seen
     * again is harmless, one skipped would not be). */
    s->cursor_ts[0] = '\0';
    if (s->map != NULL && after_id != NULL && after_deadline_ms == s->cursor_ms &&
        strcmp(after_id, s->cursor_id) == 0) {
        snprintf(s->cursor_ts, sizeof s->cursor_ts, "%s", s->cursor_exact);
    }
    if (rc == LAPSE_OK) {
        rc = exec_v(s, id, &res, claiming ? 7 : 6, p, err);
    }
    s->cursor_ts[0] = '\0';
    int rows = rc == LAPSE_OK ? lapse__pq.PQntuples(res) : 0;
    if (s->map != NULL && rows > 0) {
        snprintf(s->cursor_exact, sizeof s->cursor_exact, "%s",
                 lapse__pq.PQgetvalue(res, rows - 1, 5));
        snprintf(s->cursor_id, sizeof s->cursor_id, "%s",
                 lapse__pq.PQgetvalue(res, rows - 1, 0));
        s->cursor_ms = col_int(res, rows - 1, 1);
    }
    for (int r = 0; rc == LAPSE_OK && r < rows && page->n < page->cap; r++) {
        lapse_order_t *order = &page->items[page->n];
        size_t len = (size_t)lapse__pq.PQgetlength(res, r, 0);
        if (s->map != NULL &&
            !lapse_order_id_is_valid(lapse__pq.PQgetvalue(res, r, 0), len)) {
            continue; /* a shop's id lapse could never publish: not its business */
        }
        if (len > LAPSE_ORDER_ID_MAX) {
            rc = lapse_error_set(err, LAPSE_ERR_STORE_SQL, "pending: bad order id");
            break;
        }
        memcpy(order->order_id, lapse__pq.PQgetvalue(res, r, 0), len + 1);
        order->status = LAPSE_ORDER_PENDING;
        order->deadline_ms = col_int(res, r, 1);
        order->created_at_ms = col_int(res, r, 2);
        order->scheduled = col_int(res, r, 3) != 0;
        page->n++;
        if (!lapse__pq.PQgetisnull(res, r, 4)) {
            rc = parse_holds(lapse__pq.PQgetvalue(res, r, 4), order, err);
        }
    }
    if (rc == LAPSE_OK && claiming && s->map == NULL && page->n > 1) {
        qsort(page->items, page->n, sizeof(page->items[0]), by_deadline_id);
    }
    lapse__pq.PQclear(res);
    return rc;
}

/* ---- pruning ---- */

static lapse_status_t pg_prune(lapse_store_t *store, int64_t before_ms, int64_t limit,
                               int64_t *orders, int64_t *events, lapse_error_t *err) {
    pg_store_t *s = as_pg(store);
    char t[2][32];
    const char *p[2] = {int_text(t[0], before_ms), int_text(t[1], limit)};
    PGresult *o = NULL, *e = NULL;
    /* Holds go with their orders (ON DELETE CASCADE); rows another session holds are
     * skipped, for the next run. */
    lapse_status_t rc = begin(s, err);
    if (rc == LAPSE_OK) {
        rc = exec_v(s, PS_PRUNE_ORDERS, &o, 2, p, err);
    }
    if (rc == LAPSE_OK) {
        rc = exec_v(s, PS_PRUNE_EVENTS, &e, 2, p, err);
    }
    if (rc == LAPSE_OK) {
        *orders = strtoll(lapse__pq.PQcmdTuples(o), NULL, 10);
        *events = strtoll(lapse__pq.PQcmdTuples(e), NULL, 10);
    }
    lapse__pq.PQclear(o);
    lapse__pq.PQclear(e);
    return end(s, rc, err);
}

/* ---- opening ---- */

/* s->sql[i]: the statement with every "@." replaced by the quoted schema and a dot. */
static lapse_status_t expand(const char *quoted, const char *sql, char **out) {
    buf_t b = {.ok = true};
    for (const char *p = sql; *p != '\0';) {
        const char *at = strstr(p, "@.");
        size_t len = at != NULL ? (size_t)(at - p) : strlen(p);
        buf_put(&b, p, len);
        if (at == NULL) {
            break;
        }
        buf_str(&b, quoted);
        buf_put(&b, ".", 1);
        p = at + 2;
    }
    if (b.p == NULL) {
        buf_str(&b, "");
    }
    *out = b.ok ? b.p : NULL;
    if (!b.ok) {
        free(b.p);
    }
    return *out != NULL ? LAPSE_OK : LAPSE_ERR_NOMEM;
}

static void pg_close(lapse_store_t *store) {
    pg_store_t *s = as_pg(store);
    for (int i = 0; i < PS_COUNT_; i++) {
        free(s->sql[i]);
    }
    if (s->conn != NULL) {
        lapse__pq.PQfinish(s->conn);
    }
    lapse__pg_map_free(s->map);
    free(s->uri);
    free(s->schema);
    free(s);
}

/* The schema's version: 0 when lapse's version table does not exist. */
static lapse_status_t schema_version(pg_store_t *s, const char *quoted, int *version,
                                     lapse_error_t *err) {
    char *sql = NULL;
    *version = 0;
    if (expand(quoted, "SELECT to_regclass('@.lapse_schema') IS NOT NULL", &sql) !=
        LAPSE_OK) {
        return nomem(err, "schema");
    }
    PGresult *res = lapse__pq.PQexec(s->conn, sql);
    free(sql);
    lapse_status_t rc = LAPSE_OK;
    if (lapse__pq.PQresultStatus(res) != PGRES_TUPLES_OK) {
        rc = fail_result(s, res, "schema", err);
    } else if (strcmp(lapse__pq.PQgetvalue(res, 0, 0), "t") == 0) {
        lapse__pq.PQclear(res);
        res = NULL;
        if (expand(quoted, "SELECT coalesce(max(version), 0) FROM @.lapse_schema",
                   &sql) != LAPSE_OK) {
            return nomem(err, "schema");
        }
        res = lapse__pq.PQexec(s->conn, sql);
        free(sql);
        if (lapse__pq.PQresultStatus(res) != PGRES_TUPLES_OK) {
            rc = fail_result(s, res, "schema version", err);
        } else {
            *version = (int)col_int(res, 0, 0);
        }
    }
    lapse__pq.PQclear(res);
    return rc;
}

/* Creates or migrates lapse's schema, in one transaction under an advisory lock keyed by
 * the schema's name: consumers starting at once queue up and the later ones find the work
 * done. Only when the version is behind is the lock taken at all. */
static lapse_status_t migrate(pg_store_t *s, const char *quoted, bool must_exist,
                              lapse_error_t *err) {
    int version = 0;
    lapse_status_t rc = schema_version(s, quoted, &version, err);
    if (rc != LAPSE_OK || version == PG_SCHEMA_VERSION) {
        return rc;
    }
    if (version > PG_SCHEMA_VERSION) {
        return lapse_error_set(
            err, LAPSE_ERR_STORE_OPEN,
            "store schema %s is version %d, newer than this lapse (%d)", s->schema,
            version, PG_SCHEMA_VERSION);
    }
    if (version == 0 && must_exist) {
        return lapse_error_set(err, LAPSE_ERR_STORE_MISSING,
                               "store not found: no lapse schema \"%s\" in that database",
                               s->schema);
    }
    buf_t b = {.ok = true};
    char *lock = lapse__pq.PQescapeLiteral(s->conn, s->schema, strlen(s->schema));
    buf_str(&b, PG_BEGIN);
    /* IF [NOT] EXISTS on what is (or is not) there raises NOTICEs, which libpq would
     * print on stderr, between lapse's own log lines. */
    buf_str(&b, "; SET LOCAL client_min_messages = warning");
    buf_str(&b, "; SELECT pg_advisory_xact_lock(hashtextextended('lapse.schema:' || ");
    buf_str(&b, lock != NULL ? lock : "''");
    buf_str(&b, ", 0)); CREATE SCHEMA IF NOT EXISTS ");
    buf_str(&b, quoted);
    buf_str(&b, "; CREATE TABLE IF NOT EXISTS @.lapse_schema (version integer NOT NULL)");
    lapse__pq.PQfreemem(lock);
    char *sql = NULL;
    rc = b.ok && expand(quoted, b.p, &sql) == LAPSE_OK
             ? exec_simple(s, sql, "schema lock", err)
             : nomem(err, "schema");
    free(sql);
    free(b.p);
    if (rc == LAPSE_OK) {
        rc = schema_version(s, quoted, &version, err); /* again, under the lock */
    }
    if (rc == LAPSE_OK && version > PG_SCHEMA_VERSION) {
        rc = lapse_error_set(err, LAPSE_ERR_STORE_OPEN,
                             "store schema %s is version %d, newer than this lapse (%d)",
                             s->schema, version, PG_SCHEMA_VERSION);
    }
    if (rc == LAPSE_OK && version < PG_SCHEMA_VERSION) {
        /* Every step is IF [NOT] EXISTS, so the steps from the version found on apply. */
        b = (buf_t){.ok = true};
        if (version < 1) {
            buf_str(&b, PG_SCHEMA_V1);
        }
        buf_str(&b, PG_SCHEMA_V2);
        buf_str(&b, PG_SCHEMA_V3);
        buf_str(&b,
                "DELETE FROM @.lapse_schema; INSERT INTO @.lapse_schema VALUES (" PG_TEXT(
                    PG_SCHEMA_VERSION) ")");
        rc = b.ok && expand(quoted, b.p, &sql) == LAPSE_OK
                 ? exec_simple(s, sql, "schema", err)
                 : nomem(err, "schema");
        free(sql);
        free(b.p);
    }
    rc = end(s, rc, err);
    if (rc == LAPSE_ERR_STORE_SQL) {
        rc = LAPSE_ERR_STORE_OPEN;
        if (err != NULL) {
            err->code = rc;
        }
    }
    return rc;
}

#define PG_CLASS_OPS_                                                                    \
    .now = pg_now, .insert_orders = pg_insert_orders,                                    \
    .mark_scheduled = pg_mark_scheduled, .pay = pg_pay, .cancel_batch = pg_cancel_batch, \
    .get = pg_get, .count = pg_count, .events_pending = pg_events_pending,               \
    .events_mark_published = pg_events_mark_published,                                   \
    .events_release = pg_events_release, .events_count = pg_events_count,                \
    .pending_page = pg_pending_page, .prune = pg_prune, .close = pg_close

/* The same functions on the shop's table: the statements differ (store_pg_sql.h), and
 * the class says that orders and deadlines are the shop's. */
static const lapse__store_class_t pg_map_class = {
    .name = "postgresql (orders map)",
    .orders_mapped = true,
    PG_CLASS_OPS_,
};

static const lapse__store_class_t pg_class = {
    .name = "postgresql",
    PG_CLASS_OPS_,
};

/* The statement i of this handle: lapse's own, or its mapped form with the map's names
 * filled in and its values numbered after the caller's parameters. */
static char *statement_template(pg_store_t *s, int i) {
    if (s->map == NULL || PG_MAP_SQL[i] == NULL) {
        return strdup(PG_STMT_SQL[i]);
    }
    int n_own = 0;
    for (const char *p = strchr(PG_STMT_SQL[i], '$'); p != NULL; p = strchr(p + 1, '$')) {
        int k = atoi(p + 1);
        n_own = k > n_own ? k : n_own;
    }
    s->n_own[i] = n_own;
    s->mapped[i] = true;
    return lapse__pg_map_expand(s->map, PG_MAP_SQL[i], n_own);
}

lapse_store_t *lapse__store_pg_open(const char *uri, const char *schema,
                                    const char *orders_map, unsigned flags,
                                    lapse_status_t *rc, lapse_error_t *err) {
    if ((*rc = lapse__pq_load(err)) != LAPSE_OK) {
        return NULL;
    }
    pg_store_t *s = calloc(1, sizeof(*s));
    if (s == NULL || (s->uri = strdup(uri)) == NULL ||
        (s->schema = strdup(schema)) == NULL) {
        free(s != NULL ? s->uri : NULL);
        free(s);
        *rc = nomem(err, "opening the store");
        return NULL;
    }
    s->base.cls = &pg_class;
    if ((*rc = connect_db(s, err)) != LAPSE_OK) {
        pg_close(&s->base);
        return NULL;
    }
    char *quoted = lapse__pq.PQescapeIdentifier(s->conn, schema, strlen(schema));
    if (quoted == NULL) {
        *rc = nomem(err, "opening the store");
        pg_close(&s->base);
        return NULL;
    }
    /* The map first: a mistake in it is the operator's to fix before anything else. */
    *rc = LAPSE_OK;
    if (orders_map != NULL) {
        s->map = lapse__pg_map_open(s->conn, orders_map, rc, err);
        if (s->map != NULL) {
            s->base.cls = &pg_map_class;
            s->base.warning = s->map->warning[0] != '\0' ? s->map->warning : NULL;
        }
    }
    if (*rc == LAPSE_OK) {
        *rc = migrate(s, quoted, (flags & LAPSE_STORE_MUST_EXIST) != 0, err);
    }
    for (int i = 0; *rc == LAPSE_OK && i < PS_COUNT_; i++) {
        char *tmpl = statement_template(s, i);
        if (tmpl == NULL || expand(quoted, tmpl, &s->sql[i]) != LAPSE_OK) {
            *rc = nomem(err, "opening the store");
        }
        free(tmpl);
    }
    lapse__pq.PQfreemem(quoted);
    if (*rc != LAPSE_OK) {
        pg_close(&s->base);
        return NULL;
    }
    return &s->base;
}

/* SPDX-License-Identifier: MIT
 * The test store on SQLite or PostgreSQL: see store_fixture.h. */
#include "store_fixture.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <sqlite3.h>

#define BOOLOID 16 /* pg_type.oid of boolean */

struct sf_conn {
    sf_backend_t backend;
    sqlite3 *lite;
    PGconn *pg;
};

static int pg_set_schema(sf_conn_t *c, char *err, size_t cap);

sf_backend_t sf_backend(void) {
    const char *v = getenv("LAPSE_TEST_STORE");
    if (v == NULL || v[0] == '\0' || strcmp(v, "sqlite") == 0) {
        return SF_SQLITE;
    }
    if (strcmp(v, "postgresql") == 0) {
        return SF_PG;
    }
    fprintf(stderr, "store_fixture: LAPSE_TEST_STORE=%s (want sqlite or postgresql)\n",
            v);
    exit(1);
}

const char *sf_backend_name(sf_backend_t backend) {
    return backend == SF_PG ? "postgresql" : "sqlite";
}

#define SQLITE_UNPUBLISHED                                                               \
    "seq >= coalesce((SELECT seq FROM events_published_below), 0)"                       \
    " AND published_at_ms IS NULL"
#define PG_UNPUBLISHED "published_at_ms IS NULL"

const char *sf_unpublished_where(sf_backend_t backend) {
    return backend == SF_PG ? PG_UNPUBLISHED : SQLITE_UNPUBLISHED;
}

const char *sf_sql_unpublished(sf_backend_t backend) {
    return backend == SF_PG ? "SELECT count(*) FROM events WHERE " PG_UNPUBLISHED
                            : "SELECT count(*) FROM events WHERE " SQLITE_UNPUBLISHED;
}

const char *sf_sql_published(sf_backend_t backend) {
    return backend == SF_PG ? "SELECT count(*) FROM events WHERE NOT (" PG_UNPUBLISHED ")"
                            : "SELECT count(*) FROM events WHERE NOT (" SQLITE_UNPUBLISHED
                              ")";
}

static const char *schema(void) {
    const char *v = getenv("LAPSE_STORE_SCHEMA");
    return v != NULL && v[0] != '\0' ? v : "lapse";
}

/* libpq conninfo of database db on the test cluster, or -1 when the environment does
 * not name the cluster. */
static int pg_conninfo(char *buf, size_t cap, const char *db) {
    const char *host = getenv("LAPSE_TEST_PG_HOST");
    const char *port = getenv("LAPSE_TEST_PG_PORT");
    if (host == NULL || port == NULL) {
        fprintf(stderr,
                "store_fixture: LAPSE_TEST_PG_HOST and LAPSE_TEST_PG_PORT must be "
                "set for LAPSE_TEST_STORE=postgresql (run through ctest)\n");
        return -1;
    }
    snprintf(buf, cap, "host='%s' port='%s' dbname='%s' user=postgres", host, port, db);
    return 0;
}

/* A statement on the cluster's `postgres` database (CREATE/DROP DATABASE). */
static int pg_admin(const char *sql) {
    char conninfo[PATH_MAX + 64];
    if (pg_conninfo(conninfo, sizeof conninfo, "postgres") != 0) {
        return -1;
    }
    PGconn *conn = PQconnectdb(conninfo);
    int rc = -1;
    if (PQstatus(conn) != CONNECTION_OK) {
        fprintf(stderr, "store_fixture: connect %s: %s", conninfo, PQerrorMessage(conn));
    } else {
        PGresult *res = PQexec(conn, sql);
        if (PQresultStatus(res) == PGRES_COMMAND_OK) {
            rc = 0;
        } else {
            fprintf(stderr, "store_fixture: %s: %s", sql, PQresultErrorMessage(res));
        }
        PQclear(res);
    }
    PQfinish(conn);
    return rc;
}

/* "lt_<tag>_<pid>_<n>", lower case letters, digits and _ only, at most 63 bytes (the
 * longest identifier PostgreSQL keeps): n tells apart the stores of one process. */
static void pg_db_name(char *buf, size_t cap, const char *tag) {
    static unsigned serial;
    char name[128] = "lt_";
    size_t n = strlen(name);
    char tail[48];
    int tail_len = snprintf(tail, sizeof tail, "_%d_%u", (int)getpid(), serial++);
    for (const char *p = tag; *p != '\0' && n + (size_t)tail_len < 63; p++) {
        name[n++] = isalnum((unsigned char)*p) ? (char)tolower((unsigned char)*p) : '_';
    }
    memcpy(name + n, tail, (size_t)tail_len + 1);
    snprintf(buf, cap, "%.63s", name);
}

int sf_create(sf_store_t *s, const char *tag, const char *dir, const char *file) {
    memset(s, 0, sizeof *s);
    s->backend = sf_backend();
    if (s->backend == SF_PG) {
        pg_db_name(s->db, sizeof s->db, tag);
        char sql[128];
        snprintf(sql, sizeof sql, "CREATE DATABASE \"%s\"", s->db);
        if (pg_conninfo(s->conninfo, sizeof s->conninfo, s->db) != 0 ||
            pg_admin(sql) != 0) {
            return -1;
        }
        snprintf(s->uri, sizeof s->uri, "postgresql://postgres@/%s?host=%s&port=%s",
                 s->db, getenv("LAPSE_TEST_PG_HOST"), getenv("LAPSE_TEST_PG_PORT"));
        return 0;
    }
    if (dir == NULL) {
        snprintf(s->dir, sizeof s->dir, "/tmp/lapse-test-%s-XXXXXX", tag);
        if (mkdtemp(s->dir) == NULL) {
            fprintf(stderr, "store_fixture: mkdtemp %s: %s\n", s->dir, strerror(errno));
            return -1;
        }
        s->own_dir = true;
    } else {
        snprintf(s->dir, sizeof s->dir, "%s", dir);
    }
    snprintf(s->path, sizeof s->path, "%s/%s", s->dir, file != NULL ? file : "store.db");
    snprintf(s->uri, sizeof s->uri, "sqlite:%s", s->path);
    return 0;
}

int sf_drop(sf_store_t *s) {
    if (s->backend == SF_PG) {
        if (s->db[0] == '\0') {
            return 0;
        }
        char sql[128];
        snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS \"%s\" WITH (FORCE)", s->db);
        int rc = pg_admin(sql);
        s->db[0] = '\0';
        return rc;
    }
    static const char *const suffixes[] = {"", "-wal", "-shm", "-journal"};
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        char name[PATH_MAX + 32];
        snprintf(name, sizeof name, "%s%s", s->path, suffixes[i]);
        unlink(name);
    }
    if (s->own_dir && rmdir(s->dir) != 0) {
        fprintf(stderr, "store_fixture: rmdir %s: %s\n", s->dir, strerror(errno));
        return -1;
    }
    s->own_dir = false;
    return 0;
}

sf_conn_t *sf_connect(const sf_store_t *s, bool readonly, char *err, size_t cap) {
    sf_conn_t *c = calloc(1, sizeof *c);
    c->backend = s->backend;
    if (s->backend == SF_PG) {
        c->pg = PQconnectdb(s->conninfo);
        if (PQstatus(c->pg) != CONNECTION_OK) {
            snprintf(err, cap, "connect %s: %s", s->conninfo, PQerrorMessage(c->pg));
            sf_close(c);
            return NULL;
        }
        if (pg_set_schema(c, err, cap) != 0) {
            sf_close(c);
            return NULL;
        }
        return c;
    }
    int flags = readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE;
    if (sqlite3_open_v2(s->path, &c->lite, flags, NULL) != SQLITE_OK) {
        snprintf(err, cap, "open %s: %s", s->path, sqlite3_errmsg(c->lite));
        sf_close(c);
        return NULL;
    }
    sqlite3_busy_timeout(c->lite, 5000);
    return c;
}

void sf_close(sf_conn_t *c) {
    if (c != NULL) {
        sqlite3_close(c->lite);
        PQfinish(c->pg);
        free(c);
    }
}

/* SET search_path to lapse's schema on a new or reset connection. */
static int pg_set_schema(sf_conn_t *c, char *err, size_t cap) {
    char *ident = PQescapeIdentifier(c->pg, schema(), strlen(schema()));
    char sql[256];
    snprintf(sql, sizeof sql, "SET search_path TO %s", ident ? ident : "lapse");
    PQfreemem(ident);
    PGresult *res = PQexec(c->pg, sql);
    int rc = PQresultStatus(res) == PGRES_COMMAND_OK ? 0 : -1;
    if (rc != 0) {
        snprintf(err, cap, "%s: %s", sql, PQerrorMessage(c->pg));
    }
    PQclear(res);
    return rc;
}

/* PostgreSQL: one statement's result. A connection the server dropped (a fault test
 * restarts the cluster, or terminates backends) is opened again, for up to 30 s, and the
 * statement run once more. NULL with err set on failure. */
static PGresult *pg_run(sf_conn_t *c, const char *sql, ExecStatusType want, char *err,
                        size_t cap) {
    for (int attempt = 0;; attempt++) {
        PGresult *res = PQexec(c->pg, sql);
        if (PQresultStatus(res) == want) {
            return res;
        }
        snprintf(err, cap, "%s: %s", sql,
                 res ? PQresultErrorMessage(res) : PQerrorMessage(c->pg));
        /* The connection is lost when libpq says so, or (it may not know yet) when the
         * error has no SQLSTATE from the server, or one of class 08 (connection) or 57P
         * (the server shutting down). */
        const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
        bool lost = PQstatus(c->pg) != CONNECTION_OK || state == NULL ||
                    strncmp(state, "08", 2) == 0 || strncmp(state, "57P", 3) == 0;
        PQclear(res);
        if (!lost || attempt >= 60) {
            return NULL;
        }
        fprintf(stderr, "store_fixture: connection lost (%s); connecting again\n",
                PQerrorMessage(c->pg));
        do {
            usleep(500 * 1000);
            PQreset(c->pg);
        } while (PQstatus(c->pg) != CONNECTION_OK && ++attempt < 60);
        char set_err[512];
        if (PQstatus(c->pg) == CONNECTION_OK &&
            pg_set_schema(c, set_err, sizeof set_err) != 0) {
            snprintf(err, cap, "%s", set_err);
            return NULL;
        }
    }
}

int sf_exec(sf_conn_t *c, const char *sql, char *err, size_t cap) {
    if (c->backend == SF_PG) {
        PGresult *res = pg_run(c, sql, PGRES_COMMAND_OK, err, cap);
        PQclear(res);
        return res != NULL ? 0 : -1;
    }
    char *msg = NULL;
    if (sqlite3_exec(c->lite, sql, NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(err, cap, "%s: %s", sql, msg ? msg : sqlite3_errmsg(c->lite));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

int64_t sf_query_rows(sf_conn_t *c, const char *sql, sf_row_cb row, void *opaque,
                      char *err, size_t cap) {
    enum { MAX_COLS = 16 };
    const char *values[MAX_COLS];
    int64_t n = 0;
    if (c->backend == SF_PG) {
        PGresult *res = pg_run(c, sql, PGRES_TUPLES_OK, err, cap);
        if (res == NULL) {
            return -1;
        }
        int cols = PQnfields(res) < MAX_COLS ? PQnfields(res) : MAX_COLS;
        for (int r = 0; r < PQntuples(res); r++, n++) {
            for (int k = 0; k < cols; k++) {
                values[k] = PQgetisnull(res, r, k) ? NULL : PQgetvalue(res, r, k);
                if (values[k] != NULL && PQftype(res, k) == BOOLOID) {
                    values[k] = values[k][0] == 't' ? "1" : "0";
                }
            }
            if (row != NULL) {
                row(opaque, cols, values);
            }
        }
        PQclear(res);
        return n;
    }
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(c->lite, sql, -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, cap, "%s: %s", sql, sqlite3_errmsg(c->lite));
        return -1;
    }
    int cols = sqlite3_column_count(st) < MAX_COLS ? sqlite3_column_count(st) : MAX_COLS;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        for (int k = 0; k < cols; k++) {
            values[k] = (const char *)sqlite3_column_text(st, k);
        }
        if (row != NULL) {
            row(opaque, cols, values);
        }
        n++;
    }
    if (rc != SQLITE_DONE) {
        snprintf(err, cap, "%s: %s", sql, sqlite3_errmsg(c->lite));
        n = -1;
    }
    sqlite3_finalize(st);
    return n;
}

typedef struct first_int {
    bool seen;
    int64_t value;
} first_int_t;

static void take_first(void *opaque, int n_cols, const char *const *values) {
    first_int_t *f = opaque;
    if (!f->seen && n_cols > 0) {
        f->seen = true;
        f->value = values[0] != NULL ? strtoll(values[0], NULL, 10) : 0;
    }
}

int sf_query_int(sf_conn_t *c, const char *sql, int64_t *out, char *err, size_t cap) {
    first_int_t f = {0};
    if (c->backend == SF_SQLITE) {
        /* Read as SQLite's own integer conversion does (a REAL or TEXT column too). */
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(c->lite, sql, -1, &st, NULL) != SQLITE_OK) {
            snprintf(err, cap, "%s: %s", sql, sqlite3_errmsg(c->lite));
            return -1;
        }
        int rc = sqlite3_step(st);
        *out = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
        if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
            snprintf(err, cap, "%s: %s", sql, sqlite3_errmsg(c->lite));
        }
        sqlite3_finalize(st);
        return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : -1;
    }
    if (sf_query_rows(c, sql, take_first, &f, err, cap) < 0) {
        return -1;
    }
    *out = f.seen ? f.value : -1;
    return 0;
}

bool sf_table_exists(sf_conn_t *c, const char *table) {
    char sql[256], err[512];
    int64_t n = 0;
    if (c->backend == SF_PG) {
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"
                 " AND tablename = '%s'",
                 table);
    } else {
        snprintf(
            sql, sizeof sql,
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '%s'",
            table);
    }
    return sf_query_int(c, sql, &n, err, sizeof err) == 0 && n > 0;
}

bool sf_exists(const sf_store_t *s) {
    if (s->backend == SF_SQLITE) {
        return access(s->path, F_OK) == 0;
    }
    char err[1024];
    sf_conn_t *c = sf_connect(s, true, err, sizeof err);
    bool exists = c != NULL && sf_table_exists(c, "orders");
    sf_close(c);
    return exists;
}

/* SPDX-License-Identifier: MIT
 * The test store: a fresh store for the backend the environment names, and a connection
 * of the test's own for reading (or changing) what the store holds, on either backend.
 *
 * LAPSE_TEST_STORE selects the backend: "sqlite" (the default) or "postgresql". For
 * PostgreSQL, LAPSE_TEST_PG_HOST (the private cluster's socket dir) and
 * LAPSE_TEST_PG_PORT say where the cluster is (ctest sets them; tests/support/pg-node
 * runs it); each store is a database of its own, created on the cluster's `postgres`
 * database and dropped afterwards. Queries run with search_path set to lapse's schema
 * (LAPSE_STORE_SCHEMA, default "lapse"), so the same SQL (table and column names are
 * the same on both backends) reads either. Used by the integration harness and the unit
 * store tests. */
#ifndef LAPSE_TEST_STORE_FIXTURE_H
#define LAPSE_TEST_STORE_FIXTURE_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum sf_backend { SF_SQLITE = 0, SF_PG = 1 } sf_backend_t;

/* The backend of LAPSE_TEST_STORE; exits with a message on a value it does not know. */
sf_backend_t sf_backend(void);
/* "sqlite" or "postgresql". */
const char *sf_backend_name(sf_backend_t backend);

typedef struct sf_store {
    sf_backend_t backend;
    char uri[PATH_MAX + 160];     /* the store URI to give lapse */
    char dir[PATH_MAX];           /* SQLite: the directory of the file */
    char path[PATH_MAX + 16];     /* SQLite: <dir>/store.db; PostgreSQL: "" */
    char db[64];                  /* PostgreSQL: the database; SQLite: "" */
    char conninfo[PATH_MAX + 64]; /* PostgreSQL: libpq conninfo of db */
    bool own_dir;                 /* dir was made by sf_create, removed by sf_drop */
} sf_store_t;

/* A fresh, empty store on the backend of LAPSE_TEST_STORE; nothing is opened, so the
 * schema appears with the first lapse_store_open (or lapse command). SQLite: the URI of
 * <dir>/<file> (file "store.db" when NULL); when dir is NULL a new temporary directory
 * /tmp/lapse-test-<tag>-XXXXXX is made. PostgreSQL: a new database named after tag and
 * the process (dir and file unused). Returns 0, or -1 with the reason on stderr. */
int sf_create(sf_store_t *s, const char *tag, const char *dir, const char *file);
/* Remove the store: the SQLite file with its -wal, -shm and -journal (and the
 * directory when sf_create made it), or DROP DATABASE ... WITH (FORCE). Returns 0, or
 * -1 with the reason on stderr. */
int sf_drop(sf_store_t *s);

/* For tests (cmocka included before this header): on PostgreSQL, print why and skip the
 * rest of the test; on SQLite, nothing. For what is about SQLite itself. */
#define SF_SKIP_ON_PG(why)                                                               \
    do {                                                                                 \
        if (sf_backend() == SF_PG) {                                                     \
            print_message("skip on PostgreSQL: %s\n", why);                              \
            skip();                                                                      \
        }                                                                                \
    } while (0)

/* Whether lapse has created the store: the SQLite file exists, or lapse's schema in the
 * PostgreSQL database has its orders table. */
bool sf_exists(const sf_store_t *s);

/* A connection of the test's own (one per thread). Read-only on SQLite when readonly;
 * PostgreSQL ignores the flag. NULL when the store cannot be opened (on SQLite: there
 * is no file yet), with the reason in err. */
typedef struct sf_conn sf_conn_t;
sf_conn_t *sf_connect(const sf_store_t *s, bool readonly, char *err, size_t cap);
void sf_close(sf_conn_t *c);

/* The first column of the first row as an integer, as SQLite reads one: NULL is 0, a
 * boolean 1 or 0, no row -1. Returns 0, or -1 with the error in err (a table that does
 * not exist yet is an error on both backends). */
int sf_query_int(sf_conn_t *c, const char *sql, int64_t *out, char *err, size_t cap);
/* Run one or more statements that return no rows. Returns 0, or -1 with the error. */
int sf_exec(sf_conn_t *c, const char *sql, char *err, size_t cap);
/* Call row(opaque, n_cols, values) for each row of the query, values as text (NULL for
 * NULL; a boolean as "1" or "0"). Returns the number of rows, or -1 with the error. */
typedef void (*sf_row_cb)(void *opaque, int n_cols, const char *const *values);
int64_t sf_query_rows(sf_conn_t *c, const char *sql, sf_row_cb row, void *opaque,
                      char *err, size_t cap);
/* Whether table (of lapse's schema) exists yet. */
bool sf_table_exists(sf_conn_t *c, const char *table);

/* How many events of the outbox are unpublished, and how many published, as a query
 * for sf_query_int on backend: on PostgreSQL published_at_ms says it; on SQLite (schema
 * version 8) an event below events_published_below's seq is published whatever its
 * published_at_ms, which a mark of a run from that seq leaves NULL. Static strings. */
const char *sf_sql_unpublished(sf_backend_t backend);
const char *sf_sql_published(sf_backend_t backend);
/* The condition on a row of events that holds while it is unpublished (the same rule). */
const char *sf_unpublished_where(sf_backend_t backend);

#endif

/* SPDX-License-Identifier: MIT
 * Internal: libsqlite3, loaded on first use (dynlib_int.h), like libpq: a process on a
 * PostgreSQL store never maps it, nor the libm it brings (about 0.6 MB of RSS). The
 * SQLite backend calls it through lapse__sq.sqlite3_xxx, each pointer of SQLite's own
 * prototype (sqlite3.h), so a wrong call is still a compile error. */
#ifndef LAPSE_SQLITE_API_INT_H
#define LAPSE_SQLITE_API_INT_H

#include <lapse/lapse.h>

#include <sqlite3.h>

#include "dynlib_int.h"

/* Every libsqlite3 function lapse calls; a new call means a new line here. */
#define LAPSE__SQLITE_SYMS(X, a)                                                         \
    X(a, sqlite3_bind_int64)                                                             \
    X(a, sqlite3_bind_text)                                                              \
    X(a, sqlite3_busy_timeout)                                                           \
    X(a, sqlite3_changes)                                                                \
    X(a, sqlite3_clear_bindings)                                                         \
    X(a, sqlite3_close)                                                                  \
    X(a, sqlite3_column_bytes)                                                           \
    X(a, sqlite3_column_int)                                                             \
    X(a, sqlite3_column_int64)                                                           \
    X(a, sqlite3_column_text)                                                            \
    X(a, sqlite3_column_type)                                                            \
    X(a, sqlite3_database_file_object)                                                   \
    X(a, sqlite3_db_filename)                                                            \
    X(a, sqlite3_errmsg)                                                                 \
    X(a, sqlite3_errstr)                                                                 \
    X(a, sqlite3_exec)                                                                   \
    X(a, sqlite3_extended_result_codes)                                                  \
    X(a, sqlite3_finalize)                                                               \
    X(a, sqlite3_get_autocommit)                                                         \
    X(a, sqlite3_open_v2)                                                                \
    X(a, sqlite3_prepare_v2)                                                             \
    X(a, sqlite3_prepare_v3)                                                             \
    X(a, sqlite3_reset)                                                                  \
    X(a, sqlite3_step)                                                                   \
    X(a, sqlite3_vfs_find)                                                               \
    X(a, sqlite3_vfs_register)

typedef struct lapse__sqlite_api {
    LAPSE__SQLITE_SYMS(LAPSE__DYNSYM_FIELD, _)
} lapse__sqlite_api_t;

/* Set by lapse__sqlite_load; not to be called before it returned LAPSE_OK. */
extern lapse__sqlite_api_t lapse__sq;

/** Load libsqlite3 (once per process). LAPSE_ERR_STORE_OPEN with the reason when it
 *  cannot be loaded. Thread-safety: safe. */
lapse_status_t lapse__sqlite_load(lapse_error_t *err);

#endif

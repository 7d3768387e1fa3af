/* SPDX-License-Identifier: MIT
 * Internal: libpq, loaded on first use (dynlib_int.h). The PostgreSQL backend calls it
 * through lapse__pq.PQxxx, each pointer of libpq's own prototype (libpq-fe.h), so a
 * wrong call is still a compile error. */
#ifndef LAPSE_PQ_API_INT_H
#define LAPSE_PQ_API_INT_H

#include <lapse/lapse.h>

#include <libpq-fe.h>

#include "dynlib_int.h"

/* Every libpq function lapse calls; a new call means a new line here. */
#define LAPSE__PQ_SYMS(X, a)                                                             \
    X(a, PQclear)                                                                        \
    X(a, PQcmdTuples)                                                                    \
    X(a, PQconnectdbParams)                                                              \
    X(a, PQconnectionNeedsPassword)                                                      \
    X(a, PQconninfoFree)                                                                 \
    X(a, PQconninfoParse)                                                                \
    X(a, PQerrorMessage)                                                                 \
    X(a, PQescapeIdentifier)                                                             \
    X(a, PQescapeLiteral)                                                                \
    X(a, PQexec)                                                                         \
    X(a, PQexecParams)                                                                   \
    X(a, PQfinish)                                                                       \
    X(a, PQfreemem)                                                                      \
    X(a, PQgetisnull)                                                                    \
    X(a, PQgetlength)                                                                    \
    X(a, PQgetvalue)                                                                     \
    X(a, PQntuples)                                                                      \
    X(a, PQprepare)                                                                      \
    X(a, PQresultErrorField)                                                             \
    X(a, PQresultErrorMessage)                                                           \
    X(a, PQresultStatus)                                                                 \
    X(a, PQstatus)                                                                       \
    X(a, PQtransactionStatus)

typedef struct lapse__pq_api {
    LAPSE__PQ_SYMS(LAPSE__DYNSYM_FIELD, _)
} lapse__pq_api_t;

/* Set by lapse__pq_load; not to be called before it returned LAPSE_OK. */
extern lapse__pq_api_t lapse__pq;

/** Load libpq (once per process). LAPSE_ERR_STORE_OPEN with the reason when it cannot
 *  be loaded. Thread-safety: safe. */
lapse_status_t lapse__pq_load(lapse_error_t *err);

#endif

/* SPDX-License-Identifier: MIT
 * Internal: libpq, loaded on first use (dynlib_int.h). The PostgreSQL backend calls it
 * through lapse__pq.PQxxx, each pointer of libpq's own prototype (libpq-fe.h), so a
 * wrong call is still a compile error. */
#ifndef LAPSE_PQ_API_INT_H
#define LAPSE_PQ_API_INT_H

#include <lapse/lapse.h>

#include <libpq-fe.h>

/* Every libpq function lapse calls; a new call means a new line here. */
#define LAPSE__PQ_SYMS(X)                                                                \
    X(PQclear)                                                                           \
    X(PQcmdTuples)                                                                       \
    X(PQconnectdbParams)                                                                 \
    X(PQconnectionNeedsPassword)                                                         \
    X(PQconninfoFree)                                                                    \
    X(PQconninfoParse)                                                                   \
    X(PQerrorMessage)                                                                    \
    X(PQescapeIdentifier)                                                                \
    X(PQescapeLiteral)                                                                   \
    X(PQexec)                                                                            \
    X(PQexecParams)                                                                      \
    X(PQfinish)                                                                          \
    X(PQfreemem)                                                                         \
    X(PQgetisnull)                                                                       \
    X(PQgetlength)                                                                       \
    X(PQgetvalue)                                                                        \
    X(PQntuples)                                                                         \
    X(PQprepare)                                                                         \
    X(PQresultErrorField)                                                                \
    X(PQresultErrorMessage)                                                              \
    X(PQresultStatus)                                                                    \
    X(PQstatus)                                                                          \
    X(PQtransactionStatus)

typedef struct lapse__pq_api {
#define LAPSE__PQ_FIELD_(name) __typeof__(&name) name;
    LAPSE__PQ_SYMS(LAPSE__PQ_FIELD_)
#undef LAPSE__PQ_FIELD_
} lapse__pq_api_t;

/* Set by lapse__pq_load; not to be called before it returned LAPSE_OK. */
extern lapse__pq_api_t lapse__pq;

/** Load libpq (once per process). LAPSE_ERR_STORE_OPEN with the reason when it cannot
 *  be loaded. Thread-safety: safe. */
lapse_status_t lapse__pq_load(lapse_error_t *err);

#endif

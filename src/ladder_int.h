/* SPDX-License-Identifier: MIT
 * Internal: the delay ladder. A delay of S whole seconds waits in rung k (a holding queue
 * whose queue-level TTL is 2^k s) for every bit k set in S, highest first. The routing
 * key spells S in binary, one word per rung, most significant first:
 *   "0.0. ... .1.0.1"  (LAPSE__LADDER_RUNGS words)
 * Rung k's topic exchange sends a message whose word for bit k is 1 to rung k's queue and
 * one whose word is 0 on to rung k-1's exchange; rung k's queue dead-letters to rung
 * k-1's exchange with the routing key unchanged. Below rung 0 lies the expired queue.
 * Pure: no broker, no clock. */
#ifndef LAPSE_LADDER_INT_H
#define LAPSE_LADDER_INT_H

#include <lapse/lapse.h>

#include <stddef.h>
#include <stdint.h>

/* 2^0 .. 2^27 s: the longest delay is 2^28 - 1 s, about 8.5 years. */
#define LAPSE__LADDER_RUNGS  28
#define LAPSE__LADDER_MAX_S  ((INT64_C(1) << LAPSE__LADDER_RUNGS) - 1)
#define LAPSE__LADDER_MAX_MS (LAPSE__LADDER_MAX_S * 1000)
/* "b.b. ... .b": one character and one dot per rung. */
#define LAPSE__LADDER_RK_LEN (2 * LAPSE__LADDER_RUNGS)

/* Where a delay enters the ladder. */
typedef struct lapse__ladder_route {
    int64_t seconds;                        /* the delay rounded up to whole seconds */
    int top;                                /* highest rung it waits in: publish there */
    int hops;                               /* rungs it waits in (bits set) */
    char routing_key[LAPSE__LADDER_RK_LEN]; /* NUL-terminated */
} lapse__ladder_route_t;

/**
 * Route a delay of delay_ms: rounded up to the next whole second, at least 1 s, so the
 * ladder may deliver late by under a second, never early.
 * @return LAPSE_OK, or LAPSE_ERR_INVALID when the rounded delay exceeds
 *         LAPSE__LADDER_MAX_S (out untouched).
 */
lapse_status_t lapse__ladder_route(int64_t delay_ms, lapse__ladder_route_t *out);

/** The delay in seconds a routing key spells, or -1 when it is not a ladder key. */
int64_t lapse__ladder_parse_key(const char *routing_key);

/** Rung k's binding pattern: its word equal to bit (0 or 1), every other word "*".
 *  buf must hold LAPSE__LADDER_RK_LEN bytes. */
void lapse__ladder_pattern(int rung, int bit, char *buf);

#endif

/* SPDX-License-Identifier: MIT
 * Internal: the topology as data, shared by declare, export, inspect and the handles. */
#ifndef LAPSE_TOPOLOGY_INT_H
#define LAPSE_TOPOLOGY_INT_H

#include "config_int.h"
#include "ladder_int.h"

#include <lapse/topology.h>

#define LAPSE__NAME_MAX   96
#define LAPSE__RK_EXPIRED "order.expired"

typedef struct lapse__exchange_def {
    char name[LAPSE__NAME_MAX];
    const char *type;                /* static */
    char alternate[LAPSE__NAME_MAX]; /* "" for none */
} lapse__exchange_def_t;

typedef struct lapse__queue_def {
    char name[LAPSE__NAME_MAX];
    int64_t ttl_ms;             /* queue-level x-message-ttl, 0 for none */
    char dlx[LAPSE__NAME_MAX];  /* "" for none */
    char dlrk[LAPSE__NAME_MAX]; /* "" keeps the message's routing key */
} lapse__queue_def_t;

typedef struct lapse__binding_def {
    char source[LAPSE__NAME_MAX];
    char destination[LAPSE__NAME_MAX];
    bool to_exchange; /* an exchange-to-exchange binding */
    char routing_key[LAPSE__NAME_MAX];
} lapse__binding_def_t;

typedef struct lapse__topology {
    lapse__exchange_def_t exchanges[4 + LAPSE__LADDER_RUNGS];
    size_t n_exchanges;
    /* classes, rungs, expired, parked and the optional events queue */
    lapse__queue_def_t queues[LAPSE__MAX_CLASSES + 3 + LAPSE__LADDER_RUNGS];
    size_t n_queues;
    lapse__binding_def_t bindings[LAPSE__MAX_CLASSES + 3 + 2 * LAPSE__LADDER_RUNGS];
    size_t n_bindings;
    /* names the handles use */
    char hold_exchange[LAPSE__NAME_MAX];
    char expired_exchange[LAPSE__NAME_MAX];
    char expired_queue[LAPSE__NAME_MAX];
    char parked_exchange[LAPSE__NAME_MAX];
    char parked_queue[LAPSE__NAME_MAX];
    char events_exchange[LAPSE__NAME_MAX];
    char events_queue[LAPSE__NAME_MAX]; /* "" when the config names none */
    bool quorum; /* every queue a quorum queue; dead-lettering at-least-once */
    /* rung k's exchange and queue share the name "<prefix>.delay.<kk>" */
    char delay[LAPSE__LADDER_RUNGS][LAPSE__NAME_MAX];
} lapse__topology_t;

/** Build the topology of cfg (pure). */
void lapse__topology_build(const lapse_config_t *cfg, lapse__topology_t *topo);

/**
 * Check with passive declares, on a short connection of its own, that what a consumer
 * needs exists: the expired queue, the parked exchange and queue, every delay exchange
 * and queue, the events exchange. Each missing one is logged as one error line naming it
 * and the fix (event=topology_missing). topo is borrowed.
 * @param missing (optional) receives how many are missing.
 * @return LAPSE_OK when the check ran (whatever it found); a broker failure otherwise.
 */
lapse_status_t lapse__topology_check(const lapse_config_t *cfg,
                                     const lapse__topology_t *topo, size_t *missing,
                                     lapse_error_t *err);

#endif

/* SPDX-License-Identifier: MIT
 * The consumer service: take expired messages, cancel due orders, park bad input. */
#ifndef LAPSE_CONSUMER_H
#define LAPSE_CONSUMER_H

#include <signal.h>

#include <lapse/config.h>
#include <lapse/store.h>

/** Opaque consumer. Runs on one thread. */
typedef struct lapse_consumer lapse_consumer_t;

typedef struct lapse_consumer_stats {
    uint64_t deliveries;
    uint64_t cancelled;
    uint64_t noops;   /* paid or already cancelled */
    uint64_t early;   /* put back to wait */
    uint64_t retried; /* sent down the retry path after a store failure */
    uint64_t parked;
    uint64_t events; /* order.cancelled events confirmed */
    uint64_t reconnects;
} lapse_consumer_stats_t;

/** Allocate (no I/O). cfg and store are borrowed and must outlive the consumer. */
LAPSE_API lapse_consumer_t *lapse_consumer_new(const lapse_config_t *cfg,
                                               lapse_store_t *store, lapse_status_t *rc,
                                               lapse_error_t *err);

/**
 * Consume until *stop becomes non-zero (set it from a SIGTERM/SIGINT handler): then the
 * deliveries in hand are finished and acked, the connections closed, and LAPSE_OK
 * returned. Broker and store failures that may pass are retried with backoff; nothing is
 * acked before the store committed. Returns an error only for failures that cannot pass
 * (login refused, topology missing, store unusable).
 */
LAPSE_API lapse_status_t lapse_consumer_run(lapse_consumer_t *consumer,
                                            const volatile sig_atomic_t *stop,
                                            lapse_error_t *err);

/** Counters since lapse_consumer_new. */
LAPSE_API void lapse_consumer_get_stats(const lapse_consumer_t *consumer,
                                        lapse_consumer_stats_t *out);

/** Free; accepts NULL. */
LAPSE_API void lapse_consumer_free(lapse_consumer_t *consumer);

#endif

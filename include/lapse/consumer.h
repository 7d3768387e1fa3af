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

/** What a running consumer is doing (lapse_consumer_set_state_cb). */
typedef enum lapse_consumer_state {
    LAPSE_CONSUMER_CONNECTING = 0, /* connecting, or waiting out a reconnect backoff */
    LAPSE_CONSUMER_CONSUMING = 1, /* subscribed to the expired queue, taking deliveries */
    LAPSE_CONSUMER_STOPPING = 2   /* the stop flag was seen: finishing, then returning */
} lapse_consumer_state_t;

/** Called on lapse_consumer_run's thread when the state changes and again at every turn
 *  of its loop (at least every second, unless a broker or store call is slow), so a
 *  caller can tell a loop that turns from one that is stuck, as a service watchdog
 *  does. detail is borrowed for the call: the queue while consuming, the reason of the
 *  last failure while connecting again ("" at first), "" when stopping. Keep it short:
 *  it runs inside the consume loop. */
typedef void (*lapse_consumer_state_cb)(void *opaque, lapse_consumer_state_t state,
                                        const char *detail);

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

/** Set the state callback (default: none) before lapse_consumer_run; opaque is handed
 *  to it as is. */
LAPSE_API void lapse_consumer_set_state_cb(lapse_consumer_t *consumer,
                                           lapse_consumer_state_cb cb, void *opaque);

/** Counters since lapse_consumer_new. */
LAPSE_API void lapse_consumer_get_stats(const lapse_consumer_t *consumer,
                                        lapse_consumer_stats_t *out);

/** Free; accepts NULL. */
LAPSE_API void lapse_consumer_free(lapse_consumer_t *consumer);

#endif

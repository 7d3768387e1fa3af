/* SPDX-License-Identifier: MIT
 * The publisher: record orders as pending, publish their expiry messages with confirms.
 */
#ifndef LAPSE_PUBLISHER_H
#define LAPSE_PUBLISHER_H

#include <lapse/config.h>
#include <lapse/store.h>

#include <signal.h>

/** The longest delay: 2^28 - 1 s, about 8.5 years (the delay ladder's 28 rungs). */
#define LAPSE_MAX_DELAY_MS (((INT64_C(1) << 28) - 1) * 1000)

/**
 * Check a deadline a user asked for: LAPSE_OK, or LAPSE_ERR_INVALID with a one-line
 * reason in err when it is not after now_ms or more than LAPSE_MAX_DELAY_MS ahead.
 */
LAPSE_API lapse_status_t lapse_deadline_check(int64_t deadline_ms, int64_t now_ms,
                                              lapse_error_t *err);

/** Opaque publisher: one broker connection in confirm mode. One per thread. */
typedef struct lapse_publisher lapse_publisher_t;

/**
 * Outcome of one submitted order, called from submit/flush once the broker settled it.
 * rc: LAPSE_OK (recorded, confirmed, marked scheduled), a store refusal
 * (LAPSE_ERR_STORE_CONFLICT / _STATE), LAPSE_ERR_INVALID (bad id, deadline too far), or a
 * broker failure (the order stays pending and unscheduled). reason and order_id are
 * borrowed for the call.
 */
typedef void (*lapse_publish_cb)(void *opaque, uint64_t ref, const char *order_id,
                                 lapse_status_t rc, const char *reason);

/**
 * Connect to the broker (confirm mode). cfg and store are borrowed and must outlive the
 * publisher. @return new publisher, closed with lapse_publisher_close(); NULL on failure.
 */
LAPSE_API lapse_publisher_t *lapse_publisher_open(const lapse_config_t *cfg,
                                                  lapse_store_t *store,
                                                  lapse_publish_cb cb, void *opaque,
                                                  lapse_status_t *rc, lapse_error_t *err);

/**
 * Queue one order for publishing; order is copied (borrows input). order->deadline_ms
 * is the deadline. timeout_ms is the payment window it was computed from, or 0 for an
 * absolute deadline: a timeout equal to a configured class goes one hop through that
 * class's holding queue; everything else goes down the delay ladder for what remains of
 * the deadline when it is published (rounded up to whole seconds, at least 1 s, so an
 * order whose deadline has passed still gets a message). A deadline more than 2^28-1 s
 * (about 8.5 years) ahead, or an invalid id, is refused through the callback with
 * LAPSE_ERR_INVALID.
 * Batches are recorded in one store transaction and published with pipelined confirms;
 * submit flushes a batch itself once it is full (500) or its first order was submitted
 * 20 ms ago. ref is handed back to the callback.
 * @return LAPSE_OK, or a failure of the store or broker that stops the publisher (every
 *         order not yet settled was reported to the callback with it).
 */
LAPSE_API lapse_status_t lapse_publisher_submit(lapse_publisher_t *pub,
                                                const lapse_new_order_t *order,
                                                int64_t timeout_ms, uint64_t ref,
                                                lapse_error_t *err);

/**
 * Let a stop flag (set by a SIGTERM/SIGINT handler) end every wait of pub: a broker that
 * blocked the connection (memory or disk alarm), confirms, reconnect backoff, a busy
 * store. Once *stop is non-zero, submit and flush return LAPSE_ERR_STOPPED within about a
 * second, and every order not confirmed by then is reported to the callback as failed
 * (it stays pending and unscheduled, for a retry or a sweep); none is reported published
 * that the broker did not confirm. stop is borrowed (NULL: none) and must outlive pub.
 */
LAPSE_API void lapse_publisher_set_stop(lapse_publisher_t *pub,
                                        const volatile sig_atomic_t *stop);

/** Settle everything submitted so far (callbacks called). Same returns as submit. */
LAPSE_API lapse_status_t lapse_publisher_flush(lapse_publisher_t *pub,
                                               lapse_error_t *err);

/** Orders submitted and not reported yet (waiting for a full batch or for confirms):
 *  a caller reading slow input flushes when this is > 0 and no input is ready. */
LAPSE_API size_t lapse_publisher_pending(const lapse_publisher_t *pub);

/** Close the connection. Orders not settled yet (not flushed) are reported to the
 *  callback as LAPSE_ERR_BROKER_CLOSED and stay pending and unscheduled. Accepts NULL. */
LAPSE_API void lapse_publisher_close(lapse_publisher_t *pub);

#endif

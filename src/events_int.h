/* SPDX-License-Identifier: MIT
 * Internal: the events relay. Outbox rows go to <prefix>.events as order.cancelled
 * events, mandatory and confirmed; a row is marked published only when the broker
 * confirmed its publish without returning it. The consumer relays on its publishing
 * connection, the sweep on a connection of its own: both through here. */
#ifndef LAPSE_EVENTS_INT_H
#define LAPSE_EVENTS_INT_H

#include "broker_int.h"

#include <lapse/store.h>

/* Events published in one round: one confirmed batch and one store write. */
#define LAPSE__EVENTS_ROUND 1000
/* How long one round waits for its confirms. */
#define LAPSE__EVENTS_WAIT_MS 30000

/* What one or more rounds did. */
typedef struct lapse__relay_report {
    size_t read;      /* outbox rows read and published */
    size_t published; /* confirmed and not returned: marked published */
    size_t returned;  /* returned by the broker, no queue took them: left in the outbox */
    size_t failed;    /* nacked, or not settled in time: left in the outbox */
} lapse__relay_report_t;

/* A round of the relay that may be left open while its confirms come in (the consumer
 * goes on cancelling meanwhile). Owned by whoever started it; while it is open it is
 * the broker's settle callback for its own publishes (passing every other outcome on),
 * so it must stay at one address and be finished before another round starts on the
 * same connection, and right after the connection closes (the close settles its
 * publishes as failed; a reopened connection numbers its publishes from 1 again). */
typedef struct lapse__relay {
    bool active; /* started and not finished: lapse__relay_finish is owed */
    lapse__broker_t *broker;
    lapse_store_t *store;
    const char *exchange;
    /* The round's publishes have consecutive tags from first_tag: nobody else publishes
     * on the connection while the round publishes (one thread per connection). */
    uint64_t first_tag;
    size_t n, cap, n_settled;
    int64_t *seqs;           /* outbox row of publish i */
    lapse_status_t *outcome; /* its settlement, UNSETTLED until the broker says */
    lapse__settle_cb prev_cb;
    void *prev_opaque;
    lapse_status_t publish_rc;
    lapse_error_t publish_err;
} lapse__relay_t;

/**
 * Start a round: read the unpublished outbox rows (as lapse__events_relay) and publish
 * each, without waiting for the confirms. *r is overwritten; whatever this returns,
 * lapse__relay_finish(r, that status, ...) ends the round (a failed start included).
 */
lapse_status_t lapse__relay_start(lapse__relay_t *r, lapse__broker_t *broker,
                                  lapse_store_t *store, const char *exchange,
                                  const int64_t *only, size_t n_only, size_t limit,
                                  lapse_error_t *err);

/** Whether the broker has settled every publish of the round (read by the broker's
 *  pump: lapse__broker_poll, or any wait on the connection). */
bool lapse__relay_settled(const lapse__relay_t *r);

/** Wait up to timeout_ms for the round's confirms. */
lapse_status_t lapse__relay_wait(lapse__relay_t *r, int64_t timeout_ms,
                                 lapse_error_t *err);

/**
 * End the round: hand the broker's settle callback back, mark the confirmed rows
 * published and give the others' claims back; a no-op returning rc on a round not
 * active. Afterwards *r is inactive.
 * @param rc the round's status so far (its start, its wait): returned unless it is
 *           LAPSE_OK and the marking failed or some publish was nacked or unsettled.
 * @param report zeroed, then filled.
 */
lapse_status_t lapse__relay_finish(lapse__relay_t *r, lapse_status_t rc,
                                   lapse__relay_report_t *report, lapse_error_t *err);

/**
 * One round: read the unpublished outbox rows (only those in only[0..n_only) when only
 * is not NULL; at most limit), publish each to exchange with routing key
 * order.cancelled, mandatory, wait up to timeout_ms for their confirms, and mark the
 * confirmed and not returned ones published. A returned row stays in the outbox for a
 * later round (it went nowhere, so a later round cannot duplicate it).
 *
 * @param broker a confirm-mode connection, borrowed; for the round, the outcomes of its
 *               own publishes go to the relay, every other one to the broker's settle
 *               callback as before.
 * @param report zeroed, then filled, also on failure.
 * @return LAPSE_OK when every row read was published and settled (returned or not) and
 *         the marking committed; else the first failure (publish, confirms, store), with
 *         the rows confirmed before it marked all the same.
 */
lapse_status_t lapse__events_relay(lapse__broker_t *broker, lapse_store_t *store,
                                   const char *exchange, const int64_t *only,
                                   size_t n_only, size_t limit, int64_t timeout_ms,
                                   lapse__relay_report_t *report, lapse_error_t *err);

/** Asked between rounds of lapse__events_drain(); true stops it. */
typedef bool (*lapse__relay_stop_fn)(void *opaque);

/**
 * Rounds of lapse__events_relay() over the whole outbox, oldest first, until it is empty,
 * a row is returned (no queue bound: the rest would be returned too), a round fails,
 * deadline_ms (lapse__mono_ms() time) passes, or stop (optional) says so.
 * @param total zeroed, then the sum of the rounds.
 * @return LAPSE_OK or the failed round's status.
 */
lapse_status_t lapse__events_drain(lapse__broker_t *broker, lapse_store_t *store,
                                   const char *exchange, int64_t deadline_ms,
                                   lapse__relay_stop_fn stop, void *stop_opaque,
                                   lapse__relay_report_t *total, lapse_error_t *err);

/** Add b's counts to a's. */
void lapse__relay_report_add(lapse__relay_report_t *a, const lapse__relay_report_t *b);

#endif

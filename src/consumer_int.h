/* SPDX-License-Identifier: MIT
 * Internal: the consumer's state, shared by its consuming side (consumer.c) and its
 * publishing side (consumer_out.c: parking, re-holding, events). */
#ifndef LAPSE_CONSUMER_INT_H
#define LAPSE_CONSUMER_INT_H

#include <lapse/consumer.h>

#include "broker_int.h"
#include "topology_int.h"

/* Publishes in flight on the publishing connection. */
#define CONSUMER_WINDOW 1000
/* How long a batch waits to fill after its first delivery. */
#define CONSUMER_BATCH_WINDOW_MS 20
/* How often an idle consumer looks at the stop flag. */
#define CONSUMER_IDLE_WAIT_MS    500
#define CONSUMER_CONFIRM_WAIT_MS 30000
/* How long the publishing connection waits for a broker that blocked it (an alarm). */
#define CONSUMER_BLOCKED_WAIT_MS 1000
/* Outbox rows published in one go, and how often the outbox is looked at. */
#define CONSUMER_EVENTS_CHUNK 1000
/* How long a cancellation's event may wait for those of the next batches. */
#define CONSUMER_EVENTS_DELAY_MS  50
#define CONSUMER_BACKLOG_EVERY_MS 5000
/* Events no queue took are tried again after a delay growing between these. */
#define CONSUMER_EVENTS_RETRY_MIN_MS 1000
#define CONSUMER_EVENTS_RETRY_MAX_MS 30000
/* On SIGTERM/SIGINT, how long the consumer keeps publishing the events it owes. */
#define CONSUMER_STOP_EVENTS_MS 5000
/* Events of its own cancellations a consumer remembers while they cannot go out; older
 * ones are left to the backlog pass (8 bytes each). */
#define CONSUMER_OWED_MAX 100000
/* Orders one sweep call handles per part before deliveries get their turn again. */
#define CONSUMER_SWEEP_CHUNK 1000
/* Busy retries of one batch in process (each may wait out SQLite's 5 s busy timeout)
 * before its deliveries take the retry path. */
#define CONSUMER_STORE_ATTEMPTS 2
/* The retry path: attempt a waits min(2^(a-1) s, this) on the ladder. */
#define CONSUMER_RETRY_MAX_DELAY_MS 300000
/* x-death times have a resolution of one second: an upper bound on how far this
 * consumer's clock runs ahead of the broker's is only used when it exceeds that plus a
 * margin for delivery latency (otherwise an on-time message would look early). */
#define CONSUMER_SKEW_TOLERANCE_MS 1250
/* Skew samples are kept for one to two of these, so that a clock step is noticed. */
#define CONSUMER_SKEW_BUCKET_MS 60000

typedef enum action { ACT_CANCEL, ACT_EARLY, ACT_RETRY, ACT_PARK, ACT_DONE } action_t;

typedef struct delivery {
    amqp_envelope_t env;
    lapse_expiry_msg_t msg;
    action_t action;
    bool undated;        /* never dead-lettered: no broker time vouches for it */
    int attempts;        /* failed attempts before this delivery (x-lapse-attempts) */
    int64_t deadline_ms; /* the deadline to wait for (early) */
    char reason[256];    /* why it is parked */
    uint64_t fwd_tag;    /* its forward's publish tag on the out connection, 0: none */
    /* Its forward's outcome (LAPSE_ERR_BROKER_TIMEOUT while unsettled). */
    lapse_status_t fwd_rc;
} delivery_t;

/* An upper bound on how far the local clock runs ahead of the broker's, learnt from the
 * x-death times of deliveries (INT64_MAX: no sample). */
typedef struct skew {
    int64_t current;  /* min sample in the current bucket */
    int64_t previous; /* min sample in the bucket before */
    int64_t bucket_at;
} skew_t;

struct lapse_consumer {
    const lapse_config_t *cfg;
    lapse_store_t *store;
    lapse__topology_t topo;
    char name[96];       /* connection name and consumer tag */
    lapse__broker_t in;  /* deliveries and acks */
    lapse__broker_t out; /* parking, re-holding, events: confirm mode */
    delivery_t *batch;
    size_t n;
    size_t cap;
    lapse_cancel_item_t *items;
    size_t *item_of;   /* items index -> batch index */
    bool *item_failed; /* the store could not settle items[k]: retry path */
    int64_t *seqs;     /* outbox seqs of the batch's cancellations */
    size_t n_seqs;
    int64_t *owed; /* outbox seqs of this consumer's cancellations not yet published,
                      oldest first, at most CONSUMER_OWED_MAX */
    size_t n_owed;
    int64_t owed_since;
    lapse_status_t out_failure; /* first failed confirm since the last check */
    int64_t events_retry_at;    /* events were returned: none published before this */
    unsigned events_attempt;    /* returned rounds in a row (0: events get through) */
    int64_t out_retry_at;       /* when to reopen a failed publishing connection */
    unsigned out_attempt;
    int64_t backlog_at;    /* next look at the outbox */
    int64_t out_polled_at; /* last heartbeat service of the publishing connection */
    int64_t sweep_at;      /* next sweep (0: at start) */
    skew_t skew;
    int64_t skew_logged; /* last bound logged, to log changes only */
    lapse_consumer_stats_t stats;
    const volatile sig_atomic_t *stop; /* lapse_consumer_run's, for the brokers' waits */
    /* lapse__consumer_forward acked and nacked the batch delivery by delivery (some
     * forward failed): the batch's multiple ack must not follow. */
    bool batch_settled;
    unsigned fwd_attempt; /* batches in a row with a failed forward */
};

/** How far (ms) the local clock may run ahead of the broker's, as learnt from x-death
 *  times; 0 when within the tolerance or unknown. */
int64_t lapse__consumer_skew_bound(const lapse_consumer_t *c);

/** The latest x-death time of a message (broker clock, whole seconds, in ms), or -1
 *  when it was never dead-lettered. */
int64_t lapse__dead_lettered_at_ms(const amqp_basic_properties_t *props);

/** Add one upper bound (local_now - a broker time seen at or before it) to the skew. */
void lapse__consumer_skew_sample(lapse_consumer_t *c, int64_t sample);

/** On the consuming connection before basic.consume: probe the broker's clock. */
void lapse__consumer_probe_clock(lapse_consumer_t *c);

/** Make text one log token: quotes and line breaks become apostrophes. */
void lapse__consumer_sanitize(char *text);

/** (Re)open the publishing connection unless it is up or waiting out its backoff. */
lapse_status_t lapse__consumer_ensure_out(lapse_consumer_t *c, lapse_error_t *err);

/** Publish the batch's parked and re-held deliveries; all confirmed on LAPSE_OK, unless
 *  c->batch_settled: then some forward failed, and the deliveries were acked one by one
 *  (those settled: forward confirmed, or none needed) or, after a backoff, nacked back
 *  to the queue (the rest), so that a forward that keeps failing holds up only its own
 *  deliveries, never the queue. */
lapse_status_t lapse__consumer_forward(lapse_consumer_t *c, int64_t now,
                                       lapse_error_t *err);

/** Publish outbox events through the relay (only the seqs in only[0..n_only) when only
 *  is not NULL), at most limit. True when they went through. Failures are logged and
 *  left in the outbox; returned events hold all events back for a growing delay, after
 *  which the oldest goes alone first, as a probe. */
bool lapse__consumer_events(lapse_consumer_t *c, const int64_t *only, size_t n_only,
                            size_t limit);

/** Remember seqs (outbox rows of this consumer's cancellations) as owed. */
void lapse__consumer_owe(lapse_consumer_t *c, const int64_t *seqs, size_t n);

/** When owed events may be tried next (the events' or the connection's backoff). */
int64_t lapse__consumer_owed_due(const lapse_consumer_t *c);

/** Publish the owed events when CONSUMER_EVENTS_CHUNK of them wait, or the oldest has
 *  waited CONSUMER_EVENTS_DELAY_MS, or now; never during a backoff. They stay owed until
 *  they went through. */
void lapse__consumer_events_owed(lapse_consumer_t *c, bool now);

/** On stop: publish the owed events (those of this consumer's cancellations only: the
 *  rest of the outbox may be another consumer's) for at most CONSUMER_STOP_EVENTS_MS,
 *  ignoring every backoff; log the outcome and the outbox backlog; close the publishing
 *  connection. */
void lapse__consumer_events_final(lapse_consumer_t *c);

/** Heartbeats of the publishing connection, the outbox backlog and the sweep, now and
 *  then. */
void lapse__consumer_housekeeping(lapse_consumer_t *c);

#endif

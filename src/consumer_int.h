/* SPDX-License-Identifier: MIT
 * Internal: the consumer's state, shared by the files that carry out its work
 * (docs/design.md, "The data path, file by file"): consumer.c takes deliveries, gathers
 * the facts, has decision.c decide and settles; consumer_forward.c publishes parked,
 * early and retried deliveries on the publishing connection; consumer_events.c publishes
 * the owed order.cancelled events; consumer_clock.c keeps the broker-clock floor
 * (samples, probe, steps); consumer_sweep.c runs the safety net in process. */
#ifndef LAPSE_CONSUMER_INT_H
/* Bytes of a delivery's body the consumer keeps: a larger body is parked with its first
 * CONSUMER_BODY_KEEP bytes and its size, read past without being held whole. Above the
 * decoder's limit (LAPSE_MSG_MAX_BODY), so a slightly oversized body is parked verbatim;
 * small enough that a batch of them stays a few MB. */
#define CONSUMER_BODY_KEEP 16384
#define LAPSE_CONSUMER_INT_H

#include <lapse/consumer.h>

#include "broker_int.h"
#include "clock_int.h"
#include "decision_int.h"
#include "events_int.h"
#include "metrics_int.h"
#include "topology_int.h"

/* Every interval below is measured on the monotonic clock (lapse__mono_ms): a step of
 * the wall clock neither stretches nor shortens a wait. */

/* Publishes in flight on the publishing connection. */
#define CONSUMER_WINDOW 1000
/* How long a batch waits to fill after its first delivery. */
#define CONSUMER_BATCH_WINDOW_MS 20
/* While a batch fills, a wait for its next deliveries ends only once this many bytes have
 * come, or at the end of the batch window (lapse__broker_set_lowat): a consumer faster
 * than the broker woke for every few deliveries, a poll and two recvs each time (issue
 * 14: 0.82 of its 1.25 system calls per order). Only while the batch has room for
 * CONSUMER_LOWAT_BYTES / CONSUMER_LOWAT_DELIVERY more deliveries (no delivery takes
 * fewer bytes on the wire), so a batch near its cap is never held back by it; a batch
 * that the queue leaves short waited for the window's end before as well. */
#define CONSUMER_LOWAT_BYTES    8192
#define CONSUMER_LOWAT_DELIVERY 64
/* How often an idle consumer looks at the stop flag. */
#define CONSUMER_IDLE_WAIT_MS    500
#define CONSUMER_CONFIRM_WAIT_MS 30000
/* How long the publishing connection waits for a broker that blocked it (an alarm). */
#define CONSUMER_BLOCKED_WAIT_MS 1000
/* Outbox rows published in one go, and how often the outbox is looked at. */
#define CONSUMER_EVENTS_CHUNK 1000
/* How long a cancellation's event may wait for those of the next batches. */
#define CONSUMER_EVENTS_DELAY_MS 50
/* While a round of events waits for its confirms and no delivery comes, its confirms are
 * looked for this often. */
#define CONSUMER_RELAY_POLL_MS    5
#define CONSUMER_BACKLOG_EVERY_MS 5000
/* Events no queue took are tried again after a delay growing between these. */
#define CONSUMER_EVENTS_RETRY_MIN_MS 1000
#define CONSUMER_EVENTS_RETRY_MAX_MS 30000
/* On SIGTERM/SIGINT, how long the consumer keeps publishing the events it owes. */
#define CONSUMER_STOP_EVENTS_MS 5000
/* Events of its own cancellations a consumer remembers while they cannot go out; older
 * ones are left to the backlog pass (8 bytes each). Only events held back (no queue
 * bound, no connection) ever reach it: when cancelling merely runs ahead of the events'
 * confirms, the consumer waits for the open round before it owes more (issue 14: a
 * 100k drain at 11k orders/s had left 1702 events to the backlog at its stop). It was
 * 100000: 800 KB that a consumer with no events queue filled within a minute, the
 * whole of its peak RSS growth from 10k to 1M orders. */
#define CONSUMER_OWED_MAX 8192
/* Orders one sweep call handles per part, and the time one call may take (it may
 * overrun by one store wait, SQLite's 5 s busy timeout), before deliveries get their
 * turn again. */
#define CONSUMER_SWEEP_CHUNK     1000
#define CONSUMER_SWEEP_BUDGET_MS 2000
/* Pruning (--retention) rides on a sweep this often, the first this long after start:
 * it is never urgent, and a write that waits on a locked SQLite store holds the
 * consumer's loop. */
#define CONSUMER_PRUNE_EVERY_MS (10 * 60 * 1000)
/* Busy retries of one batch in process (each may wait out SQLite's 5 s busy timeout)
 * before its deliveries take the retry path. */
#define CONSUMER_STORE_ATTEMPTS 2
/* The clock probe: the whole of it (connect aside) within this; again this long after a
 * success, or after a failure (logged once), so that an idle consumer's floor does not
 * go stale and a failing probe is never a loop. */
#define CONSUMER_PROBE_DEADLINE_MS 5000
#define CONSUMER_PROBE_EVERY_MS    (30 * 60 * 1000)
#define CONSUMER_PROBE_RETRY_MS    60000

/* The longest reason a delivery carries (header x-lapse-reason, log lines). */
#define CONSUMER_REASON_MAX 256
/* A batch's bytes (c->raw) are let go after a batch that grew them past this (bodies
 * near CONSUMER_BODY_KEEP); a batch of lapse's own messages takes about 0.5 KB each. */
#define CONSUMER_RAW_KEEP (1024 * 1024)

/* What the consumer keeps of a delivery while its batch is decided: the facts, read as
 * it came in, and where its bytes are in c->raw, which only parking reads back (a
 * parked copy keeps the properties and body as they came). */
typedef struct delivery {
    uint64_t tag;               /* delivery tag on the consuming connection */
    uint64_t body_size;         /* the body's real size */
    size_t props_at, props_len; /* its encoded properties in c->raw */
    size_t body_at, body_len;   /* at most CONSUMER_BODY_KEEP bytes of its body */
    lapse_expiry_msg_t msg;
    bool redelivered;
    bool decoded;          /* msg holds a valid expiry message */
    bool undated;          /* never dead-lettered: no broker time vouches for it */
    int attempts;          /* failed attempts before this delivery (x-lapse-attempts) */
    int64_t death_ms;      /* the broker's x-death time, < 0 when none */
    int64_t received_mono; /* lapse__mono_ms() when it was taken */
    int64_t deadline_ms;   /* the store's deadline (early) */
    lapse__verdict_t verdict;
    /* The decoder's or the store's words, for the parked reason: NULL (none) or
     * CONSUMER_REASON_MAX bytes of its own, freed with the batch (lapse__delivery_why).
     */
    char *reason;
    bool reason_lost; /* it could not be allocated */
    uint64_t fwd_tag; /* its forward's publish tag on the out connection, 0: none */
    /* Its forward's outcome (LAPSE_ERR_BROKER_TIMEOUT while unsettled). */
    lapse_status_t fwd_rc;
} delivery_t;

/** Set d's reason, printf-style, cut at CONSUMER_REASON_MAX - 1 bytes; its buffer is
 *  allocated on first use (out of memory: the reason reads "out of memory"). */
void lapse__delivery_why(delivery_t *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/** d's reason; "" when none was set. */
const char *lapse__delivery_reason(const delivery_t *d);

struct lapse_consumer {
    const lapse_config_t *cfg;
    lapse_store_t *store;
    const volatile sig_atomic_t *stop; /* borrowed from lapse_consumer_run */
    lapse_consumer_state_cb state_cb;  /* lapse_consumer_set_state_cb; NULL: none */
    void *state_opaque;
    lapse__topology_t topo;
    char name[96];       /* connection name and consumer tag */
    lapse__broker_t in;  /* deliveries and acks */
    lapse__broker_t out; /* parking, re-holding, events: confirm mode */
    delivery_t *batch;
    size_t n;
    lapse__frames_t raw; /* the bytes of the batch's deliveries (delivery_t's offsets) */
    size_t cap;
    lapse_cancel_item_t *items;
    size_t *item_of;   /* items index -> batch index */
    bool *item_failed; /* the store could not settle items[k]: retry path */
    int64_t *seqs;     /* outbox seqs of the batch's cancellations */
    size_t n_seqs;
    int64_t *owed; /* outbox seqs of this consumer's cancellations not yet published,
                      oldest first, at most CONSUMER_OWED_MAX */
    size_t n_owed;
    int64_t owed_since; /* mono */
    /* The round publishing the first relay_owed of owed, started at relay_since (mono),
     * its confirms not all in yet (lapse__consumer_events_settle); at most one. */
    lapse__relay_t relay;
    size_t relay_owed;
    int64_t relay_since;
    lapse_status_t out_failure; /* first failed confirm since the last check */
    int64_t events_retry_at;    /* mono: events were returned, none published before */
    unsigned events_attempt;    /* returned rounds in a row (0: events get through) */
    int64_t out_retry_at;       /* mono: when to reopen a failed publishing connection */
    unsigned out_attempt;
    int64_t backlog_at;    /* mono: next look at the outbox */
    int64_t out_polled_at; /* mono: last heartbeat service of the publishing connection */
    int64_t sweep_at;      /* mono: next sweep (0: at start) */
    int64_t prune_at;      /* mono: the next sweep that also prunes (0: not set yet) */
    const char *sweep_skipped; /* why direct cancels were last skipped, to log changes */
    /* How late expiry messages arrive: the largest lag (decision time - deadline) of a
     * first delivery of a known order (cancelled or no-op) in this period of sweep_every
     * (lag_now, since lag_since, mono) and in the one before (lag_prev). The sweep waits
     * that much longer than the grace before it calls a message lost: a backlog, in a
     * holding queue the broker is slow to dead-letter or in the expired queue, is late,
     * not lost. */
    int64_t lag_now, lag_prev, lag_since;
    bool sweep_behind;    /* the lag was last over the grace (logged on change) */
    lapse__clock_t clock; /* the broker-clock floor (decision.c) */
    bool stepped;         /* the wall clock stepped and no sample came since */
    int64_t probe_at;     /* mono: next clock probe (0: due) */
    bool probe_failed;    /* the last probe failed (logged once) */
    int64_t ahead_logged; /* last "ahead" logged, to log changes only */
    lapse_consumer_stats_t stats;
    lapse__metrics_t *metrics; /* borrowed, may be NULL (lapse__consumer_set_metrics) */
    int64_t count_at;          /* mono: next outbox count for the metrics */
    /* lapse__consumer_forward acked and nacked the batch delivery by delivery (some
     * forward failed): the batch's multiple ack must not follow. */
    bool batch_settled;
    unsigned fwd_attempt; /* batches in a row with a failed forward */
};

/** Record into metrics (borrowed: it must outlive the consumer; NULL: none) from now
 *  on; before lapse_consumer_run. */
void lapse__consumer_set_metrics(lapse_consumer_t *c, lapse__metrics_t *metrics);

/* ---- consumer_clock.c ---- */

/** Observe the wall and monotonic clocks; on a step log event=clock_step, drop the
 *  samples and make a probe due. Call on every batch and idle pass. */
void lapse__consumer_observe_clock(lapse_consumer_t *c);

/** Take the x-death time of each delivery of the batch as a sample (an undated one has
 *  none); returns the time arrivals are decided by (LAPSE__NOTHING_DUE while no floor is
 *  known). */
int64_t lapse__consumer_sample_batch(lapse_consumer_t *c);

/** Probe the broker's clock on a short-lived connection of its own (never the consuming
 *  one), within CONSUMER_PROBE_DEADLINE_MS; a failure leaves the floor to the deliveries
 *  and is logged once. */
void lapse__consumer_probe_clock(lapse_consumer_t *c);

/** The time direct cancels (the sweep) are decided by; LAPSE__NOTHING_DUE with *why
 *  when none may run. broker_up: a session is open (a probe or deliveries can give a
 *  floor). See docs/design.md, "The clock rule". */
int64_t lapse__consumer_sweep_now(lapse_consumer_t *c, bool broker_up, const char **why);
/** A dated message for a known order (cancelled on arrival, or a no-op: paid or already
 *  cancelled) was decided lag_ms after the order's deadline; attempts: the message's,
 *  whose retries are late for reasons of their own (not counted). */
void lapse__consumer_arrived(lapse_consumer_t *c, int64_t lag_ms, int attempts);

/** Make text one log token: quotes and line breaks become apostrophes. */
void lapse__consumer_sanitize(char *text);

/* ---- consumer_forward.c ---- */

/** (Re)open the publishing connection unless it is up or waiting out its backoff. */
lapse_status_t lapse__consumer_ensure_out(lapse_consumer_t *c, lapse_error_t *err);

/** Open the publishing connection now, whatever its backoff. */
lapse_status_t lapse__consumer_open_out(lapse_consumer_t *c, lapse_error_t *err);

/** The publishing connection failed: log it as event=what, close it, start its backoff.
 */
void lapse__consumer_out_failed(lapse_consumer_t *c, lapse_status_t rc,
                                const lapse_error_t *why, const char *what);

/** Carry out the batch's PARK, EARLY and RETRY verdicts; all confirmed on LAPSE_OK,
 *  unless c->batch_settled: then some forward failed, and the deliveries were acked one
 *  by one (those settled: forward confirmed, or none needed) or, after a backoff, nacked
 *  back to the queue (the rest), so that a forward that keeps failing holds up only its
 *  own deliveries, never the queue. */
lapse_status_t lapse__consumer_forward(lapse_consumer_t *c, lapse_error_t *err);

/* ---- consumer_events.c ---- */

/** Publish outbox events through the relay (only the seqs in only[0..n_only) when only
 *  is not NULL), at most limit. True when they went through. Failures are logged and
 *  left in the outbox; returned events hold all events back for a growing delay, after
 *  which the oldest goes alone first, as a probe. */
bool lapse__consumer_events(lapse_consumer_t *c, const int64_t *only, size_t n_only,
                            size_t limit);

/** Remember seqs (outbox rows of this consumer's cancellations) as owed. When that
 *  would overflow CONSUMER_OWED_MAX while the events go out, it first waits for the open
 *  round's confirms (and publishes the next); otherwise the oldest go to the backlog. */
void lapse__consumer_owe(lapse_consumer_t *c, const int64_t *seqs, size_t n);

/** When (mono) owed events may be tried next (the events' or the connection's backoff).
 */
int64_t lapse__consumer_owed_due(const lapse_consumer_t *c);

/** Publish the owed events when CONSUMER_EVENTS_CHUNK of them wait or the oldest has
 *  waited CONSUMER_EVENTS_DELAY_MS; never during a backoff. Their round is left open
 *  while their confirms come in (lapse__consumer_events_settle, called first thing
 *  here); no new round starts until it is settled. They stay owed until they went
 *  through. */
void lapse__consumer_events_owed(lapse_consumer_t *c);

/** End the open round of owed events once its confirms are all in (without block: if
 *  they are in now, after reading what the broker sent; with block: waiting for them),
 *  or once CONSUMER_CONFIRM_WAIT_MS have passed since it started. True when no round is
 *  open any more. */
bool lapse__consumer_events_settle(lapse_consumer_t *c, bool block);

/** Close the publishing connection, and end the open round of events with it (its
 *  unconfirmed events stay owed). Every close of c->out goes through here. */
void lapse__consumer_close_out(lapse_consumer_t *c);

/** The outbox backlog, now and then (CONSUMER_BACKLOG_EVERY_MS). */
void lapse__consumer_events_backlog(lapse_consumer_t *c);

/** On stop: publish the owed events (those of this consumer's cancellations only: the
 *  rest of the outbox may be another consumer's) for at most CONSUMER_STOP_EVENTS_MS,
 *  ignoring every backoff; log the outcome and the outbox backlog; close the publishing
 *  connection. */
void lapse__consumer_events_final(lapse_consumer_t *c);

/* ---- consumer_sweep.c ---- */

/** The safety net in process when it is due (every sweep_every): with the broker up both
 *  parts, else the direct cancels only. At most CONSUMER_SWEEP_BUDGET_MS (plus one store
 *  wait) per call; it sees the stop flag. */
void lapse__consumer_sweep(lapse_consumer_t *c, bool broker_up);

#endif

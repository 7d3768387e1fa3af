/* SPDX-License-Identifier: MIT
 * Internal: what the consumer decides, as pure functions of values (docs/design.md,
 * "The clock rule" and "Deciding a delivery"). Nothing here reads a clock, a socket or
 * the store: the consumer gathers the facts, calls these, and carries the verdict out.
 * Thread-safety: pure; a lapse__clock_t belongs to one consumer. */
#ifndef LAPSE_DECISION_INT_H
#define LAPSE_DECISION_INT_H

#include "clock_int.h"

#include <lapse/store.h>

#include <stdbool.h>
#include <stdint.h>

/* x-death times have a resolution of one second: when the wall clock is at most this far
 * ahead of the broker's floor, it is trusted (otherwise every on-time message would look
 * early). A clock ahead by less than this can cancel an arrival up to this much early;
 * direct cancels (the sweep) never use the tolerance. */
#define LAPSE__SKEW_TOLERANCE_MS 1250
/* A change of REALTIME - MONOTONIC larger than this between two observations is a step of
 * the wall clock (date -s, a VM resumed, a bad time source), not scheduling noise. */
#define LAPSE__CLOCK_STEP_MS 1000
/* The broker's clock and this host's monotonic clock may drift apart by this much per
 * million: the floor learnt from a sample is lowered by its age times this. */
#define LAPSE__CLOCK_DRIFT_PPM 200
/* A floor whose newest sample is older than this is not used at all. */
#define LAPSE__CLOCK_STALE_MS INT64_C(3600000)
/* The retry path: attempt a waits min(2^(a-1) s, this) on the ladder. */
#define LAPSE__RETRY_MAX_DELAY_MS INT64_C(300000)
/* "Nothing is due": a time the store compares every deadline against as not reached. */
#define LAPSE__NOTHING_DUE 0

/* A lower bound on the broker's clock, anchored to this host's monotonic clock so that a
 * step of the wall clock cannot move it. A message the broker dead-lettered at broker
 * time T (x-death, whole seconds) and that this process received at monotonic time m
 * proves broker_now >= T + (mono_now - m) for every later mono_now. The floor keeps the
 * largest T - m seen. */
typedef struct lapse__clock {
    int64_t offset_ms;       /* max(T - m) over samples; INT64_MIN: none */
    int64_t offset_mono_ms;  /* m of the sample that set offset_ms */
    int64_t wall_minus_mono; /* at the last observation; INT64_MIN: none yet */
    int64_t steps;           /* wall-clock steps seen */
} lapse__clock_t;

/** No samples, no observation. */
void lapse__clock_init(lapse__clock_t *clk);

/**
 * Observe both clocks (call once per batch, before sampling). When the wall clock stepped
 * since the last observation by more than LAPSE__CLOCK_STEP_MS, every sample is dropped,
 * *step_ms (optional) receives the step (positive: forward) and true is returned: the
 * caller probes the broker's clock again and cancels nothing directly until a fresh
 * sample exists.
 */
bool lapse__clock_observe(lapse__clock_t *clk, int64_t wall_ms, int64_t mono_ms,
                          int64_t *step_ms);

/** One sample: a broker time (ms) known to be at or before monotonic time mono_ms. */
void lapse__clock_sample(lapse__clock_t *clk, int64_t mono_ms, int64_t broker_ms);

/** Drop every sample (the wall-clock offset is kept). */
void lapse__clock_forget(lapse__clock_t *clk);

/** The broker-clock floor at mono_ms, lowered for drift; INT64_MIN when no sample or
 *  only a stale one. */
int64_t lapse__clock_floor(const lapse__clock_t *clk, int64_t mono_ms);

/** How far the wall clock may run ahead of the broker's (wall - floor, never below 0);
 *  INT64_MAX when the floor is unknown. */
int64_t lapse__clock_ahead_ms(const lapse__clock_t *clk, int64_t wall_ms,
                              int64_t mono_ms);

/**
 * The time arrivals are decided by: wall_ms while the wall clock is at most
 * LAPSE__SKEW_TOLERANCE_MS ahead of the floor, else the floor (never later than the
 * broker's now). LAPSE__NOTHING_DUE when the floor is unknown: an unknown bound is never
 * taken as 0.
 */
int64_t lapse__clock_decide_now(const lapse__clock_t *clk, int64_t wall_ms,
                                int64_t mono_ms);

/**
 * The time direct cancels (the sweep, which has no message and no broker time of its
 * own) are decided by: min(wall_ms, floor), no tolerance, so any grace, even 0, is safe.
 * LAPSE__NOTHING_DUE when the floor is unknown.
 */
int64_t lapse__clock_sweep_now(const lapse__clock_t *clk, int64_t wall_ms,
                               int64_t mono_ms);

/** What happens to one delivery. */
typedef enum lapse__action {
    LAPSE__ACT_CANCELLED, /* the store cancelled it: ack; its event is owed */
    LAPSE__ACT_NOOP,      /* paid or already cancelled: ack */
    LAPSE__ACT_EARLY,     /* not due: back down the ladder for delay_ms, then ack */
    LAPSE__ACT_RETRY,     /* the store failed: down the ladder for delay_ms, counted */
    LAPSE__ACT_PARK       /* to the parked queue, with a reason */
} lapse__action_t;

/** Why, for logs and the parked reason; static strings. */
typedef enum lapse__why {
    LAPSE__WHY_NONE,
    LAPSE__WHY_AHEAD,        /* early: the store's deadline is not reached */
    LAPSE__WHY_UNDATED,      /* early: no broker time vouches for the message */
    LAPSE__WHY_UNDECODABLE,  /* park: the body is not a valid expiry message */
    LAPSE__WHY_UNKNOWN,      /* park: no such order in the store */
    LAPSE__WHY_STORE_FAILED, /* retry: the store could not settle it */
    LAPSE__WHY_EXHAUSTED,    /* park: the store failed max_attempts times */
    LAPSE__WHY_PAID,         /* no-op */
    LAPSE__WHY_CANCELLED     /* no-op: cancelled before */
} lapse__why_t;

/** The facts about one delivery, gathered by the consumer. */
typedef struct lapse__facts {
    bool decoded;                   /* the body is a valid expiry message */
    bool undated;                   /* never dead-lettered by the broker */
    bool settled;                   /* the store answered for the order (else failed) */
    lapse_cancel_outcome_t outcome; /* the store's answer, when settled */
    int64_t deadline_ms;            /* the store's deadline, when EARLY */
    int64_t now_ms;                 /* the consumer's decide time, to count the remainder
                                       from (LAPSE__NOTHING_DUE: unknown) */
    int attempts;                   /* failed attempts before this one */
    int max_attempts;               /* config max_attempts (>= 1) */
} lapse__facts_t;

typedef struct lapse__verdict {
    lapse__action_t action;
    lapse__why_t why;
    int64_t delay_ms; /* EARLY: the remainder; RETRY: the backoff; else 0 */
    int attempts;     /* the x-lapse-attempts value the forwarded copy carries */
} lapse__verdict_t;

/** Decide one delivery. Pure. */
void lapse__decide(const lapse__facts_t *facts, lapse__verdict_t *out);

/** The wait before attempt number `attempt` (1-based): min(2^(attempt-1) s, 5 min). */
int64_t lapse__retry_delay_ms(int attempt);

/* The room lapse__decision_line needs: its words, an order id of LAPSE_ORDER_ID_MAX
 * bytes, the longest outcome name and a 20-digit lag, with some to spare. */
#define LAPSE__DECISION_LINE_MAX 320

/** The consumer's line for one order's decision, written into out (NUL-terminated):
 *  "event=decision order_id=ID decision=NAME[ lag_ms=LAG] redelivered=0|1", the lag
 *  only when lag_ms is not NULL. What snprintf would write, without its cost: the
 *  consumer logs one per order. With order_id at most LAPSE_ORDER_ID_MAX bytes and name
 *  an outcome's name, the line fits; a longer one is cut, never overrun. Returns out.
 *  Pure. */
char *lapse__decision_line(char out[LAPSE__DECISION_LINE_MAX], const char *order_id,
                           const char *name, const int64_t *lag_ms, bool redelivered);

/** Static names for logs: "cancelled", "noop", "early", "retry", "parked"; "ahead", ...
 */
const char *lapse__action_name(lapse__action_t action);
const char *lapse__why_name(lapse__why_t why);

#endif

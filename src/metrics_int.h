/* SPDX-License-Identifier: MIT
 * Internal: the consumer's metrics and health (README, "Metrics and health"). The
 * consumer thread records into a registry through the small functions below; another
 * thread (the CLI's HTTP server, src/cli/metrics_http.c) takes a snapshot under the
 * registry's mutex and renders it in the Prometheus text exposition format, or asks for
 * the health. The renderer is a pure function of a snapshot.
 * Thread-safety: every lapse__metrics_* function taking a lapse__metrics_t may be called
 * from any thread, and accepts NULL (then it does nothing: a consumer without metrics).
 */
#ifndef LAPSE_METRICS_INT_H
#define LAPSE_METRICS_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The consumer's decisions, as its log lines name them (decision=...). */
typedef enum lapse__metric_decision {
    LAPSE__DEC_CANCELLED,
    LAPSE__DEC_NOOP_PAID,
    LAPSE__DEC_NOOP_CANCELLED,
    LAPSE__DEC_EARLY,
    LAPSE__DEC_RETRY,
    LAPSE__DEC_PARKED,
    LAPSE__DEC_COUNT_
} lapse__metric_decision_t;

/* What a latency histogram times. */
typedef enum lapse__metric_op {
    LAPSE__OP_STORE_CANCEL,   /* store: one cancel_batch transaction */
    LAPSE__OP_STORE_COUNT,    /* store: the outbox count (the health probe) */
    LAPSE__OP_BROKER_CONFIRM, /* broker: waiting for the confirms of a batch's forwards */
    LAPSE__OP_BROKER_ACK,     /* broker: the batch's ack */
    LAPSE__OP_COUNT_
} lapse__metric_op_t;

#define LAPSE__HIST_MAX_BUCKETS 16

/* A histogram over integer observations in its own unit (ms, µs, deliveries); its
 * bucket bounds are in the same unit and `scale` units make one exposed unit (1000 ms
 * are 1 s), so that nothing is a float until it is printed, exactly. */
typedef struct lapse__histogram {
    const int64_t *bounds; /* ascending upper bounds (le), static */
    size_t n_bounds;       /* at most LAPSE__HIST_MAX_BUCKETS */
    int64_t scale;         /* a power of ten */
    uint64_t counts[LAPSE__HIST_MAX_BUCKETS + 1]; /* per bucket, not cumulative; the
                                                     last is above every bound */
    int64_t sum;
} lapse__histogram_t;

/* Every value the registry holds: what a snapshot copies and the renderer reads. */
typedef struct lapse__metrics_values {
    uint64_t decisions[LAPSE__DEC_COUNT_];
    uint64_t deliveries;
    uint64_t reconnects;
    uint64_t parked;
    uint64_t events_published;
    uint64_t sweep_cancelled;
    uint64_t clock_steps;
    lapse__histogram_t cancel_lag;                /* ms */
    lapse__histogram_t batch_size;                /* deliveries */
    lapse__histogram_t latency[LAPSE__OP_COUNT_]; /* µs */
    int64_t outbox_pending;                       /* -1: not counted yet */
    int64_t clock_ahead_ms; /* how far the wall clock may be ahead of the broker's;
                               INT64_MAX: no bound known */
    bool subscribed;
    bool store_ok;
    int64_t start_time_ms; /* wall clock at lapse__metrics_new */
    char prefix[64];       /* the topology prefix, a label of lapse_build_info */
} lapse__metrics_values_t;

typedef struct lapse__metrics {
    pthread_mutex_t lock;
    lapse__metrics_values_t v;
    char broker_reason[160]; /* why not subscribed */
    char store_reason[160];  /* why the store did not answer */
} lapse__metrics_t;

/** New registry (every counter 0, not subscribed, the store taken as answering until a
 *  call says otherwise); prefix is copied. NULL when out of memory. Freed with
 *  lapse__metrics_free (accepts NULL). */
lapse__metrics_t *lapse__metrics_new(const char *prefix);
void lapse__metrics_free(lapse__metrics_t *m);

/** Fill values with one consistent copy of everything (under the lock). */
void lapse__metrics_snapshot(lapse__metrics_t *m, lapse__metrics_values_t *values);

/* Recording, from the consumer thread. */
void lapse__metrics_decision(lapse__metrics_t *m, lapse__metric_decision_t d);
/** A cancellation by a delivery: its decision, and its lag (cancel time - deadline). */
void lapse__metrics_cancelled(lapse__metrics_t *m, int64_t lag_ms);
void lapse__metrics_batch(lapse__metrics_t *m, size_t deliveries);
void lapse__metrics_latency(lapse__metrics_t *m, lapse__metric_op_t op, int64_t us);
void lapse__metrics_reconnect(lapse__metrics_t *m);
void lapse__metrics_events(lapse__metrics_t *m, uint64_t published);
void lapse__metrics_sweep_cancelled(lapse__metrics_t *m, uint64_t n);
void lapse__metrics_clock(lapse__metrics_t *m, int64_t ahead_ms, bool stepped);
void lapse__metrics_outbox(lapse__metrics_t *m, int64_t pending);
/** Subscribed to the expired queue, or not with why (copied; one line). */
void lapse__metrics_subscribed(lapse__metrics_t *m, bool subscribed, const char *why);
/** The store answered, or not with why (copied; one line). */
void lapse__metrics_store(lapse__metrics_t *m, bool ok, const char *why);

/** Healthy: subscribed and the store answers. Else false with the reason, one line, in
 *  why (cap bytes). */
bool lapse__metrics_health(lapse__metrics_t *m, char *why, size_t cap);

/** Monotonic microseconds, for latencies. */
int64_t lapse__metrics_now_us(void);

/* Pure. */

/** Write values in the Prometheus text exposition format (version 0.0.4) to out. */
void lapse__metrics_render(const lapse__metrics_values_t *values, FILE *out);

/** Write value as a label value: \ " and line feed escaped as \\ \" \n. */
void lapse__metrics_write_label(FILE *out, const char *value);

/** Write v / scale (scale a power of ten) as a decimal, exactly, without trailing
 *  zeros: 1500/1000 -> "1.5", 5/1000 -> "0.005", -2/1 -> "-2". */
void lapse__metrics_write_scaled(FILE *out, int64_t v, int64_t scale);

/** Split "HOST:PORT", "[IPV6]:PORT" or ":PORT" (every interface; host "") into host
 *  and port; PORT is 0..65535 (0: any free port). False when it is not of that form or
 *  does not fit the buffers. */
bool lapse__metrics_listen_parse(const char *text, char *host, size_t host_cap,
                                 char *port, size_t port_cap);

#endif

/* SPDX-License-Identifier: MIT
 * The consumer's metrics: a registry the consumer thread records into under a mutex
 * (a few uncontended lock/unlock pairs per batch), snapshots for the HTTP thread, and
 * the Prometheus text renderer, a pure function of a snapshot. */
#include "metrics_int.h"

#include <lapse/lapse.h>
#include <lapse/message.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Bucket bounds, each in its histogram's own unit. */
static const int64_t LAG_MS[] = {5,    10,   25,   50,    100,   250,   500,
                                 1000, 2500, 5000, 10000, 30000, 60000, 300000};
static const int64_t BATCH[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000};
static const int64_t LATENCY_US[] = {100,     250,     500,     1000,    2500,   5000,
                                     10000,   25000,   50000,   100000,  250000, 500000,
                                     1000000, 2500000, 5000000, 10000000};

#define LEN(a) (sizeof(a) / sizeof((a)[0]))
_Static_assert(LEN(LAG_MS) <= LAPSE__HIST_MAX_BUCKETS, "too many buckets");
_Static_assert(LEN(BATCH) <= LAPSE__HIST_MAX_BUCKETS, "too many buckets");
_Static_assert(LEN(LATENCY_US) <= LAPSE__HIST_MAX_BUCKETS, "too many buckets");

static const char *const DECISION_NAME[LAPSE__DEC_COUNT_] = {
    [LAPSE__DEC_CANCELLED] = "cancelled",
    [LAPSE__DEC_NOOP_PAID] = "noop_paid",
    [LAPSE__DEC_NOOP_CANCELLED] = "noop_cancelled",
    [LAPSE__DEC_EARLY] = "early",
    [LAPSE__DEC_RETRY] = "retry",
    [LAPSE__DEC_PARKED] = "parked"};

/* Store and broker latencies are two families, told apart by an op label. */
static const struct {
    bool store;
    const char *op;
} OP[LAPSE__OP_COUNT_] = {
    [LAPSE__OP_STORE_CANCEL] = {true, "cancel_batch"},
    [LAPSE__OP_STORE_COUNT] = {true, "outbox_count"},
    [LAPSE__OP_BROKER_CONFIRM] = {false, "confirm"},
    [LAPSE__OP_BROKER_ACK] = {false, "ack"},
};

static void hist_init(lapse__histogram_t *h, const int64_t *bounds, size_t n,
                      int64_t scale) {
    *h = (lapse__histogram_t){.bounds = bounds, .n_bounds = n, .scale = scale};
}

static void hist_observe(lapse__histogram_t *h, int64_t v) {
    size_t k = 0;
    while (k < h->n_bounds && v > h->bounds[k]) {
        k++;
    }
    h->counts[k]++;
    h->sum += v;
}

lapse__metrics_t *lapse__metrics_new(const char *prefix) {
    lapse__metrics_t *m = calloc(1, sizeof *m);
    if (m == NULL) {
        return NULL;
    }
    if (pthread_mutex_init(&m->lock, NULL) != 0) {
        free(m);
        return NULL;
    }
    lapse__metrics_values_t *v = &m->v;
    hist_init(&v->cancel_lag, LAG_MS, LEN(LAG_MS), 1000);
    hist_init(&v->batch_size, BATCH, LEN(BATCH), 1);
    for (size_t op = 0; op < LAPSE__OP_COUNT_; op++) {
        hist_init(&v->latency[op], LATENCY_US, LEN(LATENCY_US), 1000000);
    }
    v->outbox_pending = -1;
    v->clock_ahead_ms = INT64_MAX;
    v->store_ok = true;
    v->start_time_ms = lapse_clock_now_ms();
    snprintf(v->prefix, sizeof v->prefix, "%s", prefix ? prefix : "");
    snprintf(m->broker_reason, sizeof m->broker_reason, "not subscribed yet");
    return m;
}

void lapse__metrics_free(lapse__metrics_t *m) {
    if (m == NULL) {
        return;
    }
    pthread_mutex_destroy(&m->lock);
    free(m);
}

void lapse__metrics_snapshot(lapse__metrics_t *m, lapse__metrics_values_t *values) {
    pthread_mutex_lock(&m->lock);
    *values = m->v;
    pthread_mutex_unlock(&m->lock);
}

#define LOCKED(m, body)                                                                  \
    do {                                                                                 \
        if ((m) != NULL) {                                                               \
            pthread_mutex_lock(&(m)->lock);                                              \
            body;                                                                        \
            pthread_mutex_unlock(&(m)->lock);                                            \
        }                                                                                \
    } while (0)

void lapse__metrics_decision(lapse__metrics_t *m, lapse__metric_decision_t d) {
    LOCKED(m, {
        m->v.decisions[d]++;
        m->v.parked += d == LAPSE__DEC_PARKED;
    });
}

void lapse__metrics_cancelled(lapse__metrics_t *m, int64_t lag_ms) {
    LOCKED(m, {
        m->v.decisions[LAPSE__DEC_CANCELLED]++;
        hist_observe(&m->v.cancel_lag, lag_ms > 0 ? lag_ms : 0);
    });
}

void lapse__metrics_batch(lapse__metrics_t *m, size_t deliveries) {
    LOCKED(m, {
        m->v.deliveries += deliveries;
        hist_observe(&m->v.batch_size, (int64_t)deliveries);
    });
}

void lapse__metrics_latency(lapse__metrics_t *m, lapse__metric_op_t op, int64_t us) {
    LOCKED(m, hist_observe(&m->v.latency[op], us > 0 ? us : 0));
}

void lapse__metrics_reconnect(lapse__metrics_t *m) {
    LOCKED(m, m->v.reconnects++);
}

void lapse__metrics_events(lapse__metrics_t *m, uint64_t published) {
    LOCKED(m, m->v.events_published += published);
}

void lapse__metrics_sweep_cancelled(lapse__metrics_t *m, uint64_t n) {
    LOCKED(m, m->v.sweep_cancelled += n);
}

void lapse__metrics_clock(lapse__metrics_t *m, int64_t ahead_ms, bool stepped) {
    LOCKED(m, {
        m->v.clock_ahead_ms = ahead_ms;
        m->v.clock_steps += stepped;
    });
}

void lapse__metrics_outbox(lapse__metrics_t *m, int64_t pending) {
    LOCKED(m, m->v.outbox_pending = pending);
}

/* Reasons are shown on one line of an HTTP body: line breaks become spaces. */
static void copy_reason(char *dst, size_t cap, const char *why) {
    snprintf(dst, cap, "%s", why ? why : "");
    for (char *p = dst; *p; p++) {
        if (*p == '\n' || *p == '\r') {
            *p = ' ';
        }
    }
}

void lapse__metrics_subscribed(lapse__metrics_t *m, bool subscribed, const char *why) {
    LOCKED(m, {
        m->v.subscribed = subscribed;
        copy_reason(m->broker_reason, sizeof m->broker_reason, subscribed ? "" : why);
    });
}

void lapse__metrics_store(lapse__metrics_t *m, bool ok, const char *why) {
    LOCKED(m, {
        m->v.store_ok = ok;
        copy_reason(m->store_reason, sizeof m->store_reason, ok ? "" : why);
    });
}

bool lapse__metrics_health(lapse__metrics_t *m, char *why, size_t cap) {
    bool ok = false;
    pthread_mutex_lock(&m->lock);
    if (!m->v.subscribed) {
        snprintf(why, cap, "broker: %s", m->broker_reason);
    } else if (!m->v.store_ok) {
        snprintf(why, cap, "store: %s", m->store_reason);
    } else {
        snprintf(why, cap, "ok");
        ok = true;
    }
    pthread_mutex_unlock(&m->lock);
    return ok;
}

int64_t lapse__metrics_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---- rendering ---- */

void lapse__metrics_write_label(FILE *out, const char *value) {
    for (const char *p = value; *p; p++) {
        switch (*p) {
            case '\\':
                fputs("\\\\", out);
                break;
            case '"':
                fputs("\\\"", out);
                break;
            case '\n':
                fputs("\\n", out);
                break;
            default:
                fputc(*p, out);
        }
    }
}

void lapse__metrics_write_scaled(FILE *out, int64_t v, int64_t scale) {
    /* In unsigned arithmetic, so that INT64_MIN has a magnitude too. */
    uint64_t mag = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    uint64_t s = scale > 0 ? (uint64_t)scale : 1;
    uint64_t whole = mag / s, frac = mag % s;
    fprintf(out, "%s%llu", v < 0 ? "-" : "", (unsigned long long)whole);
    if (frac == 0) {
        return;
    }
    /* The fraction's digits, most significant first, as many as scale has zeros. */
    char digits[24];
    size_t n = 0;
    for (uint64_t t = s / 10; t > 0 && n < sizeof digits - 1; t /= 10) {
        digits[n++] = (char)('0' + frac / t % 10);
    }
    while (n > 0 && digits[n - 1] == '0') {
        n--;
    }
    fprintf(out, ".%.*s", (int)n, digits);
}

static void family(FILE *out, const char *name, const char *type, const char *help) {
    fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void scalar(FILE *out, const char *name, const char *type, const char *help,
                   uint64_t value) {
    family(out, name, type, help);
    fprintf(out, "%s %llu\n", name, (unsigned long long)value);
}

/* One series of a histogram family; label: a `key="value"` pair (or "") put before le. */
static void hist_series(FILE *out, const char *name, const char *label,
                        const lapse__histogram_t *h) {
    uint64_t cumulative = 0;
    const char *sep = label[0] ? "," : "";
    for (size_t k = 0; k <= h->n_bounds; k++) {
        cumulative += h->counts[k];
        fprintf(out, "%s_bucket{%s%sle=\"", name, label, sep);
        if (k < h->n_bounds) {
            lapse__metrics_write_scaled(out, h->bounds[k], h->scale);
        } else {
            fputs("+Inf", out);
        }
        fprintf(out, "\"} %llu\n", (unsigned long long)cumulative);
    }
    const char *open = label[0] ? "{" : "";
    const char *close = label[0] ? "}" : "";
    fprintf(out, "%s_sum%s%s%s ", name, open, label, close);
    lapse__metrics_write_scaled(out, h->sum, h->scale);
    /* The count is the +Inf bucket, by construction. */
    fprintf(out, "\n%s_count%s%s%s %llu\n", name, open, label, close,
            (unsigned long long)cumulative);
}

static void latency_family(FILE *out, const lapse__metrics_values_t *v, bool store,
                           const char *name, const char *help) {
    family(out, name, "histogram", help);
    for (size_t op = 0; op < LAPSE__OP_COUNT_; op++) {
        if (OP[op].store == store) {
            char label[64];
            snprintf(label, sizeof label, "op=\"%s\"", OP[op].op);
            hist_series(out, name, label, &v->latency[op]);
        }
    }
}

void lapse__metrics_render(const lapse__metrics_values_t *v, FILE *out) {
    family(out, "lapse_decisions_total", "counter",
           "Deliveries decided by this consumer, by decision.");
    for (size_t d = 0; d < LAPSE__DEC_COUNT_; d++) {
        fprintf(out, "lapse_decisions_total{decision=\"%s\"} %llu\n", DECISION_NAME[d],
                (unsigned long long)v->decisions[d]);
    }
    scalar(out, "lapse_deliveries_total", "counter",
           "Expiry messages taken from the expired queue.", v->deliveries);
    scalar(out, "lapse_parked_total", "counter",
           "Messages this consumer published to the parked queue.", v->parked);
    scalar(out, "lapse_sweep_cancelled_total", "counter",
           "Orders the in-process sweep cancelled directly (their message was lost).",
           v->sweep_cancelled);
    scalar(out, "lapse_events_published_total", "counter",
           "order.cancelled events published and confirmed.", v->events_published);
    scalar(out, "lapse_reconnects_total", "counter",
           "Consuming sessions that failed and were opened again.", v->reconnects);
    scalar(out, "lapse_clock_steps_total", "counter",
           "Steps of the wall clock seen (samples of the broker's clock dropped).",
           v->clock_steps);

    family(out, "lapse_cancel_lag_seconds", "histogram",
           "Time from an order's deadline to its cancellation by this consumer.");
    hist_series(out, "lapse_cancel_lag_seconds", "", &v->cancel_lag);
    family(out, "lapse_batch_size", "histogram",
           "Deliveries decided together in one store transaction.");
    hist_series(out, "lapse_batch_size", "", &v->batch_size);
    latency_family(out, v, true, "lapse_store_latency_seconds",
                   "Store calls of the consumer, by operation.");
    latency_family(out, v, false, "lapse_broker_latency_seconds",
                   "Broker waits of the consumer, by operation.");

    family(out, "lapse_outbox_pending", "gauge",
           "order.cancelled events in the outbox not yet published (-1: not counted "
           "yet).");
    fprintf(out, "lapse_outbox_pending %lld\n", (long long)v->outbox_pending);
    family(out, "lapse_clock_bound_known", "gauge",
           "1 when a lower bound on the broker's clock is known (x-death samples or a "
           "probe).");
    fprintf(out, "lapse_clock_bound_known %d\n", v->clock_ahead_ms != INT64_MAX);
    family(out, "lapse_clock_ahead_seconds", "gauge",
           "How far this host's wall clock may run ahead of the broker's (NaN: no bound "
           "known).");
    fputs("lapse_clock_ahead_seconds ", out);
    if (v->clock_ahead_ms == INT64_MAX) {
        fputs("NaN", out);
    } else {
        lapse__metrics_write_scaled(out, v->clock_ahead_ms, 1000);
    }
    fputc('\n', out);
    scalar(out, "lapse_subscribed", "gauge",
           "1 while the consumer is subscribed to the expired queue.", v->subscribed);
    scalar(out, "lapse_store_up", "gauge", "1 while the store answers.", v->store_ok);
    family(out, "lapse_start_time_seconds", "gauge",
           "When the consumer started, seconds since the epoch.");
    fputs("lapse_start_time_seconds ", out);
    lapse__metrics_write_scaled(out, v->start_time_ms, 1000);
    fputc('\n', out);
    family(out, "lapse_build_info", "gauge", "The lapse version and topology prefix.");
    fputs("lapse_build_info{version=\"", out);
    lapse__metrics_write_label(out, LAPSE_VERSION);
    fputs("\",prefix=\"", out);
    lapse__metrics_write_label(out, v->prefix);
    fputs("\"} 1\n", out);
}

/* ---- the listen address ---- */

static bool copy_part(char *dst, size_t cap, const char *src, size_t n) {
    if (n >= cap) {
        return false;
    }
    memcpy(dst, src, n);
    dst[n] = '\0';
    return true;
}

bool lapse__metrics_listen_parse(const char *text, char *host, size_t host_cap,
                                 char *port, size_t port_cap) {
    const char *colon = strrchr(text, ':');
    if (colon == NULL) {
        return false;
    }
    const char *h = text;
    size_t hn = (size_t)(colon - text);
    if (hn > 0 && text[0] == '[') {
        /* [IPV6]:PORT: the brackets close just before the port's colon. */
        if (hn < 3 || text[hn - 1] != ']') {
            return false;
        }
        h = text + 1;
        hn -= 2;
        for (size_t i = 0; i < hn; i++) {
            char c = h[i];
            if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') ||
                  (c >= 'A' && c <= 'F') || c == ':' || c == '.')) {
                return false;
            }
        }
    } else {
        for (size_t i = 0; i < hn; i++) {
            char c = h[i];
            if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                  (c >= 'A' && c <= 'Z') || c == '.' || c == '-' || c == '_')) {
                return false;
            }
        }
    }
    const char *p = colon + 1;
    size_t pn = strlen(p);
    if (pn == 0 || pn > 5) {
        return false;
    }
    long value = 0;
    for (size_t i = 0; i < pn; i++) {
        if (p[i] < '0' || p[i] > '9') {
            return false;
        }
        value = value * 10 + (p[i] - '0');
    }
    if (value > 65535) {
        return false;
    }
    return copy_part(host, host_cap, h, hn) && copy_part(port, port_cap, p, pn);
}

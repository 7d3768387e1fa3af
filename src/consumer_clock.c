/* SPDX-License-Identifier: MIT
 * Consumer: the broker-clock floor it decides by (docs/design.md, "The clock rule"): the
 * x-death samples of deliveries, a probe on a connection of its own, and wall-clock
 * steps. The arithmetic is decision.c's; this file gathers its inputs. */
#include "consumer_int.h"

#include "headers_int.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Five probes span more than a second: one lands just after a second boundary of the
 * broker's clock, which makes its x-death time (whole seconds) a tight sample. */
#define PROBES           5
#define PROBE_SPACING_MS 250
#define PROBE_WAIT_MS    1000

/* Log values must stay one token: quotes in reasons become apostrophes. */
void lapse__consumer_sanitize(char *text) {
    for (char *p = text; *p; p++) {
        if (*p == '"' || *p == '\n' || *p == '\r') {
            *p = '\'';
        }
    }
}

void lapse__consumer_observe_clock(lapse_consumer_t *c) {
    int64_t step = 0;
    if (!lapse__clock_observe(&c->clock, lapse_clock_now_ms(), lapse__mono_ms(), &step)) {
        return;
    }
    /* The samples are gone: until a fresh one comes (a probe, now due, or a delivery),
     * arrivals are decided as undated ones and nothing is cancelled directly. */
    c->stepped = true;
    c->probe_at = 0;
    lapse__metrics_clock(c->metrics, INT64_MAX, true);
    lapse__log(c->cfg, LAPSE_LOG_WARN,
               "event=clock_step step_ms=%lld note=\"the wall clock stepped; samples of "
               "the broker's clock dropped, probing again\"",
               (long long)step);
}

/* Log how far the wall clock may run ahead of the floor when that changes by a second,
 * once it is beyond the tolerance (deadlines are then checked against the floor). */
static void log_ahead(lapse_consumer_t *c, int64_t wall, int64_t mono) {
    int64_t ahead = lapse__clock_ahead_ms(&c->clock, wall, mono);
    lapse__metrics_clock(c->metrics, ahead, false);
    if (ahead == INT64_MAX) {
        return;
    }
    if (ahead <= LAPSE__SKEW_TOLERANCE_MS) {
        ahead = 0;
    }
    if (ahead / 1000 == c->ahead_logged / 1000) {
        return;
    }
    c->ahead_logged = ahead;
    lapse__log(c->cfg, ahead ? LAPSE_LOG_WARN : LAPSE_LOG_INFO,
               "event=clock_skew ahead_by_up_to_ms=%lld%s", (long long)ahead,
               ahead ? " note=\"deadlines are checked against the broker's clock\"" : "");
}

int64_t lapse__consumer_sample_batch(lapse_consumer_t *c) {
    for (size_t i = 0; i < c->n; i++) {
        delivery_t *d = &c->batch[i];
        int64_t at = d->death_ms; /* read as it came in (collect) */
        d->undated = at < 0;
        if (at >= 0) {
            /* Received at d->received_mono, dead-lettered at broker time at: the broker's
             * clock read at least at then. */
            lapse__clock_sample(&c->clock, d->received_mono, at);
            c->stepped = false;
        }
    }
    int64_t wall = lapse_clock_now_ms();
    int64_t mono = lapse__mono_ms();
    log_ahead(c, wall, mono);
    return lapse__clock_decide_now(&c->clock, wall, mono);
}

int64_t lapse__consumer_sweep_now(lapse_consumer_t *c, bool broker_up, const char **why) {
    int64_t wall = lapse_clock_now_ms();
    int64_t mono = lapse__mono_ms();
    *why = NULL;
    if (lapse__clock_floor(&c->clock, mono) != INT64_MIN) {
        return lapse__clock_sweep_now(&c->clock, wall, mono);
    }
    if (c->stepped) {
        *why = "clock_step"; /* the wall clock just proved unreliable */
        return LAPSE__NOTHING_DUE;
    }
    if (broker_up) {
        *why = "no_broker_time"; /* a probe or a delivery brings one */
        return LAPSE__NOTHING_DUE;
    }
    /* The broker is down and no floor is known (never sampled, or the last sample is
     * over an hour old): like a standalone `lapse sweep`, the wall clock decides and the
     * full grace is the margin for a clock ahead of the broker's. */
    return wall;
}

/* One probe: published into a private queue whose TTL is 0, dead-lettered at once into
 * another, read back. Its x-death time is the broker's clock at that moment. */
static lapse_status_t probe_once(lapse_consumer_t *c, lapse__broker_t *b,
                                 const char *exchange, const char *into, const char *from,
                                 int64_t until, int *got, lapse_error_t *err) {
    amqp_basic_properties_t props = {._flags = AMQP_BASIC_DELIVERY_MODE_FLAG,
                                     .delivery_mode = AMQP_DELIVERY_NONPERSISTENT};
    static const char body[] = "lapse clock probe";
    lapse_status_t rc = lapse__broker_publish(b, exchange, into, false, &props, body,
                                              sizeof body - 1, NULL, err);
    int64_t give_up = lapse__mono_ms() + PROBE_WAIT_MS;
    give_up = give_up < until ? give_up : until;
    while (rc == LAPSE_OK && lapse__mono_ms() < give_up) {
        amqp_message_t msg;
        bool have = false;
        rc = lapse__broker_get(b, from, &msg, &have, err);
        if (rc != LAPSE_OK) {
            break;
        }
        if (!have) {
            usleep(2000);
            continue;
        }
        int64_t mono = lapse__mono_ms();
        int64_t at = lapse__hdr_death_time_ms(&msg.properties);
        lapse__broker_message_clear(&msg);
        if (at >= 0) {
            lapse__clock_sample(&c->clock, mono, at);
            (*got)++;
        }
        break;
    }
    return rc;
}

static void probe_failed(lapse_consumer_t *c, lapse_status_t rc,
                         const lapse_error_t *err) {
    c->probe_at = lapse__time_add(lapse__mono_ms(), CONSUMER_PROBE_RETRY_MS);
    if (c->probe_failed) {
        return; /* said once; said again only after a success */
    }
    c->probe_failed = true;
    char text[sizeof err->text];
    snprintf(text, sizeof text, "%s", err->text[0] ? err->text : "no probe came back");
    lapse__consumer_sanitize(text);
    lapse__log(c->cfg, LAPSE_LOG_WARN,
               "event=clock_probe_failed status=%s reason=\"%s\" note=\"the broker's "
               "clock is learnt from the deliveries' x-death times; tried again every "
               "%d s\"",
               lapse_status_name(rc), text, CONSUMER_PROBE_RETRY_MS / 1000);
}

/* A tight floor from probes, so that the waits of a backlog (which only lower the floor
 * learnt from deliveries) do not make on-time orders look early, and so that the sweep
 * has a floor with no traffic. Never on the consuming connection: a publishing
 * connection is the one the broker blocks under a memory alarm, and a refused declare
 * (a least-privilege user) closes the channel it ran on. Here both only end this
 * short-lived connection. */
void lapse__consumer_probe_clock(lapse_consumer_t *c) {
    int64_t until = lapse__time_add(lapse__mono_ms(), CONSUMER_PROBE_DEADLINE_MS);
    char name[sizeof c->name + 8];
    snprintf(name, sizeof name, "%s probe", c->name);
    lapse__broker_t b;
    lapse_error_t err = {0};
    int got = 0;
    lapse_status_t rc = lapse__broker_open(&b, c->cfg, name, 0, NULL, NULL, &err);
    if (rc == LAPSE_OK) {
        lapse__broker_set_rpc_timeout(&b, until - lapse__mono_ms());
        /* Through <prefix>.probe, not the default exchange: a consumer user with write
         * on amq.default could publish into every queue of the vhost (README
         * "Permissions"). */
        char exchange[LAPSE__PREFIX_MAX + 8];
        snprintf(exchange, sizeof exchange, "%s.probe",
                 lapse_config_get(c->cfg, "prefix"));
        char from[128] = "";
        char into[128] = "";
        rc = lapse__broker_declare_transient_direct(&b, exchange, &err);
        if (rc == LAPSE_OK) {
            rc = lapse__broker_declare_private(&b, NULL, from, sizeof from, &err);
        }
        amqp_table_entry_t e[3] = {lapse__entry_str("x-dead-letter-exchange", exchange),
                                   lapse__entry_str("x-dead-letter-routing-key", from),
                                   lapse__entry_i64("x-message-ttl", 0)};
        amqp_table_t args = {.num_entries = 3, .entries = e};
        if (rc == LAPSE_OK) {
            rc = lapse__broker_declare_private(&b, &args, into, sizeof into, &err);
        }
        if (rc == LAPSE_OK) {
            rc = lapse__broker_bind(&b, from, exchange, from, &err);
        }
        if (rc == LAPSE_OK) {
            rc = lapse__broker_bind(&b, into, exchange, into, &err);
        }
        for (int i = 0; i < PROBES && rc == LAPSE_OK && !*c->stop; i++) {
            if (i > 0) {
                usleep(PROBE_SPACING_MS * 1000);
            }
            if (lapse__mono_ms() >= until) {
                break;
            }
            rc = probe_once(c, &b, exchange, into, from, until, &got, &err);
        }
        /* Both queues are exclusive: closing the connection deletes them. */
        lapse__broker_set_rpc_timeout(&b, 1000);
        lapse__broker_close(&b);
    }
    if (got == 0) {
        probe_failed(c, rc, &err);
        return;
    }
    c->stepped = false;
    c->probe_failed = false;
    c->probe_at = lapse__time_add(lapse__mono_ms(), CONSUMER_PROBE_EVERY_MS);
    int64_t ahead =
        lapse__clock_ahead_ms(&c->clock, lapse_clock_now_ms(), lapse__mono_ms());
    lapse__metrics_clock(c->metrics, ahead, false);
    lapse__log(c->cfg, LAPSE_LOG_INFO,
               "event=clock_probe probes=%d ahead_by_up_to_ms=%lld", got,
               (long long)ahead);
}

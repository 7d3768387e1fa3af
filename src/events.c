/* SPDX-License-Identifier: MIT
 * The events relay: outbox -> <prefix>.events (mandatory, confirmed) -> marked published.
 */
#include "events_int.h"

#include "clock_int.h"

#include <lapse/message.h>

#include <stdlib.h>
#include <string.h>

/* The outcome of a publish the broker has not settled yet. */
#define UNSETTLED LAPSE_ERR_BROKER_TIMEOUT

static void on_settle(void *opaque, uint64_t tag, lapse_status_t outcome) {
    lapse__relay_t *r = opaque;
    if (r->n > 0 && tag >= r->first_tag && tag - r->first_tag < r->n) {
        r->n_settled += r->outcome[tag - r->first_tag] == UNSETTLED;
        r->outcome[tag - r->first_tag] = outcome;
    } else if (r->prev_cb) {
        /* Not one of ours: a publish made before the round, settled late. */
        r->prev_cb(r->prev_opaque, tag, outcome);
    }
}

static int publish_one(void *opaque, const lapse_event_t *ev) {
    lapse__relay_t *r = opaque;
    if (r->n == r->cap) {
        return 1; /* cannot happen: the store reads at most cap rows */
    }
    amqp_basic_properties_t props;
    memset(&props, 0, sizeof props);
    props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
                   AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TIMESTAMP_FLAG |
                   AMQP_BASIC_APP_ID_FLAG | AMQP_BASIC_TYPE_FLAG;
    props.content_type = amqp_cstring_bytes("application/json");
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    /* The same id on every try, so downstream deduplicates a row published again after
     * a crash between the confirm and the marking. */
    props.message_id = amqp_cstring_bytes(ev->event_id);
    props.timestamp = (uint64_t)(lapse_clock_now_ms() / 1000);
    props.app_id = amqp_cstring_bytes(LAPSE_APP_ID);
    props.type = amqp_cstring_bytes(LAPSE_EVENT_CANCELLED);
    /* Mandatory: with no queue bound, the broker returns the event instead of
     * confirming it into nowhere, and the row stays in the outbox. */
    uint64_t tag = 0;
    lapse_status_t rc =
        lapse__broker_publish(r->broker, r->exchange, LAPSE_EVENT_CANCELLED, true, &props,
                              ev->body, strlen(ev->body), &tag, &r->publish_err);
    if (rc != LAPSE_OK) {
        r->publish_rc = rc;
        return 1;
    }
    if (r->n == 0) {
        r->first_tag = tag;
    }
    r->seqs[r->n] = ev->seq;
    r->outcome[r->n] = UNSETTLED;
    r->n++;
    return 0;
}

void lapse__relay_report_add(lapse__relay_report_t *a, const lapse__relay_report_t *b) {
    a->read += b->read;
    a->published += b->published;
    a->returned += b->returned;
    a->failed += b->failed;
}

lapse_status_t lapse__relay_start(lapse__relay_t *r, lapse__broker_t *broker,
                                  lapse_store_t *store, const char *exchange,
                                  const int64_t *only, size_t n_only, size_t limit,
                                  lapse_error_t *err) {
    *r = (lapse__relay_t){.broker = broker, .store = store, .exchange = exchange};
    if (!broker->open || !broker->confirms) {
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED,
                               "events: no confirm-mode connection");
    }
    size_t cap = only && n_only < limit ? n_only : limit;
    if (cap == 0) {
        return LAPSE_OK;
    }
    r->cap = cap;
    r->seqs = malloc(cap * sizeof *r->seqs);
    r->outcome = malloc(cap * sizeof *r->outcome);
    if (!r->seqs || !r->outcome) {
        free(r->seqs);
        free(r->outcome);
        *r = (lapse__relay_t){0};
        return lapse_error_set(err, LAPSE_ERR_NOMEM, "events round");
    }
    r->active = true;
    r->prev_cb = on_settle;
    r->prev_opaque = r;
    lapse__broker_swap_settle(broker, &r->prev_cb, &r->prev_opaque);
    lapse__broker_cork(broker);
    lapse_status_t rc =
        lapse_store_events_pending(store, cap, only, n_only, publish_one, r, err);
    lapse_error_t sent_err = {0};
    lapse_status_t sent = lapse__broker_uncork(broker, &sent_err);
    if (rc == LAPSE_OK && r->publish_rc != LAPSE_OK) {
        rc = r->publish_rc;
        if (err) {
            *err = r->publish_err;
        }
    }
    if (rc == LAPSE_OK && sent != LAPSE_OK) {
        /* The staged events never left: they stay unsettled until the connection is
         * closed, and owed. */
        rc = sent;
        if (err) {
            *err = sent_err;
        }
    }
    return rc;
}

bool lapse__relay_settled(const lapse__relay_t *r) {
    return r->n_settled == r->n;
}

lapse_status_t lapse__relay_wait(lapse__relay_t *r, int64_t timeout_ms,
                                 lapse_error_t *err) {
    if (!r->active || lapse__relay_settled(r)) {
        return LAPSE_OK;
    }
    return lapse__broker_wait_settled(r->broker, r->first_tag + r->n - 1, timeout_ms,
                                      err);
}

lapse_status_t lapse__relay_finish(lapse__relay_t *r, lapse_status_t rc,
                                   lapse__relay_report_t *report, lapse_error_t *err) {
    *report = (lapse__relay_report_t){0};
    if (!r->active) {
        return rc;
    }
    lapse__broker_swap_settle(r->broker, &r->prev_cb, &r->prev_opaque);
    /* Mark what the broker took, also after a failure: each row marked now is one
     * duplicate fewer downstream. The confirmed rows are compacted into seqs. */
    size_t n_ok = 0, n_back = 0;
    int64_t *back = malloc((r->n > 0 ? r->n : 1) * sizeof *back);
    for (size_t i = 0; i < r->n; i++) {
        if (r->outcome[i] == LAPSE_OK) {
            r->seqs[n_ok++] = r->seqs[i];
            continue;
        }
        if (r->outcome[i] == LAPSE_ERR_BROKER_RETURNED) {
            report->returned++;
        } else {
            report->failed++;
        }
        if (back != NULL) {
            back[n_back++] = r->seqs[i];
        }
    }
    /* Not published: their claim goes back, so that the next round (any relay's) takes
     * them without waiting it out. */
    lapse_store_events_release(r->store, back, n_back, NULL);
    free(back);
    report->read = r->n;
    if (n_ok > 0) {
        lapse_error_t mark_err = {0};
        lapse_status_t mrc = lapse_store_events_mark_published(
            r->store, r->seqs, n_ok, lapse_clock_now_ms(), &mark_err);
        if (mrc == LAPSE_OK) {
            report->published = n_ok;
        } else {
            /* Published but not marked: a later round publishes them again under the
             * same ids. Counted as failed so that nobody takes them for done. */
            report->failed += n_ok;
            if (rc == LAPSE_OK) {
                rc = mrc;
                if (err) {
                    *err = mark_err;
                }
            }
        }
    }
    if (rc == LAPSE_OK && report->failed > 0) {
        rc = lapse_error_set(err, LAPSE_ERR_BROKER_NACK, "%zu of %zu events nacked",
                             report->failed, r->n);
    }
    free(r->seqs);
    free(r->outcome);
    *r = (lapse__relay_t){0};
    return rc;
}

lapse_status_t lapse__events_relay(lapse__broker_t *broker, lapse_store_t *store,
                                   const char *exchange, const int64_t *only,
                                   size_t n_only, size_t limit, int64_t timeout_ms,
                                   lapse__relay_report_t *report, lapse_error_t *err) {
    lapse__relay_t r;
    lapse_status_t rc =
        lapse__relay_start(&r, broker, store, exchange, only, n_only, limit, err);
    if (rc == LAPSE_OK) {
        rc = lapse__relay_wait(&r, timeout_ms, err);
    }
    return lapse__relay_finish(&r, rc, report, err);
}

lapse_status_t lapse__events_drain(lapse__broker_t *broker, lapse_store_t *store,
                                   const char *exchange, int64_t deadline_ms,
                                   lapse__relay_stop_fn stop, void *stop_opaque,
                                   lapse__relay_report_t *total, lapse_error_t *err) {
    *total = (lapse__relay_report_t){0};
    /* A round never waits for room in the confirm window. */
    size_t round = broker->window > 0 && broker->window < LAPSE__EVENTS_ROUND
                       ? broker->window
                       : LAPSE__EVENTS_ROUND;
    for (;;) {
        int64_t left = deadline_ms - lapse__mono_ms();
        if (left <= 0 || (stop && stop(stop_opaque))) {
            return LAPSE_OK;
        }
        lapse__relay_report_t one;
        lapse_status_t rc = lapse__events_relay(
            broker, store, exchange, NULL, 0, round,
            left < LAPSE__EVENTS_WAIT_MS ? left : LAPSE__EVENTS_WAIT_MS, &one, err);
        lapse__relay_report_add(total, &one);
        if (rc != LAPSE_OK || one.returned > 0 || one.read < round) {
            return rc;
        }
    }
}

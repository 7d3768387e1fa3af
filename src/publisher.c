/* SPDX-License-Identifier: MIT
 * Publisher: orders recorded in batches, expiry messages published with confirms.
 *
 * Three batches take turns in a ring: at most two are published and wait for their
 * confirms (the window) while the third is filled and recorded. A full batch is recorded
 * before the oldest one is waited for, and published the moment that one is settled, so
 * the broker (which confirms in bursts) never waits for the publisher's store work. A
 * batch is marked scheduled and reported once all of its publishes are settled. A lost
 * connection is reopened with backoff and every publish not yet confirmed is sent again
 * (a duplicate message is a no-op for the consumer). */
#include <lapse/publisher.h>

#include "broker_int.h"
#include "publisher_int.h"
#include "topology_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BATCH           500 /* orders per store transaction */
#define HOLD_MS         20  /* the longest an order waits for its batch to fill */
#define FLIGHT          2   /* batches published and waiting for their confirms */
#define RING            (FLIGHT + 1)     /* ... and the one being filled */
#define WINDOW          (FLIGHT * BATCH) /* publishes in flight */
#define CONFIRM_WAIT_MS 30000
#define STORE_ATTEMPTS  8
#define RECOVER_TRIES                                                                    \
    6 /* reconnects in a row (about 8 s of backoff) before giving up                     \
       */

typedef struct entry {
    char order_id[LAPSE_ORDER_ID_MAX + 1];
    int64_t deadline_ms;
    int64_t created_at_ms;
    const lapse__class_t *cls; /* its holding queue, or NULL: down the ladder */
    char **holds;
    size_t n_holds;
    uint64_t ref;
    uint64_t tag; /* publish tag on its connection, 0 when not published */
    bool pending; /* published, not settled yet */
    lapse_status_t rc;
    char reason[160];
} entry_t;

typedef struct batch {
    entry_t *e; /* BATCH entries */
    size_t n;
    int64_t opened_at;  /* when its first order was submitted */
    uint64_t first_tag; /* tag of its first publish on the current connection, 0: none */
    uint64_t last_tag;  /* tag of its last publish */
    size_t *by_offset;  /* tag - first_tag -> entry index */
} batch_t;

struct lapse_publisher {
    const lapse_config_t *cfg;
    lapse_store_t *store;
    lapse_publish_cb cb;
    void *opaque;
    lapse__topology_t topo;
    lapse__broker_t broker;
    batch_t b[RING];
    int cur;           /* the batch being filled */
    int n_flight;      /* the n_flight batches before b[cur] in the ring (oldest first)
                          are published and wait for their confirms, 0..FLIGHT */
    int64_t polled_at; /* last look at the connection between flushes */
    const volatile sig_atomic_t *stop; /* borrowed, may be NULL */
};

/* The i-th batch in flight, oldest first (i < n_flight). */
static batch_t *flight(lapse_publisher_t *pub, int i) {
    return &pub->b[(pub->cur + RING - pub->n_flight + i) % RING];
}

static void on_settle(void *opaque, uint64_t tag, lapse_status_t outcome) {
    lapse_publisher_t *pub = opaque;
    for (int k = 0; k < RING; k++) {
        batch_t *b = &pub->b[k];
        if (b->first_tag == 0 || tag < b->first_tag || tag > b->last_tag) {
            continue;
        }
        entry_t *e = &b->e[b->by_offset[tag - b->first_tag]];
        if (e->tag != tag || !e->pending) {
            continue;
        }
        e->pending = false;
        e->rc = outcome;
        if (outcome != LAPSE_OK) {
            snprintf(e->reason, sizeof e->reason, "%s", lapse_strerror(outcome));
        }
        return;
    }
}

static void free_holds(entry_t *e) {
    for (size_t i = 0; i < e->n_holds; i++) {
        free(e->holds[i]);
    }
    free(e->holds);
    e->holds = NULL;
    e->n_holds = 0;
}

lapse_publisher_t *lapse_publisher_open(const lapse_config_t *cfg, lapse_store_t *store,
                                        lapse_publish_cb cb, void *opaque,
                                        lapse_status_t *rc, lapse_error_t *err) {
    lapse_publisher_t *pub = calloc(1, sizeof *pub);
    bool ok = pub != NULL;
    for (int k = 0; ok && k < RING; k++) {
        pub->b[k].e = calloc(BATCH, sizeof *pub->b[k].e);
        pub->b[k].by_offset = calloc(BATCH, sizeof *pub->b[k].by_offset);
        ok = pub->b[k].e && pub->b[k].by_offset;
    }
    if (!ok) {
        lapse_publisher_close(pub);
        *rc = lapse_error_set(err, LAPSE_ERR_NOMEM, "publisher");
        return NULL;
    }
    pub->cfg = cfg;
    pub->store = store;
    pub->cb = cb;
    pub->opaque = opaque;
    lapse__topology_build(cfg, &pub->topo);
    *rc = lapse__broker_open(&pub->broker, cfg, "lapse publish", WINDOW, on_settle, pub,
                             err);
    if (*rc != LAPSE_OK) {
        lapse_publisher_close(pub);
        return NULL;
    }
    return pub;
}

/* Report every entry of the batch to the callback, then empty it. */
static void report(lapse_publisher_t *pub, batch_t *b) {
    for (size_t i = 0; i < b->n; i++) {
        entry_t *e = &b->e[i];
        if (pub->cb) {
            pub->cb(pub->opaque, e->ref, e->order_id, e->rc,
                    e->rc == LAPSE_OK ? "" : e->reason);
        }
        free_holds(e);
    }
    b->n = 0;
    b->first_tag = b->last_tag = 0;
}

/* Fail every entry of b still waiting to be published or confirmed. */
static void fail_unsettled(batch_t *b, const lapse_error_t *why) {
    for (size_t i = 0; i < b->n; i++) {
        entry_t *e = &b->e[i];
        bool unsettled = e->tag == 0 || e->pending;
        if ((e->rc == LAPSE_OK && unsettled) || e->rc == LAPSE_ERR_BROKER_CLOSED) {
            e->pending = false;
            e->rc = why->code;
            snprintf(e->reason, sizeof e->reason, "%s", why->text);
        }
    }
}

static lapse_status_t store_insert(lapse_publisher_t *pub, batch_t *b,
                                   lapse_status_t *results, lapse_error_t *err) {
    lapse_new_order_t orders[BATCH];
    for (size_t i = 0; i < b->n; i++) {
        entry_t *e = &b->e[i];
        orders[i] = (lapse_new_order_t){.order_id = e->order_id,
                                        .deadline_ms = e->deadline_ms,
                                        .created_at_ms = e->created_at_ms,
                                        .holds = (const char *const *)e->holds,
                                        .n_holds = e->n_holds};
    }
    lapse_status_t rc = LAPSE_OK;
    for (unsigned attempt = 0; attempt < STORE_ATTEMPTS; attempt++) {
        rc = lapse_store_insert_orders(pub->store, orders, b->n, results, err);
        if (rc != LAPSE_ERR_STORE_BUSY) {
            break;
        }
        lapse__log(pub->cfg, LAPSE_LOG_WARN, "event=store_retry op=insert attempt=%u",
                   attempt + 1);
        if (!lapse__sleep_ms(lapse__backoff_ms(attempt, 50, 2000), pub->stop)) {
            return lapse_error_set(err, LAPSE_ERR_STOPPED,
                                   "stopped while the store was busy");
        }
    }
    return rc;
}

/* An order that is still pending but whose message was never confirmed (an earlier
 * publish failed) is published again with its recorded deadline, so that retrying the
 * same command completes it instead of being refused for a "new" deadline. */
static void adopt_unscheduled(lapse_publisher_t *pub, entry_t *e) {
    lapse_order_t order;
    lapse_order_init(&order);
    if (lapse_store_get(pub->store, e->order_id, &order, NULL) == LAPSE_OK &&
        order.status == LAPSE_ORDER_PENDING && !order.scheduled) {
        lapse__log(pub->cfg, LAPSE_LOG_INFO,
                   "event=republish order_id=%s deadline_ms=%lld reason=unscheduled",
                   e->order_id, (long long)order.deadline_ms);
        e->deadline_ms = order.deadline_ms;
        e->created_at_ms = order.created_at_ms;
        e->cls = NULL; /* what is left of the first deadline goes down the ladder */
        e->rc = LAPSE_OK;
    }
    lapse_order_clear(&order);
}

/* Record b in the store (one transaction) and set each entry's outcome so far. */
static lapse_status_t record(lapse_publisher_t *pub, batch_t *b, lapse_error_t *err) {
    lapse_status_t results[BATCH];
    lapse_status_t rc = store_insert(pub, b, results, err);
    for (size_t i = 0; i < b->n; i++) {
        entry_t *e = &b->e[i];
        e->tag = 0;
        e->rc = rc != LAPSE_OK ? rc : results[i];
        if (rc != LAPSE_OK) {
            snprintf(e->reason, sizeof e->reason, "%s",
                     err ? err->text : lapse_strerror(rc));
            continue;
        }
        if (e->rc == LAPSE_ERR_STORE_CONFLICT) {
            adopt_unscheduled(pub, e);
        }
        if (e->rc != LAPSE_OK) {
            snprintf(e->reason, sizeof e->reason, "%s",
                     e->rc == LAPSE_ERR_STORE_CONFLICT
                         ? "order exists with another deadline"
                         : "order exists and is no longer pending");
        }
    }
    return rc;
}

/* Publish the entries of b that are recorded but not on the broker yet: all of them
 * the first time, those the broker never confirmed after a reconnect. */
static lapse_status_t publish(lapse_publisher_t *pub, batch_t *b, lapse_error_t *err) {
    b->first_tag = b->last_tag = 0;
    /* What remains of each deadline is measured by the clock that decides (the store's
     * own, when it has one); the host's stands in if the store cannot say just now. */
    int64_t now = 0;
    if (lapse_store_now(pub->store, &now, NULL) != LAPSE_OK) {
        now = lapse_clock_now_ms();
    }
    lapse_status_t rc = LAPSE_OK;
    lapse__broker_cork(&pub->broker);
    for (size_t i = 0; i < b->n && rc == LAPSE_OK; i++) {
        entry_t *e = &b->e[i];
        if (e->rc == LAPSE_ERR_BROKER_CLOSED) {
            e->rc = LAPSE_OK; /* lost with the connection: send again */
        } else if (e->rc != LAPSE_OK || e->tag != 0) {
            continue;
        }
        lapse_expiry_msg_t msg = {.version = 1,
                                  .deadline_ms = e->deadline_ms,
                                  .created_at_ms = e->created_at_ms};
        memcpy(msg.order_id, e->order_id, sizeof msg.order_id);
        uint64_t tag = pub->broker.next_tag;
        if (b->first_tag == 0) {
            b->first_tag = tag;
        }
        b->by_offset[tag - b->first_tag] = i;
        b->last_tag = tag;
        e->tag = tag;
        e->pending = true;
        rc = lapse__publish_route(&pub->broker, &pub->topo, e->cls, &msg, now, NULL, err);
        if (rc != LAPSE_OK) {
            e->tag = 0;
            e->pending = false;
            b->last_tag = tag - 1;
            if (!lapse_status_is_retriable(rc) && rc != LAPSE_ERR_STOPPED) {
                e->rc = rc; /* this order's own problem (e.g. too far ahead) */
                snprintf(e->reason, sizeof e->reason, "%s", err ? err->text : "");
                rc = LAPSE_OK;
            } else {
                e->rc = LAPSE_ERR_BROKER_CLOSED;
            }
        }
    }
    /* A failed send of the staged publishes closed the connection: they are
     * unconfirmed, and recover() publishes them again. */
    lapse_status_t sent = lapse__broker_uncork(&pub->broker, rc == LAPSE_OK ? err : NULL);
    return rc == LAPSE_OK ? sent : rc;
}

/* The connection failed: reopen it with backoff and publish again whatever it took
 * down unconfirmed, the batches in flight oldest first. */
static lapse_status_t recover(lapse_publisher_t *pub, lapse_status_t why,
                              lapse_error_t *err) {
    lapse_status_t rc = why;
    for (unsigned attempt = 0; attempt < RECOVER_TRIES; attempt++) {
        char text[sizeof err->text] = "";
        if (err) {
            snprintf(text, sizeof text, "%s", err->text);
        }
        lapse__broker_close(&pub->broker); /* the unconfirmed become BROKER_CLOSED */
        int64_t delay = lapse__backoff_ms(attempt, 250, 4000);
        lapse__log(pub->cfg, LAPSE_LOG_WARN,
                   "event=reconnect status=%s reason=\"%s\" attempt=%u delay_ms=%lld",
                   lapse_status_name(rc), text, attempt + 1, (long long)delay);
        if (!lapse__sleep_ms(delay, pub->stop)) {
            rc = lapse_error_set(err, LAPSE_ERR_STOPPED,
                                 "stopped while reconnecting to the broker");
            break;
        }
        rc = lapse__broker_open(&pub->broker, pub->cfg, "lapse publish", WINDOW,
                                on_settle, pub, err);
        pub->broker.stop = pub->stop;
        for (int i = 0; rc == LAPSE_OK && i < pub->n_flight; i++) {
            rc = publish(pub, flight(pub, i), err);
        }
        if (rc == LAPSE_OK) {
            return rc;
        }
        if (!lapse_status_is_retriable(rc)) {
            break;
        }
    }
    /* Giving up: whatever is still unconfirmed is reported as lost with the connection.
     */
    lapse__broker_close(&pub->broker);
    return rc;
}

/* Wait until every publish of b is settled, reconnecting and re-sending as needed. */
static lapse_status_t settle(lapse_publisher_t *pub, batch_t *b, lapse_error_t *err) {
    /* Bounded: a broker that takes connections but never confirms (an alarm, a quorum
     * queue without its majority) must end in a failure, not in a loop. */
    for (unsigned round = 0;; round++) {
        lapse_status_t rc = b->first_tag == 0
                                ? LAPSE_OK
                                : lapse__broker_wait_settled(&pub->broker, b->last_tag,
                                                             CONFIRM_WAIT_MS, err);
        bool lost = false;
        for (size_t i = 0; i < b->n; i++) {
            lost |= b->e[i].rc == LAPSE_ERR_BROKER_CLOSED;
        }
        if (rc == LAPSE_OK && !lost) {
            return LAPSE_OK;
        }
        if (rc == LAPSE_OK) {
            rc = lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "connection lost");
        }
        if ((!lapse_status_is_retriable(rc) && rc != LAPSE_ERR_BROKER_CLOSED) ||
            round == RECOVER_TRIES) {
            lapse__broker_close(&pub->broker); /* the unconfirmed become BROKER_CLOSED */
            return rc;
        }
        rc = recover(pub, rc, err);
        if (rc != LAPSE_OK) {
            return rc;
        }
    }
}

/* Only orders the broker confirmed are marked scheduled; the rest stay pending and
 * unscheduled so that a later sweep publishes them again. Then report b. */
static void complete(lapse_publisher_t *pub, batch_t *b) {
    const char *confirmed[BATCH];
    size_t n_confirmed = 0;
    for (size_t i = 0; i < b->n; i++) {
        if (b->e[i].rc == LAPSE_OK) {
            confirmed[n_confirmed++] = b->e[i].order_id;
        }
    }
    lapse_status_t mrc = LAPSE_OK;
    lapse_error_t err = {0};
    for (unsigned attempt = 0; n_confirmed > 0 && attempt < STORE_ATTEMPTS; attempt++) {
        mrc = lapse_store_mark_scheduled(pub->store, confirmed, n_confirmed, &err);
        if (mrc != LAPSE_ERR_STORE_BUSY) {
            break;
        }
        /* Confirmed already: the marking is worth its short retries even when stopping.
         */
        lapse__sleep_ms(lapse__backoff_ms(attempt, 50, 2000), NULL);
    }
    if (mrc != LAPSE_OK) {
        /* Published and confirmed, so the order will be cancelled on time; only the
         * scheduled flag is missing, which at worst causes a harmless re-publish. */
        lapse__log(pub->cfg, LAPSE_LOG_WARN, "event=mark_scheduled_failed status=%s",
                   lapse_status_name(mrc));
    }
    report(pub, b);
}

/* Fail what is still unsettled in b with code (and err's text, when there is one). */
static void fail_batch(batch_t *b, lapse_status_t code, const lapse_error_t *err) {
    lapse_error_t why = {.code = code};
    snprintf(why.text, sizeof why.text, "%s", err ? err->text : lapse_strerror(code));
    fail_unsettled(b, &why);
}

/* b's publishes are all confirmed already, none lost with a connection. */
static bool settled_now(const lapse_publisher_t *pub, const batch_t *b) {
    if (b->first_tag != 0 && pub->broker.first_open <= b->last_tag) {
        return false;
    }
    for (size_t i = 0; i < b->n; i++) {
        if (b->e[i].rc == LAPSE_ERR_BROKER_CLOSED) {
            return false;
        }
    }
    return true;
}

/* Record the batch being filled; once the window has room for it (the oldest batch in
 * flight settled, when two are), publish it, then mark and report the settled one.
 * all = true: then settle and report every batch in flight. After a failure every batch
 * in flight is failed and reported too. */
static lapse_status_t cycle(lapse_publisher_t *pub, bool all, lapse_error_t *err) {
    batch_t *cur = &pub->b[pub->cur];
    lapse_status_t rrc = LAPSE_OK; /* recording cur */
    lapse_status_t rc = LAPSE_OK;  /* the broker's part */
    if (cur->n > 0) {
        rrc = record(pub, cur, err);
        if (rrc != LAPSE_OK) {
            /* Nothing of it was written: report it failed; those in flight are still
             * settled below. */
            report(pub, cur);
        }
    }
    batch_t *done = NULL; /* settled, marked and reported once cur is on its way */
    if (cur->n > 0 && pub->n_flight == FLIGHT) {
        done = flight(pub, 0);
        rc = settle(pub, done, err);
        pub->n_flight--;
        if (rc != LAPSE_OK) {
            fail_batch(done, rc, err);
            fail_batch(cur, rc, err);
        }
    }
    if (cur->n > 0) {
        pub->n_flight++;
        pub->cur = (pub->cur + 1) % RING;
        if (rc == LAPSE_OK) {
            rc = publish(pub, cur, err);
            if (rc != LAPSE_OK && rc != LAPSE_ERR_STOPPED) {
                rc = recover(pub, rc, err);
            }
        }
    }
    if (done) {
        complete(pub, done);
    }
    /* The rest in flight, oldest first: all of them when flushing or failing; else those
     * already settled, so that a trickle of orders is reported without waiting for the
     * batches after it. */
    if (rc == LAPSE_OK && !all && pub->n_flight > 1) {
        lapse__broker_poll(&pub->broker, 0, NULL); /* a failure shows at the next wait */
    }
    while (pub->n_flight > 0) {
        batch_t *b = flight(pub, 0);
        if (rc == LAPSE_OK && !all && (b == cur || !settled_now(pub, b))) {
            break;
        }
        if (rc == LAPSE_OK) {
            rc = settle(pub, b, err);
        }
        if (rc != LAPSE_OK) {
            fail_batch(b, rc, err);
        }
        pub->n_flight--;
        complete(pub, b);
    }
    return rrc != LAPSE_OK ? rrc : rc;
}

void lapse_publisher_set_stop(lapse_publisher_t *pub, const volatile sig_atomic_t *stop) {
    pub->stop = stop;
    pub->broker.stop = stop;
}

lapse_status_t lapse_publisher_flush(lapse_publisher_t *pub, lapse_error_t *err) {
    return cycle(pub, true, err);
}

lapse_status_t lapse_publisher_submit(lapse_publisher_t *pub,
                                      const lapse_new_order_t *order, int64_t timeout_ms,
                                      uint64_t ref, lapse_error_t *err) {
    const lapse__class_t *cls =
        timeout_ms > 0 ? lapse__config_find_class(pub->cfg, timeout_ms) : NULL;
    size_t id_len = order->order_id ? strlen(order->order_id) : 0;
    const char *refused = NULL;
    if (!lapse_order_id_is_valid(order->order_id, id_len)) {
        refused = "invalid order id";
    } else if (order->deadline_ms - lapse_clock_now_ms() > LAPSE_MAX_DELAY_MS) {
        refused = "deadline beyond the longest delay (2^28-1 s, about 8.5 years)";
    }
    if (refused) {
        if (pub->cb) {
            pub->cb(pub->opaque, ref, order->order_id ? order->order_id : "",
                    LAPSE_ERR_INVALID, refused);
        }
        return LAPSE_OK;
    }
    batch_t *b = &pub->b[pub->cur];
    entry_t *e = &b->e[b->n];
    memset(e, 0, sizeof *e);
    memcpy(e->order_id, order->order_id, id_len + 1);
    e->deadline_ms = order->deadline_ms;
    e->created_at_ms = order->created_at_ms;
    e->cls = cls;
    e->ref = ref;
    if (order->n_holds > 0) {
        e->holds = calloc(order->n_holds, sizeof *e->holds);
        if (!e->holds) {
            return lapse_error_set(err, LAPSE_ERR_NOMEM, "holds");
        }
        for (size_t i = 0; i < order->n_holds; i++) {
            e->holds[i] = strdup(order->holds[i]);
            if (!e->holds[i]) {
                free_holds(e);
                return lapse_error_set(err, LAPSE_ERR_NOMEM, "holds");
            }
            e->n_holds++;
        }
    }
    int64_t now = lapse_clock_now_ms();
    if (b->n++ == 0) {
        b->opened_at = now;
    }
    /* Full, or its first order has waited long enough: a steady trickle of orders must
     * not wait for a whole batch (their deadlines are already running). */
    if (b->n == BATCH || now - b->opened_at >= HOLD_MS) {
        return cycle(pub, false, err);
    }
    /* Input may trickle in (a pipe): keep the connection's heartbeats going meanwhile.
     * A failure shows up, and is handled, at the next flush. */
    if (now - pub->polled_at >= 1000) {
        pub->polled_at = now;
        lapse__broker_poll(&pub->broker, 0, NULL);
    }
    return LAPSE_OK;
}

size_t lapse_publisher_pending(const lapse_publisher_t *pub) {
    size_t n = 0;
    for (int k = 0; k < RING; k++) {
        n += pub->b[k].n;
    }
    return n;
}

void lapse_publisher_close(lapse_publisher_t *pub) {
    if (!pub) {
        return;
    }
    /* Orders still held (not flushed, or a flush that stopped early) are reported as not
     * published: they stay pending and unscheduled for a sweep or a retry. */
    lapse__broker_close(&pub->broker);
    lapse_error_t why = {.code = LAPSE_ERR_BROKER_CLOSED};
    snprintf(why.text, sizeof why.text, "not published: the publisher was closed first");
    for (int k = 1; k <= RING; k++) {
        batch_t *b = &pub->b[(pub->cur + k) % RING]; /* the oldest batch first */
        if (b->e && b->n > 0) {
            fail_unsettled(b, &why);
            report(pub, b);
        }
    }
    for (int k = 0; k < RING; k++) {
        free(pub->b[k].e);
        free(pub->b[k].by_offset);
    }
    free(pub);
}

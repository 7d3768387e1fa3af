/* SPDX-License-Identifier: MIT
 * Publisher: orders recorded in batches, expiry messages published with confirms. */
#include <lapse/publisher.h>

#include "broker_int.h"
#include "publisher_int.h"
#include "topology_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(LAPSE_MAX_DELAY_MS == LAPSE__LADDER_MAX_MS, "the ladder sets the limit");

#define BATCH           500  /* orders per store transaction */
#define WINDOW          1000 /* publishes in flight */
#define CONFIRM_WAIT_MS 30000
#define STORE_ATTEMPTS  8

typedef struct entry {
    char order_id[LAPSE_ORDER_ID_MAX + 1];
    int64_t deadline_ms;
    int64_t created_at_ms;
    const lapse__class_t *cls; /* its holding queue, or NULL: down the ladder */
    char **holds;
    size_t n_holds;
    uint64_t ref;
    uint64_t tag; /* publish tag, 0 when not published */
    lapse_status_t rc;
    char reason[160];
} entry_t;

struct lapse_publisher {
    const lapse_config_t *cfg;
    lapse_store_t *store;
    lapse_publish_cb cb;
    void *opaque;
    lapse__topology_t topo;
    lapse__broker_t broker;
    entry_t *batch;
    size_t n;
    uint64_t first_tag; /* tag of the batch's first publish */
    size_t *by_offset;  /* tag - first_tag -> batch index */
    int64_t polled_at;  /* last look at the connection between flushes */
};

lapse_status_t lapse__publish_expiry(lapse__broker_t *broker, const char *exchange,
                                     const char *routing_key,
                                     const lapse_expiry_msg_t *msg, int attempts,
                                     uint64_t *tag, lapse_error_t *err) {
    char body[LAPSE_ORDER_ID_MAX + 160];
    size_t len;
    lapse_status_t rc = lapse_expiry_msg_encode(msg, body, sizeof body, &len);
    if (rc != LAPSE_OK) {
        return lapse_error_set(err, rc, "encode %s", msg->order_id);
    }
    amqp_table_entry_t headers[2] = {
        lapse__entry_i64(LAPSE_HDR_DEADLINE, msg->deadline_ms),
        lapse__entry_i64(LAPSE_HDR_ATTEMPTS, attempts)};
    amqp_basic_properties_t props;
    memset(&props, 0, sizeof props);
    props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
                   AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TIMESTAMP_FLAG |
                   AMQP_BASIC_APP_ID_FLAG | AMQP_BASIC_TYPE_FLAG |
                   AMQP_BASIC_HEADERS_FLAG;
    props.content_type = amqp_cstring_bytes("application/json");
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    props.message_id = amqp_cstring_bytes(msg->order_id);
    props.timestamp = (uint64_t)(msg->created_at_ms / 1000);
    props.app_id = amqp_cstring_bytes(LAPSE_APP_ID);
    props.type = amqp_cstring_bytes(LAPSE_MSG_TYPE);
    props.headers.num_entries = attempts > 0 ? 2 : 1;
    props.headers.entries = headers;
    return lapse__broker_publish(broker, exchange, routing_key, true, &props, body, len,
                                 msg->order_id, tag, err);
}

lapse_status_t lapse_deadline_check(int64_t deadline_ms, int64_t now_ms,
                                    lapse_error_t *err) {
    char when[LAPSE_RFC3339_LEN];
    lapse_time_format_rfc3339(deadline_ms, when);
    if (deadline_ms <= now_ms) {
        return lapse_error_set(err, LAPSE_ERR_INVALID, "deadline %s is in the past",
                               when);
    }
    if (deadline_ms - now_ms > LAPSE_MAX_DELAY_MS) {
        return lapse_error_set(err, LAPSE_ERR_INVALID,
                               "deadline %s is too far ahead: the longest delay is "
                               "%lld s (about 8.5 years)",
                               when, (long long)(LAPSE_MAX_DELAY_MS / 1000));
    }
    return LAPSE_OK;
}

lapse_status_t lapse__publish_route(lapse__broker_t *broker,
                                    const lapse__topology_t *topo,
                                    const lapse__class_t *cls,
                                    const lapse_expiry_msg_t *msg, int64_t now_ms,
                                    uint64_t *tag, lapse_error_t *err) {
    if (cls) {
        return lapse__publish_expiry(broker, topo->hold_exchange, cls->name, msg, 0, tag,
                                     err);
    }
    lapse__ladder_route_t route;
    if (lapse__ladder_route(msg->deadline_ms - now_ms, &route) != LAPSE_OK) {
        return lapse_error_set(err, LAPSE_ERR_INVALID,
                               "%s: deadline beyond the longest delay", msg->order_id);
    }
    return lapse__publish_expiry(broker, topo->delay[route.top], route.routing_key, msg,
                                 0, tag, err);
}

static void on_settle(void *opaque, uint64_t tag, lapse_status_t outcome) {
    lapse_publisher_t *pub = opaque;
    if (tag < pub->first_tag || tag - pub->first_tag >= pub->n) {
        return;
    }
    entry_t *e = &pub->batch[pub->by_offset[tag - pub->first_tag]];
    e->rc = outcome;
    if (outcome != LAPSE_OK) {
        snprintf(e->reason, sizeof e->reason, "%s", lapse_strerror(outcome));
    }
}

lapse_publisher_t *lapse_publisher_open(const lapse_config_t *cfg, lapse_store_t *store,
                                        lapse_publish_cb cb, void *opaque,
                                        lapse_status_t *rc, lapse_error_t *err) {
    lapse_publisher_t *pub = calloc(1, sizeof *pub);
    if (pub) {
        pub->batch = calloc(BATCH, sizeof *pub->batch);
        pub->by_offset = calloc(BATCH, sizeof *pub->by_offset);
    }
    if (!pub || !pub->batch || !pub->by_offset) {
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

static void free_holds(entry_t *e) {
    for (size_t i = 0; i < e->n_holds; i++) {
        free(e->holds[i]);
    }
    free(e->holds);
    e->holds = NULL;
    e->n_holds = 0;
}

/* Report every entry of the batch to the callback, then empty it. */
static void report(lapse_publisher_t *pub) {
    for (size_t i = 0; i < pub->n; i++) {
        entry_t *e = &pub->batch[i];
        if (pub->cb) {
            pub->cb(pub->opaque, e->ref, e->order_id, e->rc,
                    e->rc == LAPSE_OK ? "" : e->reason);
        }
        free_holds(e);
    }
    pub->n = 0;
}

static void fail_unsettled(lapse_publisher_t *pub, const lapse_error_t *why) {
    for (size_t i = 0; i < pub->n; i++) {
        entry_t *e = &pub->batch[i];
        if (e->rc == LAPSE_OK && e->tag != 0 && e->tag >= pub->broker.first_open) {
            e->rc = why->code;
            snprintf(e->reason, sizeof e->reason, "%s", why->text);
        }
    }
}

static lapse_status_t store_insert(lapse_publisher_t *pub, lapse_status_t *results,
                                   lapse_error_t *err) {
    lapse_new_order_t orders[BATCH];
    for (size_t i = 0; i < pub->n; i++) {
        entry_t *e = &pub->batch[i];
        orders[i] = (lapse_new_order_t){.order_id = e->order_id,
                                        .deadline_ms = e->deadline_ms,
                                        .created_at_ms = e->created_at_ms,
                                        .holds = (const char *const *)e->holds,
                                        .n_holds = e->n_holds};
    }
    lapse_status_t rc = LAPSE_OK;
    for (unsigned attempt = 0; attempt < STORE_ATTEMPTS; attempt++) {
        rc = lapse_store_insert_orders(pub->store, orders, pub->n, results, err);
        if (rc != LAPSE_ERR_STORE_BUSY) {
            break;
        }
        lapse__log(pub->cfg, LAPSE_LOG_WARN, "event=store_retry op=insert attempt=%u",
                   attempt + 1);
        lapse__sleep_ms(lapse__backoff_ms(attempt, 50, 2000), NULL);
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

lapse_status_t lapse_publisher_flush(lapse_publisher_t *pub, lapse_error_t *err) {
    if (pub->n == 0) {
        return LAPSE_OK;
    }
    lapse_status_t results[BATCH];
    lapse_status_t rc = store_insert(pub, results, err);
    if (rc != LAPSE_OK) {
        for (size_t i = 0; i < pub->n; i++) {
            pub->batch[i].rc = rc;
            snprintf(pub->batch[i].reason, sizeof pub->batch[i].reason, "%s",
                     err ? err->text : lapse_strerror(rc));
        }
        report(pub);
        return rc;
    }

    pub->first_tag = pub->broker.next_tag;
    size_t published = 0;
    for (size_t i = 0; i < pub->n && rc == LAPSE_OK; i++) {
        entry_t *e = &pub->batch[i];
        e->rc = results[i];
        if (e->rc == LAPSE_ERR_STORE_CONFLICT) {
            adopt_unscheduled(pub, e);
        }
        if (e->rc != LAPSE_OK) {
            snprintf(e->reason, sizeof e->reason, "%s",
                     e->rc == LAPSE_ERR_STORE_CONFLICT
                         ? "order exists with another deadline"
                         : "order exists and is no longer pending");
            continue;
        }
        lapse_expiry_msg_t msg = {.version = 1,
                                  .deadline_ms = e->deadline_ms,
                                  .created_at_ms = e->created_at_ms};
        memcpy(msg.order_id, e->order_id, sizeof msg.order_id);
        pub->by_offset[published++] = i;
        rc = lapse__publish_route(&pub->broker, &pub->topo, e->cls, &msg,
                                  lapse_clock_now_ms(), &e->tag, err);
    }
    if (rc == LAPSE_OK) {
        rc = lapse__broker_wait_confirms(&pub->broker, CONFIRM_WAIT_MS, err);
    }
    if (rc != LAPSE_OK) {
        lapse_error_t why = {.code = rc};
        snprintf(why.text, sizeof why.text, "%s", err ? err->text : lapse_strerror(rc));
        fail_unsettled(pub, &why);
        for (size_t i = 0; i < pub->n; i++) {
            if (pub->batch[i].rc == LAPSE_OK && pub->batch[i].tag == 0) {
                pub->batch[i].rc = rc; /* never published */
                snprintf(pub->batch[i].reason, sizeof pub->batch[i].reason, "%s",
                         why.text);
            }
        }
    }

    /* Only orders the broker confirmed are marked scheduled; the rest stay pending and
     * unscheduled so that a later sweep publishes them again. */
    const char *confirmed[BATCH];
    size_t n_confirmed = 0;
    for (size_t i = 0; i < pub->n; i++) {
        if (pub->batch[i].rc == LAPSE_OK) {
            confirmed[n_confirmed++] = pub->batch[i].order_id;
        }
    }
    lapse_status_t mrc = LAPSE_OK;
    for (unsigned attempt = 0; n_confirmed > 0 && attempt < STORE_ATTEMPTS; attempt++) {
        mrc = lapse_store_mark_scheduled(pub->store, confirmed, n_confirmed, err);
        if (mrc != LAPSE_ERR_STORE_BUSY) {
            break;
        }
        lapse__sleep_ms(lapse__backoff_ms(attempt, 50, 2000), NULL);
    }
    if (mrc != LAPSE_OK) {
        /* Published and confirmed, so the order will be cancelled on time; only the
         * scheduled flag is missing, which at worst causes a harmless re-publish. */
        lapse__log(pub->cfg, LAPSE_LOG_WARN, "event=mark_scheduled_failed status=%s",
                   lapse_status_name(mrc));
    }
    report(pub);
    return rc;
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
    entry_t *e = &pub->batch[pub->n];
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
    pub->n++;
    if (pub->n == BATCH) {
        return lapse_publisher_flush(pub, err);
    }
    /* Input may trickle in (a pipe): keep the connection's heartbeats going meanwhile.
     * A failure shows up, and is reported, at the next flush. */
    int64_t now = lapse_clock_now_ms();
    if (now - pub->polled_at >= 1000) {
        pub->polled_at = now;
        lapse__broker_poll(&pub->broker, 0, NULL);
    }
    return LAPSE_OK;
}

void lapse_publisher_close(lapse_publisher_t *pub) {
    if (!pub) {
        return;
    }
    for (size_t i = 0; pub->batch && i < pub->n; i++) {
        free_holds(&pub->batch[i]);
    }
    lapse__broker_close(&pub->broker);
    free(pub->batch);
    free(pub->by_offset);
    free(pub);
}

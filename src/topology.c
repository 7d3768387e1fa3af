/* SPDX-License-Identifier: MIT
 * The topology as one table, declared on the broker, exported as definitions, inspected.
 */
#include "topology_int.h"

#include "broker_int.h"

#include <lapse/message.h>

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static void add_exchange(lapse__topology_t *topo, const char *name, const char *type,
                         const char *alternate) {
    lapse__exchange_def_t *x = &topo->exchanges[topo->n_exchanges++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->type = type;
    snprintf(x->alternate, sizeof x->alternate, "%s", alternate);
}

static void add_queue(lapse__topology_t *topo, const char *name, int64_t ttl_ms,
                      const char *dlx, const char *dlrk) {
    lapse__queue_def_t *q = &topo->queues[topo->n_queues++];
    snprintf(q->name, sizeof q->name, "%s", name);
    q->ttl_ms = ttl_ms;
    snprintf(q->dlx, sizeof q->dlx, "%s", dlx);
    snprintf(q->dlrk, sizeof q->dlrk, "%s", dlrk);
}

static void add_binding(lapse__topology_t *topo, const char *source, const char *dest,
                        bool to_exchange, const char *rk) {
    lapse__binding_def_t *b = &topo->bindings[topo->n_bindings++];
    snprintf(b->source, sizeof b->source, "%s", source);
    snprintf(b->destination, sizeof b->destination, "%s", dest);
    b->to_exchange = to_exchange;
    snprintf(b->routing_key, sizeof b->routing_key, "%s", rk);
}

void lapse__topology_build(const lapse_config_t *cfg, lapse__topology_t *topo) {
    memset(topo, 0, sizeof *topo);
    topo->quorum = cfg->quorum;
    const char *p = cfg->prefix;
    snprintf(topo->hold_exchange, LAPSE__NAME_MAX, "%s.hold", p);
    snprintf(topo->expired_exchange, LAPSE__NAME_MAX, "%s.expired", p);
    snprintf(topo->expired_queue, LAPSE__NAME_MAX, "%s.expired", p);
    snprintf(topo->parked_exchange, LAPSE__NAME_MAX, "%s.parked", p);
    snprintf(topo->parked_queue, LAPSE__NAME_MAX, "%s.parked", p);
    snprintf(topo->events_exchange, LAPSE__NAME_MAX, "%s.events", p);

    for (int k = 0; k < LAPSE__LADDER_RUNGS; k++) {
        /* Zero-padded so that the rungs sort in order in the management UI. */
        snprintf(topo->delay[k], LAPSE__NAME_MAX, "%s.delay.%02d", p, k);
    }

    add_exchange(topo, topo->hold_exchange, "direct", "");
    for (int k = LAPSE__LADDER_RUNGS - 1; k >= 0; k--) {
        add_exchange(topo, topo->delay[k], "topic", "");
    }
    /* A dead letter that matches no binding would be dropped silently by classic
     * dead-lettering; the alternate exchange parks it instead. */
    add_exchange(topo, topo->expired_exchange, "direct", topo->parked_exchange);
    add_exchange(topo, topo->parked_exchange, "fanout", "");
    add_exchange(topo, topo->events_exchange, "topic", "");

    char name[LAPSE__NAME_MAX];
    /* One queue per class: every message in it has the same TTL, so the queue is FIFO in
     * expiry order and no message waits behind a longer-lived one. */
    for (size_t i = 0; i < cfg->n_classes; i++) {
        snprintf(name, sizeof name, "%s.hold.%s", p, cfg->classes[i].name);
        add_queue(topo, name, cfg->classes[i].ttl_ms, topo->expired_exchange,
                  LAPSE__RK_EXPIRED);
        add_binding(topo, topo->hold_exchange, name, false, cfg->classes[i].name);
    }
    /* The ladder (see ladder_int.h): rung k holds for 2^k s, one TTL per queue, so no
     * message waits behind a longer-lived one; the routing key says which rungs to
     * visit, and the broker alone moves a message from rung to rung. */
    char pattern[LAPSE__LADDER_RK_LEN];
    for (int k = 0; k < LAPSE__LADDER_RUNGS; k++) {
        int64_t ttl_ms = (INT64_C(1) << k) * 1000;
        if (k == 0) {
            add_queue(topo, topo->delay[k], ttl_ms, topo->expired_exchange,
                      LAPSE__RK_EXPIRED);
        } else {
            add_queue(topo, topo->delay[k], ttl_ms, topo->delay[k - 1], "");
        }
        lapse__ladder_pattern(k, 1, pattern);
        add_binding(topo, topo->delay[k], topo->delay[k], false, pattern);
        lapse__ladder_pattern(k, 0, pattern);
        if (k == 0) {
            add_binding(topo, topo->delay[k], topo->expired_queue, false, pattern);
        } else {
            add_binding(topo, topo->delay[k], topo->delay[k - 1], true, pattern);
        }
    }

    add_queue(topo, topo->expired_queue, 0, topo->parked_exchange, "");
    add_binding(topo, topo->expired_exchange, topo->expired_queue, false,
                LAPSE__RK_EXPIRED);
    add_queue(topo, topo->parked_queue, 0, "", "");
    add_binding(topo, topo->parked_exchange, topo->parked_queue, false, "");

    /* Events are published mandatory and wait in the outbox while no queue takes them;
     * this queue keeps them for whoever reads them later. Bound to order.cancelled, not
     * "#": its readers expect that one event, and another kind lapse may publish one day
     * must not pour into their queue unannounced. */
    if (cfg->events_queue[0]) {
        snprintf(topo->events_queue, LAPSE__NAME_MAX, "%s", cfg->events_queue);
        add_queue(topo, topo->events_queue, 0, "", "");
        add_binding(topo, topo->events_exchange, topo->events_queue, false,
                    LAPSE_EVENT_CANCELLED);
    }
}

/* Quorum queues dead-letter at-least-once only with reject-publish overflow; without it
 * the argument is accepted and silently ignored (docs/design.md, "Topology"). */
#define QUEUE_ARGS_MAX 6

static amqp_table_t queue_args(const lapse__topology_t *topo, const lapse__queue_def_t *q,
                               amqp_table_entry_t e[QUEUE_ARGS_MAX]) {
    amqp_table_t t = {.num_entries = 0, .entries = e};
    if (topo->quorum) {
        e[t.num_entries++] = lapse__entry_str("x-queue-type", "quorum");
        if (q->dlx[0]) {
            e[t.num_entries++] =
                lapse__entry_str("x-dead-letter-strategy", "at-least-once");
            e[t.num_entries++] = lapse__entry_str("x-overflow", "reject-publish");
        }
    }
    if (q->ttl_ms > 0) {
        e[t.num_entries++] = lapse__entry_i64("x-message-ttl", q->ttl_ms);
    }
    if (q->dlx[0]) {
        e[t.num_entries++] = lapse__entry_str("x-dead-letter-exchange", q->dlx);
    }
    if (q->dlrk[0]) {
        e[t.num_entries++] = lapse__entry_str("x-dead-letter-routing-key", q->dlrk);
    }
    return t;
}

lapse_status_t lapse_topology_declare(const lapse_config_t *cfg, lapse_error_t *err) {
    lapse__topology_t topo;
    lapse__topology_build(cfg, &topo);
    lapse__broker_t broker;
    lapse_status_t rc =
        lapse__broker_open(&broker, cfg, "lapse topology", 0, NULL, NULL, err);
    if (rc != LAPSE_OK) {
        return rc;
    }
    char what[2 * LAPSE__NAME_MAX + 64];
    for (size_t i = 0; i < topo.n_exchanges && rc == LAPSE_OK; i++) {
        const lapse__exchange_def_t *x = &topo.exchanges[i];
        amqp_table_entry_t e[1];
        amqp_table_t args = {.num_entries = 0, .entries = e};
        if (x->alternate[0]) {
            e[args.num_entries++] = lapse__entry_str("alternate-exchange", x->alternate);
        }
        amqp_exchange_declare(broker.conn, LAPSE__CHANNEL, amqp_cstring_bytes(x->name),
                              amqp_cstring_bytes(x->type), 0, 1, 0, 0, args);
        snprintf(what, sizeof what, "declare exchange %s", x->name);
        rc = lapse__broker_reply(&broker, amqp_get_rpc_reply(broker.conn), what, err);
    }
    for (size_t i = 0; i < topo.n_queues && rc == LAPSE_OK; i++) {
        const lapse__queue_def_t *q = &topo.queues[i];
        amqp_table_entry_t e[QUEUE_ARGS_MAX];
        amqp_queue_declare(broker.conn, LAPSE__CHANNEL, amqp_cstring_bytes(q->name), 0, 1,
                           0, 0, queue_args(&topo, q, e));
        snprintf(what, sizeof what, "declare queue %s", q->name);
        rc = lapse__broker_reply(&broker, amqp_get_rpc_reply(broker.conn), what, err);
    }
    for (size_t i = 0; i < topo.n_bindings && rc == LAPSE_OK; i++) {
        const lapse__binding_def_t *b = &topo.bindings[i];
        if (b->to_exchange) {
            amqp_exchange_bind(broker.conn, LAPSE__CHANNEL,
                               amqp_cstring_bytes(b->destination),
                               amqp_cstring_bytes(b->source),
                               amqp_cstring_bytes(b->routing_key), amqp_empty_table);
        } else {
            amqp_queue_bind(broker.conn, LAPSE__CHANNEL,
                            amqp_cstring_bytes(b->destination),
                            amqp_cstring_bytes(b->source),
                            amqp_cstring_bytes(b->routing_key), amqp_empty_table);
        }
        snprintf(what, sizeof what, "bind %s to %s", b->destination, b->source);
        rc = lapse__broker_reply(&broker, amqp_get_rpc_reply(broker.conn), what, err);
    }
    lapse__broker_close(&broker);
    return rc;
}

char *lapse_topology_export(const lapse_config_t *cfg) {
    lapse__topology_t topo;
    lapse__topology_build(cfg, &topo);
    json_t *root = json_object();
    json_t *exchanges = json_array();
    json_t *queues = json_array();
    json_t *bindings = json_array();
    json_object_set_new(root, "exchanges", exchanges);
    json_object_set_new(root, "queues", queues);
    json_object_set_new(root, "bindings", bindings);

    for (size_t i = 0; i < topo.n_exchanges; i++) {
        const lapse__exchange_def_t *x = &topo.exchanges[i];
        json_t *args = json_object();
        if (x->alternate[0]) {
            json_object_set_new(args, "alternate-exchange", json_string(x->alternate));
        }
        json_array_append_new(exchanges, json_pack("{s:s, s:s, s:s, s:b, s:b, s:b, s:o}",
                                                   "name", x->name, "vhost", "/", "type",
                                                   x->type, "durable", 1, "auto_delete",
                                                   0, "internal", 0, "arguments", args));
    }
    for (size_t i = 0; i < topo.n_queues; i++) {
        const lapse__queue_def_t *q = &topo.queues[i];
        json_t *args = json_object();
        if (topo.quorum) {
            json_object_set_new(args, "x-queue-type", json_string("quorum"));
            if (q->dlx[0]) {
                json_object_set_new(args, "x-dead-letter-strategy",
                                    json_string("at-least-once"));
                json_object_set_new(args, "x-overflow", json_string("reject-publish"));
            }
        }
        if (q->ttl_ms > 0) {
            json_object_set_new(args, "x-message-ttl", json_integer(q->ttl_ms));
        }
        if (q->dlx[0]) {
            json_object_set_new(args, "x-dead-letter-exchange", json_string(q->dlx));
        }
        if (q->dlrk[0]) {
            json_object_set_new(args, "x-dead-letter-routing-key", json_string(q->dlrk));
        }
        json_array_append_new(queues, json_pack("{s:s, s:s, s:b, s:b, s:o}", "name",
                                                q->name, "vhost", "/", "durable", 1,
                                                "auto_delete", 0, "arguments", args));
    }
    for (size_t i = 0; i < topo.n_bindings; i++) {
        const lapse__binding_def_t *b = &topo.bindings[i];
        json_array_append_new(
            bindings, json_pack("{s:s, s:s, s:s, s:s, s:s, s:{}}", "source", b->source,
                                "vhost", "/", "destination", b->destination,
                                "destination_type", b->to_exchange ? "exchange" : "queue",
                                "routing_key", b->routing_key, "arguments"));
    }
    char *text = json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    return text;
}

lapse_status_t lapse_topology_inspect(const lapse_config_t *cfg, lapse_queue_stat_cb cb,
                                      void *opaque, lapse_error_t *err) {
    lapse__topology_t topo;
    lapse__topology_build(cfg, &topo);
    lapse__broker_t broker;
    lapse_status_t rc =
        lapse__broker_open(&broker, cfg, "lapse status", 0, NULL, NULL, err);
    if (rc != LAPSE_OK) {
        return rc;
    }
    for (size_t i = 0; i < topo.n_queues && rc == LAPSE_OK; i++) {
        /* A passive declare answers with the live counts; the HTTP API lags by seconds.
         */
        amqp_queue_declare_ok_t *ok = amqp_queue_declare(
            broker.conn, LAPSE__CHANNEL, amqp_cstring_bytes(topo.queues[i].name), 1, 0, 0,
            0, amqp_empty_table);
        char what[2 * LAPSE__NAME_MAX + 64];
        snprintf(what, sizeof what, "queue %s (run 'lapse topology declare')",
                 topo.queues[i].name);
        rc = lapse__broker_reply(&broker, amqp_get_rpc_reply(broker.conn), what, err);
        if (rc == LAPSE_OK && ok) {
            cb(opaque, topo.queues[i].name, topo.queues[i].ttl_ms, ok->message_count,
               ok->consumer_count);
        }
    }
    lapse__broker_close(&broker);
    return rc;
}

/* One passive declare on channel 1. A missing entity closes the channel with 404: that
 * close is answered and the channel opened again, so the next check can run. *exists
 * says what the broker answered. */
static lapse_status_t passive(lapse__broker_t *broker, bool exchange, const char *name,
                              bool *exists, lapse_error_t *err) {
    if (exchange) {
        amqp_exchange_declare(broker->conn, LAPSE__CHANNEL, amqp_cstring_bytes(name),
                              amqp_cstring_bytes("direct"), 1, 0, 0, 0, amqp_empty_table);
    } else {
        amqp_queue_declare(broker->conn, LAPSE__CHANNEL, amqp_cstring_bytes(name), 1, 0,
                           0, 0, amqp_empty_table);
    }
    amqp_rpc_reply_t reply = amqp_get_rpc_reply(broker->conn);
    *exists = reply.reply_type == AMQP_RESPONSE_NORMAL;
    if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
        reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD &&
        ((amqp_channel_close_t *)reply.reply.decoded)->reply_code == AMQP_NOT_FOUND) {
        /* rabbitmq-c does not answer a channel.close for us. */
        amqp_channel_close_ok_t ok = {0};
        if (amqp_send_method(broker->conn, LAPSE__CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD,
                             &ok) != AMQP_STATUS_OK) {
            broker->open = false;
            return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "topology check: %s",
                                   "connection lost");
        }
        amqp_maybe_release_buffers_on_channel(broker->conn, LAPSE__CHANNEL);
        amqp_channel_open(broker->conn, LAPSE__CHANNEL);
        return lapse__broker_reply(broker, amqp_get_rpc_reply(broker->conn),
                                   "topology check: channel.open", err);
    }
    if (*exists) {
        return LAPSE_OK;
    }
    return lapse__broker_reply(broker, reply, "topology check", err);
}

lapse_status_t lapse__topology_check(const lapse_config_t *cfg,
                                     const lapse__topology_t *topo, size_t *missing,
                                     lapse_error_t *err) {
    typedef struct {
        bool exchange;
        const char *name;
        const char *role;
    } need_t;
    need_t needs[4 + 2 * LAPSE__LADDER_RUNGS];
    size_t n = 0;
    needs[n++] = (need_t){false, topo->expired_queue, "the consumer reads it"};
    needs[n++] = (need_t){true, topo->parked_exchange, "bad messages are parked there"};
    needs[n++] = (need_t){false, topo->parked_queue, "parked messages wait there"};
    for (int k = LAPSE__LADDER_RUNGS - 1; k >= 0; k--) {
        needs[n++] = (need_t){true, topo->delay[k], "early messages go back through it"};
        needs[n++] = (need_t){false, topo->delay[k], "early messages wait there"};
    }
    needs[n++] = (need_t){true, topo->events_exchange, "order.cancelled events go there"};

    if (missing) {
        *missing = 0;
    }
    lapse__broker_t broker;
    lapse_status_t rc =
        lapse__broker_open(&broker, cfg, "lapse topology check", 0, NULL, NULL, err);
    for (size_t i = 0; i < n && rc == LAPSE_OK; i++) {
        bool exists = true;
        rc = passive(&broker, needs[i].exchange, needs[i].name, &exists, err);
        if (rc == LAPSE_OK && !exists) {
            const char *kind = needs[i].exchange ? "exchange" : "queue";
            /* One line per missing entity, with the fix: forwards to it fail until then
             * and their deliveries are retried, so the operator must learn why. */
            lapse__log(cfg, LAPSE_LOG_ERROR,
                       "event=topology_missing %s=%s note=\"%s '%s' is missing (%s): run "
                       "'lapse topology declare'\"",
                       kind, needs[i].name, kind, needs[i].name, needs[i].role);
            if (missing) {
                (*missing)++;
            }
        }
    }
    lapse__broker_close(&broker);
    return rc;
}

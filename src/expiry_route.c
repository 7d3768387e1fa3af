/* SPDX-License-Identifier: MIT
 * One expiry message on the wire: its body, properties and route (a class's holding queue
 * or the delay ladder). Shared by the publisher, the consumer and the sweep. */
#include <lapse/publisher.h>

#include "headers_int.h"
#include "publisher_int.h"

#include <stdio.h>
#include <string.h>

_Static_assert(LAPSE_MAX_DELAY_MS == LAPSE__LADDER_MAX_MS, "the ladder sets the limit");

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
    /* The deadline twice: in ms for programs, and spelled out for a person reading the
     * message in the management UI. Every (re-)publish writes both, so a message sent
     * back down the ladder carries them too. */
    char deadline[LAPSE_RFC3339_LEN];
    lapse_time_format_rfc3339(msg->deadline_ms, deadline);
    amqp_table_entry_t headers[3] = {lapse__hdr_deadline_ms_entry(msg->deadline_ms),
                                     lapse__hdr_deadline_text_entry(deadline),
                                     lapse__hdr_attempts_entry(attempts)};
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
    props.headers.num_entries = attempts > 0 ? 3 : 2;
    props.headers.entries = headers;
    return lapse__broker_publish(broker, exchange, routing_key, true, &props, body, len,
                                 tag, err);
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

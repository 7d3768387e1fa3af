/* SPDX-License-Identifier: MIT
 * Parked messages: list them without disturbing the queue, replay them to expired. */
#ifndef LAPSE_PARKED_H
#define LAPSE_PARKED_H

#include <lapse/config.h>
#include <lapse/message.h>

#define LAPSE_PARKED_REASON_MAX 256  /* reason text kept, NUL included */
#define LAPSE_PARKED_LIST_LIMIT 1000 /* the CLI's default --limit */

/** One parked message as read from the parked queue: a plain value, nothing to free. */
typedef struct lapse_parked_msg {
    /* The message_id when it is a valid order id, else the body's order_id when the body
     * is JSON with a valid one (even if other fields are wrong), else "-". */
    char order_id[LAPSE_ORDER_ID_MAX + 1];
    /* The message_id property as sent (truncated, bytes outside printable ASCII shown as
     * '?'); "" when absent. */
    char message_id[LAPSE_ORDER_ID_MAX + 1];
    /* Header x-lapse-reason (same sanitising); "" when absent, e.g. a dead letter that
     * the expired exchange's alternate exchange routed here without a consumer. */
    char reason[LAPSE_PARKED_REASON_MAX];
    int64_t attempts;     /* header x-lapse-attempts; 1 when absent */
    int64_t parked_at_ms; /* header x-lapse-parked-at-ms; -1 when absent */
    size_t body_len;
} lapse_parked_msg_t;

/** Called once per message; msg is borrowed for the call only. */
typedef void (*lapse_parked_cb)(void *opaque, const lapse_parked_msg_t *msg);

/**
 * Call cb for the first `limit` messages of the parked queue, oldest first, and leave the
 * queue as it was: the messages are fetched without acking and go back when the channel
 * closes (RabbitMQ puts requeued messages of a classic queue back in their original
 * positions; a quorum queue may not). While the listing runs, other readers of the
 * queue do not see the listed messages.
 * @param limit  at most this many messages (> 0).
 * @param more   optional; receives how many messages stayed unlisted behind the limit
 *               (as the broker counted them when the last one was fetched).
 * @return LAPSE_OK, LAPSE_ERR_INVALID (limit 0) or a LAPSE_ERR_BROKER_* code (a missing
 *         parked queue is LAPSE_ERR_BROKER_CLOSED with the broker's text in err).
 * Thread-safety: opens its own connection; cfg is borrowed and only read.
 */
LAPSE_API lapse_status_t lapse_parked_list(const lapse_config_t *cfg, size_t limit,
                                           lapse_parked_cb cb, void *opaque, size_t *more,
                                           lapse_error_t *err);

/**
 * Move parked messages back to the expired exchange (routing key order.expired):
 * every message when order_id is NULL, else those whose order_id (as described above)
 * or whose body's order_id equals it. Each is published persistent, mandatory and
 * confirmed, with body and properties unchanged except that the parking headers
 * (x-lapse-reason, x-lapse-parked-at-ms, x-lapse-attempts) are removed, so a replayed
 * message starts afresh; x-death and x-lapse-deadline-ms stay. Its parked copy is acked
 * only after the broker confirmed the publish; a crash in between leaves both copies
 * (the consumer is idempotent). Messages that do not match go back unchanged, in their
 * original positions. Only the messages in the queue when the call starts are looked
 * at, so a message the consumer parks again meanwhile is not replayed twice.
 * @param order_id  borrowed; NULL for all.
 * @param cb        optional; called for each message once its replay is confirmed.
 * @param replayed  optional; receives the number of messages replayed (also on failure:
 *                  those confirmed before it).
 * @return LAPSE_OK (also when nothing matched: check *replayed), LAPSE_ERR_INVALID (an
 *         invalid order_id), or a LAPSE_ERR_BROKER_* code; a publish the broker nacked or
 *         returned leaves its parked copy in place and fails the call.
 * Thread-safety: opens its own connection; cfg is borrowed and only read.
 */
LAPSE_API lapse_status_t lapse_parked_replay(const lapse_config_t *cfg,
                                             const char *order_id, lapse_parked_cb cb,
                                             void *opaque, size_t *replayed,
                                             lapse_error_t *err);

#endif

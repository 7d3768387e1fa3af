/* SPDX-License-Identifier: MIT
 * Internal: publishing one expiry message, shared by the publisher and the consumer. */
#ifndef LAPSE_PUBLISHER_INT_H
#define LAPSE_PUBLISHER_INT_H

#include "broker_int.h"
#include "topology_int.h"

#include <lapse/message.h>

/**
 * Publish msg as the version-1 expiry message (persistent, mandatory, properties and
 * headers of docs/design.md, "The message and its headers") to exchange/routing_key,
 * with header x-lapse-attempts when
 * attempts > 0 (failed processing attempts so far). msg is borrowed. Confirms are
 * reported through the broker's settle callback.
 */
lapse_status_t lapse__publish_expiry(lapse__broker_t *broker, const char *exchange,
                                     const char *routing_key,
                                     const lapse_expiry_msg_t *msg, int attempts,
                                     uint64_t *tag, lapse_error_t *err);

/**
 * Publish msg towards the expired queue: through cls's holding queue when cls is not
 * NULL (its TTL counts from now), else down the delay ladder for deadline - now_ms
 * (rounded up to whole seconds, at least 1 s). LAPSE_ERR_INVALID when the remainder is
 * longer than the ladder. Borrowed: everything.
 */
lapse_status_t lapse__publish_route(lapse__broker_t *broker,
                                    const lapse__topology_t *topo,
                                    const lapse__class_t *cls,
                                    const lapse_expiry_msg_t *msg, int64_t now_ms,
                                    uint64_t *tag, lapse_error_t *err);

#endif

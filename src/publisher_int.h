/* SPDX-License-Identifier: MIT
 * Internal: publishing one expiry message, shared by the publisher and the consumer. */
#ifndef LAPSE_PUBLISHER_INT_H
#define LAPSE_PUBLISHER_INT_H

#include "broker_int.h"

#include <lapse/message.h>

/**
 * Publish msg as the version-1 expiry message (persistent, mandatory, properties and
 * header of DESIGN.md) to exchange/routing_key. expiration_ms > 0 adds a per-message TTL.
 * msg is borrowed. Confirms are reported through the broker's settle callback.
 */
lapse_status_t lapse__publish_expiry(lapse__broker_t *broker, const char *exchange,
                                     const char *routing_key,
                                     const lapse_expiry_msg_t *msg, int64_t expiration_ms,
                                     uint64_t *tag, lapse_error_t *err);

#endif

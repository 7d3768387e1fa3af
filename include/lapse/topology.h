/* SPDX-License-Identifier: MIT
 * The broker topology: holding queues per class, expired, parked and events (with an
 * optional durable queue bound to them, config property events_queue). */
#ifndef LAPSE_TOPOLOGY_H
#define LAPSE_TOPOLOGY_H

#include <lapse/config.h>

/**
 * Declare every exchange, queue and binding of cfg's topology (durable, idempotent).
 * A queue that exists with other arguments is reported as LAPSE_ERR_BROKER_CLOSED with
 * the broker's PRECONDITION_FAILED text in err.
 */
LAPSE_API lapse_status_t lapse_topology_declare(const lapse_config_t *cfg,
                                                lapse_error_t *err);

/**
 * The topology as RabbitMQ definitions JSON (vhost "/"), importable with the management
 * UI or `rabbitmqctl import_definitions`.
 * @return new NUL-terminated string, freed with free(); NULL on OOM.
 */
LAPSE_API char *lapse_topology_export(const lapse_config_t *cfg);

/**
 * The RabbitMQ users and permissions of lapse's three roles for cfg's prefix, as
 * definitions JSON ({"users":[..],"permissions":[..]}, vhost "/"): <prefix>-publisher,
 * <prefix>-consumer and <prefix>-operator (tag "management"), each with the narrowest
 * configure/write/read patterns that work. The users have no password (an empty hash): an
 * import creates them unable to log in until `rabbitmqctl change_password` sets one, and
 * importing again clears it.
 * @return new NUL-terminated string, freed with free(); NULL on OOM.
 */
LAPSE_API char *lapse_roles_export(const lapse_config_t *cfg);

/** Called per queue of the topology, in declaration order (classes, the ladder's rungs
 *  00..27, expired, parked, and the events queue when the config names one); queue is
 * borrowed for the call. ttl_ms is the queue's x-message-ttl (how long a message waits
 * there), 0 for none. */
typedef void (*lapse_queue_stat_cb)(void *opaque, const char *queue, int64_t ttl_ms,
                                    int64_t messages, int64_t consumers);

/** Passive-declare every queue of the topology and report depth and consumers. */
LAPSE_API lapse_status_t lapse_topology_inspect(const lapse_config_t *cfg,
                                                lapse_queue_stat_cb cb, void *opaque,
                                                lapse_error_t *err);

#endif

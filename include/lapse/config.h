/* SPDX-License-Identifier: MIT
 * Configuration: a key/value property set (librdkafka's conf), read by every handle. */
#ifndef LAPSE_CONFIG_H
#define LAPSE_CONFIG_H

#include <lapse/lapse.h>

typedef struct lapse_config lapse_config_t;

typedef enum lapse_log_level {
    LAPSE_LOG_ERROR = 0,
    LAPSE_LOG_WARN = 1,
    LAPSE_LOG_INFO = 2,
    LAPSE_LOG_DEBUG = 3
} lapse_log_level_t;

/** Log sink: one line (no newline) of key=value pairs; line is borrowed for the call. */
typedef void (*lapse_log_cb)(void *opaque, lapse_log_level_t level, const char *line);

/** New config with the defaults of DESIGN.md; free with lapse_config_free(). NULL on OOM.
 */
LAPSE_API lapse_config_t *lapse_config_new(void);
/** Accepts NULL. */
LAPSE_API void lapse_config_free(lapse_config_t *cfg);

/**
 * Set a property; value is borrowed (copied). Properties:
 *   amqp_url   amqp://user:pass@host:port/vhost   (default
 * amqp://guest:guest@localhost:5672/%2f) store      sqlite:PATH (default sqlite:lapse.db)
 *   prefix     [A-Za-z0-9_-]{1,48}                (default lapse)
 *   classes    comma-separated durations          (default 30m)
 *   prefetch   1..65535: deliveries in flight; the consumer decides them in batches of up
 * to half (default 1000) heartbeat  seconds, 0..3600                   (default 30)
 *   clock_skew duration with optional '-' sign    (test hook; default 0)
 *   queue_type classic | quorum                   (default classic)
 *   max_attempts 1..1000: failed attempts at a delivery before it is parked
 *                                                 (default 10)
 *   sweep_every  duration or 0: the consumer's sweep (at start and then this often;
 *                0 never)                         (default 60s)
 *   sweep_grace  duration or 0: how long after its deadline a pending order is
 *                cancelled directly by that sweep (default 60s)
 *   events_queue queue name, up to 95 bytes of [A-Za-z0-9._:-], not amq.*, or "": a
 *                durable queue bound to <prefix>.events for order.cancelled, declared
 *                and exported with the topology (default "": none)
 * @return LAPSE_OK or LAPSE_ERR_CONFIG_* with err describing the value.
 */
LAPSE_API lapse_status_t lapse_config_set(lapse_config_t *cfg, const char *name,
                                          const char *value, lapse_error_t *err);

/** Apply LAPSE_AMQP_URL, LAPSE_STORE, LAPSE_PREFIX, LAPSE_CLASSES, LAPSE_QUEUE_TYPE,
 *  LAPSE_EVENTS_QUEUE when set. */
LAPSE_API lapse_status_t lapse_config_from_env(lapse_config_t *cfg, lapse_error_t *err);

/** Current value as text; borrowed until the next set/free on cfg. NULL if unknown. */
LAPSE_API const char *lapse_config_get(const lapse_config_t *cfg, const char *name);

/** True when ttl_ms is exactly one of the configured classes. */
LAPSE_API bool lapse_config_has_class(const lapse_config_t *cfg, int64_t ttl_ms);

/** Set the log sink (default: none). */
LAPSE_API void lapse_config_set_log_cb(lapse_config_t *cfg, lapse_log_cb cb,
                                       void *opaque);

#endif

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

/** New config with the defaults of docs/design.md ("The command line"); free with
 *  lapse_config_free(). NULL on OOM. */
LAPSE_API lapse_config_t *lapse_config_new(void);
/** Accepts NULL. */
LAPSE_API void lapse_config_free(lapse_config_t *cfg);

/**
 * Set a property; value is borrowed (copied). Properties (environment variable, default):
 *   amqp_url     amqp://user:pass@host:port/vhost, or amqps:// for TLS (port 5671 by
 *                default)                           (LAPSE_AMQP_URL,
 *                                    amqp://guest:guest@localhost:5672/%2f)
 *   amqp_password_file  path of a file whose content (one trailing newline dropped)
 *                replaces the URL's password; read at each connect, so systemd
 *                credentials and Docker secrets work (LAPSE_AMQP_PASSWORD_FILE, "": none)
 *   tls_ca       PEM file of the CAs that amqps:// trusts, "" for the system's
 *                (/etc/ssl/certs/ca-certificates.crt)  (LAPSE_TLS_CA, "")
 *   tls_cert     PEM client certificate (chain) sent over amqps://, with tls_key
 *                                                   (LAPSE_TLS_CERT, "")
 *   tls_key      PEM private key of tls_cert, unencrypted  (LAPSE_TLS_KEY, "")
 *   store        sqlite:PATH or postgresql://...    (LAPSE_STORE, sqlite:lapse.db)
 *   store_schema [a-z_][a-z0-9_]{0,62}: PostgreSQL schema of lapse's tables
 *                                                   (LAPSE_STORE_SCHEMA, lapse)
 *   orders_map   path of an orders map, or "": the shop's own orders table (PostgreSQL)
 *                                                   (LAPSE_ORDERS_MAP, "")
 *   prefix       [A-Za-z0-9_-]{1,48}                (LAPSE_PREFIX, lapse)
 *   classes      comma-separated durations          (LAPSE_CLASSES, 30m)
 *   queue_type   classic | quorum                   (LAPSE_QUEUE_TYPE, classic)
 *   heartbeat    seconds, 0..3600                   (LAPSE_HEARTBEAT, 30)
 *   prefetch     1..65535: deliveries in flight; the consumer decides them in batches of
 *                up to half                         (LAPSE_PREFETCH, 1000)
 *   max_attempts 1..1000: failed attempts at a delivery before it is parked
 *                                                   (LAPSE_MAX_ATTEMPTS, 10)
 *   sweep_every  duration or 0: the consumer's sweep (at start and then this often;
 *                0 never)                           (LAPSE_SWEEP_EVERY, 60s)
 *   sweep_grace  duration or 0: how long after its deadline a pending order is
 *                cancelled directly by a sweep      (LAPSE_GRACE, 60s)
 *   retention    duration or 0: sweeps delete settled orders and published events older
 *                than this; 0 keeps everything     (LAPSE_RETENTION, 30d)
 *   sweep_in_flight duration or 0: a sweep publishes again only orders recorded longer
 *                ago than this                      (LAPSE_IN_FLIGHT, 30s)
 *   events_queue queue name, up to 95 bytes of [A-Za-z0-9._:-], not amq.*, or "": a
 *                durable queue bound to <prefix>.events for order.cancelled, declared
 *                and exported with the topology (LAPSE_EVENTS_QUEUE, "": none)
 *   log_level    debug | info | warning (or warn) | error: lines above it never reach
 *                the log sink, and are not even formatted (LAPSE_LOG_LEVEL, info)
 *   log_format   text | json: how the sink should write lines; the library only keeps
 *                it for the sink to read with lapse_config_get (LAPSE_LOG_FORMAT, text)
 * lapse_config_property_name() lists them.
 * @return LAPSE_OK or LAPSE_ERR_CONFIG_* with err describing the value (the value of
 *         amqp_url and store is never repeated in err: it may hold a password).
 */
LAPSE_API lapse_status_t lapse_config_set(lapse_config_t *cfg, const char *name,
                                          const char *value, lapse_error_t *err);

/** Apply the environment variable of every property that has one (see above), when set
 *  and not empty. All or nothing: on failure cfg is unchanged and err names the
 *  variable. */
LAPSE_API lapse_status_t lapse_config_from_env(lapse_config_t *cfg, lapse_error_t *err);

/** The i-th property name (0, 1, ... until NULL), in a fixed order; static. */
LAPSE_API const char *lapse_config_property_name(size_t i);

/** The environment variable of a property; static. NULL when it has none or the name is
 *  unknown. */
LAPSE_API const char *lapse_config_property_env(const char *name);

/** The default of a property as text, as lapse_config_new() applies it; static. NULL
 *  when it has none or the name is unknown. */
LAPSE_API const char *lapse_config_property_default(const char *name);

/** Current value as text; borrowed until the next set/free on cfg. NULL if unknown.
 *  amqp_url is shown with its password written as *** (amqp://user:***@host/vhost):
 *  no getter hands out a password. */
LAPSE_API const char *lapse_config_get(const lapse_config_t *cfg, const char *name);

/** True when ttl_ms is exactly one of the configured classes. */
LAPSE_API bool lapse_config_has_class(const lapse_config_t *cfg, int64_t ttl_ms);

/** Set the log sink (default: none). */
LAPSE_API void lapse_config_set_log_cb(lapse_config_t *cfg, lapse_log_cb cb,
                                       void *opaque);

/** Told, with the log sink's opaque, where a burst of lines begins (begin true) and
 *  ends: the lines of one batch's decisions, sent to the log callback in between and
 *  within the same call of the library. A sink may hold them and write them together
 *  at the end; one that ignores bursts loses nothing. Begin and end always pair. */
typedef void (*lapse_log_burst_cb)(void *opaque, bool begin);

/** Set the burst callback (default: none). */
LAPSE_API void lapse_config_set_log_burst_cb(lapse_config_t *cfg, lapse_log_burst_cb cb);

#endif

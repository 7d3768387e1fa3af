/* SPDX-License-Identifier: MIT
 * Internal view of lapse_config_t, read by the library's handles. */
#ifndef LAPSE_CONFIG_INT_H
#define LAPSE_CONFIG_INT_H

#include <lapse/config.h>

#define LAPSE__MAX_CLASSES 16
#define LAPSE__PREFIX_MAX  48
/* The longest path of a file setting (TLS files, the password file), with its NUL. */
#define LAPSE__PATH_MAX 1024
/* Fits a topology name buffer (LAPSE__NAME_MAX) with its NUL. */
#define LAPSE__EVENTS_QUEUE_MAX 95

typedef struct lapse__class {
    char name[24]; /* canonical duration spelling, e.g. "30m" */
    int64_t ttl_ms;
} lapse__class_t;

struct lapse_config {
    char amqp_url[512];
    /* amqp_url with its password written as ***: what lapse_config_get() shows */
    char amqp_url_shown[512];
    /* parsed from amqp_url */
    char host[256];
    int port;
    bool tls; /* amqps:// */
    char user[128];
    char password[128]; /* the URL's; amqp_password_file replaces it when connecting */
    char vhost[256];
    /* Paths, "" for none. The password file is read at each connect (secret_int.h), so
     * a rotated credential is picked up by the next connection. */
    char amqp_password_file[LAPSE__PATH_MAX];
    char tls_ca[LAPSE__PATH_MAX];
    char tls_cert[LAPSE__PATH_MAX];
    char tls_key[LAPSE__PATH_MAX];

    char store[1024];
    char store_shown[1024]; /* store with its password masked: lapse_config_get */
    char store_schema[64];  /* PostgreSQL: the schema of lapse's tables */
    char orders_map[1024];  /* the path of an orders map, "" for none */
    char prefix[LAPSE__PREFIX_MAX + 1];
    lapse__class_t classes[LAPSE__MAX_CLASSES];
    size_t n_classes;
    char classes_text[LAPSE__MAX_CLASSES * 24];
    char events_queue[LAPSE__EVENTS_QUEUE_MAX + 1]; /* "" for none */
    int prefetch;
    int heartbeat;
    bool quorum;      /* queue_type: quorum queues instead of classic ones */
    int max_attempts; /* failed processing attempts of a delivery before it is parked */
    int64_t sweep_every_ms; /* the consumer's periodic sweep; 0: never */
    int64_t sweep_grace_ms; /* its grace after a deadline before cancelling directly */
    int64_t sweep_in_flight_ms; /* its sweep re-publishes only orders older than this */
    int64_t retention_ms;     /* sweeps prune settled orders older than this; 0: never */
    char metrics_listen[300]; /* the consumer's /metrics and /healthz; "" for none */
    char scratch[64];         /* lapse_config_get() formatting */

    lapse_log_cb log_cb;
    lapse_log_burst_cb log_burst_cb;
    void *log_opaque;
    lapse_log_level_t log_level; /* lines above it are dropped before formatting */
    bool log_json;               /* log_format: read by the sink (the CLI's), not here */
};

/** Begin (true) or end a burst of log lines: see lapse_log_burst_cb. */
void lapse__log_burst(const lapse_config_t *cfg, bool begin);

/** Log a printf-formatted line through cfg's sink (no-op without one, or when level is
 *  above cfg's log_level: checked before anything is formatted). */
void lapse__log(const lapse_config_t *cfg, lapse_log_level_t level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/** Whether a line of this level would reach cfg's sink: a caller that builds its line
 *  itself (lapse__log_text) asks first, as lapse__log does before it formats. */
bool lapse__log_wants(const lapse_config_t *cfg, lapse_log_level_t level);

/** Hand a finished line to cfg's sink, control bytes escaped (lapse__escape_ctl); the
 *  same checks as lapse__log. For lines built without printf, one per order. */
void lapse__log_text(const lapse_config_t *cfg, lapse_log_level_t level,
                     const char *line);

/** Copy in to out (cap bytes, NUL-terminated, cut short when it does not fit) with every
 *  control byte (below 0x20, and 0x7f) written as \\xHH, so that text from a message, the
 *  broker or a file stays one line and cannot drive a terminal. Returns out. */
char *lapse__escape_ctl(const char *in, char *out, size_t cap);

/** Check the settings of a connection that only make sense together: TLS files with an
 *  amqps:// URL, --tls-cert with --tls-key. LAPSE_ERR_CONFIG_VALUE with err saying which.
 *  Pure. */
lapse_status_t lapse__config_check_tls(const lapse_config_t *cfg, lapse_error_t *err);

/** The class whose TTL equals ttl_ms exactly, or NULL. Borrowed from cfg. */
const lapse__class_t *lapse__config_find_class(const lapse_config_t *cfg, int64_t ttl_ms);

#endif

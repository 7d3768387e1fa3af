/* SPDX-License-Identifier: MIT
 * Configuration properties: parsing, validation and the text form of each value. */
#include "config_int.h"
#include "metrics_int.h"
#include "store_int.h"

#include <lapse/message.h>

#include <amqp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_AMQP_URL "amqp://guest:guest@localhost:5672/%2f"

/* RabbitMQ refuses an x-message-ttl above 2^32-1 ms (its Erlang timer limit); catching it
 * here turns a failed queue.declare at start-up into a clear configuration error. */
#define CLASS_TTL_MAX_MS INT64_C(4294967295)

/* Copy src into a fixed field, or report that it does not fit. */
static bool copy_field(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) {
        return false;
    }
    memcpy(dst, src, n + 1);
    return true;
}

/* Strict decimal integer in [lo, hi], no sign, no spaces. */
static bool parse_int_range(const char *text, long lo, long hi, int *out) {
    long v = 0;
    const char *p = text;
    if (*p == '\0') {
        return false;
    }
    for (; *p != '\0'; p++) {
        if (*p < '0' || *p > '9') {
            return false;
        }
        v = v * 10 + (*p - '0');
        if (v > hi) {
            return false;
        }
    }
    if (v < lo) {
        return false;
    }
    *out = (int)v;
    return true;
}

/* url with the password of its user-info written as "***" ("amqp://u:***@h/v"), so that
 * the URL can be shown. The authority ends at the first '/', '?' or '#' (a password must
 * percent-encode those) and the user-info at its last '@'. The URL fits out: it was
 * checked against the same size. */
static void mask_password(const char *url, char *out, size_t cap) {
    const char *user = strstr(url, "://");
    user = user != NULL ? user + 3 : url;
    size_t authority = strcspn(user, "/?#");
    const char *at = NULL;
    for (const char *q = user; q < user + authority; q++) {
        at = *q == '@' ? q : at;
    }
    const char *colon = at != NULL ? memchr(user, ':', (size_t)(at - user)) : NULL;
    if (colon == NULL) {
        snprintf(out, cap, "%s", url);
        return;
    }
    snprintf(out, cap, "%.*s***%s", (int)(colon + 1 - url), url, at);
}

/* A PostgreSQL URI as shown: the user-info password and the values of the password and
 * sslpassword query parameters as ***. A SQLite path is shown as it is. */
static void mask_store(const char *uri, char *out, size_t cap) {
    if (strncmp(uri, "sqlite:", 7) == 0) {
        snprintf(out, cap, "%s", uri);
        return;
    }
    char tmp[1024];
    mask_password(uri, tmp, sizeof tmp);
    const char *q = strchr(tmp, '?');
    size_t n = 0;
    for (const char *c = tmp; *c != '\0' && n + 4 < cap; c++) {
        out[n++] = *c;
        if (q == NULL || c < q || (*c != '?' && *c != '&')) {
            continue;
        }
        const char *next = c + 1;
        size_t key = strcspn(next, "=&");
        bool secret =
            next[key] == '=' && ((key == 8 && strncmp(next, "password", 8) == 0) ||
                                 (key == 11 && strncmp(next, "sslpassword", 11) == 0));
        if (!secret) {
            continue;
        }
        size_t copy = key + 1 < cap - n - 4 ? key + 1 : 0;
        memcpy(out + n, next, copy);
        n += copy;
        memcpy(out + n, "***", 3);
        n += 3;
        c = next + key + strcspn(next + key, "&") - 1;
    }
    out[n] = '\0';
}

static lapse_status_t set_amqp_url(lapse_config_t *cfg, const char *value,
                                   lapse_error_t *err) {
    /* Error texts never repeat the URL: it usually carries a password. */
    char url[sizeof cfg->amqp_url];
    if (!copy_field(url, sizeof url, value)) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_URL,
                               "AMQP URL is longer than %zu bytes", sizeof url - 1);
    }
    if (strncmp(value, "amqp://", 7) != 0 && strncmp(value, "amqps://", 8) != 0) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_URL,
                               "AMQP URL must start with amqp:// or amqps:// (TLS)");
    }
    for (const char *p = value; *p != '\0'; p++) {
        unsigned char c = (unsigned char)*p;
        if (c <= 0x20 || c >= 0x7F) {
            return lapse_error_set(
                err, LAPSE_ERR_CONFIG_URL,
                "AMQP URL contains a space, control or non-ASCII byte; "
                "percent-encode it");
        }
        /* amqp_parse_url would decode %00 and silently cut the field short. */
        if (c == '%' && p[1] == '0' && p[2] == '0') {
            return lapse_error_set(err, LAPSE_ERR_CONFIG_URL, "AMQP URL contains %%00");
        }
    }

    struct amqp_connection_info info;
    amqp_default_connection_info(&info);
    if (amqp_parse_url(url, &info) != AMQP_STATUS_OK) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_URL,
                               "cannot parse AMQP URL (expected "
                               "amqp://user:password@host:port/vhost)");
    }
    if (info.port < 1 || info.port > 65535) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_URL,
                               "AMQP URL port %d is out of range", info.port);
    }
    /* "amqp://host/" names the vhost "" (AMQP URI spec), which RabbitMQ never has; say so
     * now rather than fail the login later. rabbitmq-c 0.11 percent-decodes every part,
     * so
     * "%2f" already arrives here as "/". */
    if (info.vhost[0] == '\0') {
        return lapse_error_set(
            err, LAPSE_ERR_CONFIG_URL,
            "AMQP URL names an empty vhost; use %%2f for the vhost \"/\"");
    }
    if (info.host[0] == '\0') {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_URL, "AMQP URL has an empty host");
    }
    char host[sizeof cfg->host], user[sizeof cfg->user], password[sizeof cfg->password],
        vhost[sizeof cfg->vhost];
    if (!copy_field(host, sizeof host, info.host) ||
        !copy_field(user, sizeof user, info.user) ||
        !copy_field(password, sizeof password, info.password) ||
        !copy_field(vhost, sizeof vhost, info.vhost)) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_URL,
                               "a part of the AMQP URL is too long");
    }

    memcpy(cfg->amqp_url, value, strlen(value) + 1);
    mask_password(value, cfg->amqp_url_shown, sizeof cfg->amqp_url_shown);
    cfg->tls = info.ssl != 0; /* amqps://, whose default port is 5671 */
    memcpy(cfg->host, host, sizeof host);
    memcpy(cfg->user, user, sizeof user);
    memcpy(cfg->password, password, sizeof password);
    memcpy(cfg->vhost, vhost, sizeof vhost);
    cfg->port = info.port;
    return LAPSE_OK;
}

static lapse_status_t set_store(lapse_config_t *cfg, const char *value,
                                lapse_error_t *err) {
    bool ok = (strncmp(value, "sqlite:", 7) == 0 && value[7] != '\0') ||
              strncmp(value, "postgres://", 11) == 0 ||
              strncmp(value, "postgresql://", 13) == 0;
    if (!ok) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_STORE,
                               "store must be sqlite:PATH or postgres://...");
    }
    if (!copy_field(cfg->store, sizeof cfg->store, value)) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_STORE,
                               "store URI is longer than %zu bytes",
                               sizeof cfg->store - 1);
    }
    mask_store(value, cfg->store_shown, sizeof cfg->store_shown);
    return LAPSE_OK;
}

/* A plain lower-case SQL identifier, so that it reads the same quoted or not. */
static lapse_status_t set_store_schema(lapse_config_t *cfg, const char *value,
                                       lapse_error_t *err) {
    size_t n = strlen(value);
    if (!lapse__store_schema_valid(value) || n >= sizeof cfg->store_schema) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_STORE,
                               "store schema must be 1..%zu bytes of [a-z0-9_], not "
                               "starting with a digit or pg_",
                               sizeof cfg->store_schema - 1);
    }
    memcpy(cfg->store_schema, value, n + 1);
    return LAPSE_OK;
}

/* The path of an orders map; read and checked when the store opens. */
static lapse_status_t set_orders_map(lapse_config_t *cfg, const char *value,
                                     lapse_error_t *err) {
    if (!copy_field(cfg->orders_map, sizeof cfg->orders_map, value)) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_MAP,
                               "orders map path is longer than %zu bytes",
                               sizeof cfg->orders_map - 1);
    }
    return LAPSE_OK;
}

static lapse_status_t set_prefix(lapse_config_t *cfg, const char *value,
                                 lapse_error_t *err) {
    size_t n = strlen(value);
    if (n == 0 || n > LAPSE__PREFIX_MAX) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_PREFIX, "prefix must be 1..%d bytes",
                               LAPSE__PREFIX_MAX);
    }
    for (size_t i = 0; i < n; i++) {
        char c = value[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '-')) {
            return lapse_error_set(err, LAPSE_ERR_CONFIG_PREFIX,
                                   "prefix contains a byte outside [A-Za-z0-9_-]");
        }
    }
    memcpy(cfg->prefix, value, n + 1);
    return LAPSE_OK;
}

/* A queue for the events, declared with the topology; "" for none. Names stay within the
 * order id alphabet so they read the same in the management UI, in its URLs and in
 * definitions; "amq." is reserved by the broker, which refuses such a declare. */
static lapse_status_t set_events_queue(lapse_config_t *cfg, const char *value,
                                       lapse_error_t *err) {
    size_t n = strlen(value);
    if (n > LAPSE__EVENTS_QUEUE_MAX) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_VALUE,
                               "events_queue is longer than %d bytes",
                               LAPSE__EVENTS_QUEUE_MAX);
    }
    if (n > 0 && !lapse_order_id_is_valid(value, n)) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_VALUE,
                               "events_queue contains a byte outside [A-Za-z0-9._:-]");
    }
    if (strncmp(value, "amq.", 4) == 0) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_VALUE,
                               "events_queue may not start with \"amq.\" (reserved by "
                               "RabbitMQ)");
    }
    memcpy(cfg->events_queue, value, n + 1);
    return LAPSE_OK;
}

/* HOST:PORT of the consumer's metrics listener, "" for none. Only its form is checked
 * here (a bad one is a usage error); whether it can be bound is seen at start. */
static lapse_status_t set_metrics_listen(lapse_config_t *cfg, const char *value,
                                         lapse_error_t *err) {
    char host[256], port[8];
    if (value[0] != '\0' &&
        !lapse__metrics_listen_parse(value, host, sizeof host, port, sizeof port)) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_VALUE,
                               "metrics_listen \"%s\" is not HOST:PORT (e.g. "
                               "127.0.0.1:9464, [::1]:9464 or :9464), port 0..65535",
                               value);
    }
    if (!copy_field(cfg->metrics_listen, sizeof cfg->metrics_listen, value)) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_VALUE,
                               "metrics_listen is longer than %zu bytes",
                               sizeof cfg->metrics_listen - 1);
    }
    return LAPSE_OK;
}

static int compare_class(const void *a, const void *b) {
    int64_t x = ((const lapse__class_t *)a)->ttl_ms;
    int64_t y = ((const lapse__class_t *)b)->ttl_ms;
    return (x > y) - (x < y);
}

static lapse_status_t set_classes(lapse_config_t *cfg, const char *value,
                                  lapse_error_t *err) {
    lapse__class_t classes[LAPSE__MAX_CLASSES];
    size_t n = 0;
    const char *p = value;
    for (;;) {
        /* Spaces around an item are forgiven ("15m, 30m"); an empty item is not. */
        while (*p == ' ') {
            p++;
        }
        const char *end = p;
        while (*end != ',' && *end != '\0') {
            end++;
        }
        const char *last = end;
        while (last > p && last[-1] == ' ') {
            last--;
        }
        char item[32];
        size_t len = (size_t)(last - p);
        if (len == 0) {
            return lapse_error_set(err, LAPSE_ERR_CONFIG_CLASS,
                                   "classes: empty item in the list");
        }
        if (len >= sizeof item) {
            return lapse_error_set(err, LAPSE_ERR_CONFIG_CLASS,
                                   "classes: an item is too long to be a duration");
        }
        memcpy(item, p, len);
        item[len] = '\0';
        int64_t ttl = 0;
        if (lapse_duration_parse(item, &ttl) != LAPSE_OK) {
            return lapse_error_set(err, LAPSE_ERR_CONFIG_CLASS,
                                   "classes: \"%s\" is not a duration", item);
        }
        if (ttl > CLASS_TTL_MAX_MS) {
            return lapse_error_set(err, LAPSE_ERR_CONFIG_CLASS,
                                   "classes: \"%s\" is longer than RabbitMQ's largest "
                                   "queue TTL (4294967295ms)",
                                   item);
        }
        bool seen = false;
        for (size_t i = 0; i < n; i++) {
            seen = seen || classes[i].ttl_ms == ttl;
        }
        if (!seen) {
            if (n == LAPSE__MAX_CLASSES) {
                return lapse_error_set(err, LAPSE_ERR_CONFIG_CLASS,
                                       "classes: more than %d distinct classes",
                                       LAPSE__MAX_CLASSES);
            }
            classes[n].ttl_ms = ttl;
            lapse_duration_format(ttl, classes[n].name, sizeof classes[n].name);
            n++;
        }
        if (*end == '\0') {
            break;
        }
        p = end + 1;
    }
    /* Sorted by TTL so queue names and the topology export come out in a stable order. */
    qsort(classes, n, sizeof classes[0], compare_class);

    char text[sizeof cfg->classes_text];
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        /* 16 names of at most 12 bytes ("4294967295ms") and commas fit easily. */
        used += (size_t)snprintf(text + used, sizeof text - used, "%s%s",
                                 i > 0 ? "," : "", classes[i].name);
    }
    memcpy(cfg->classes, classes, n * sizeof classes[0]);
    cfg->n_classes = n;
    memcpy(cfg->classes_text, text, used + 1);
    return LAPSE_OK;
}

static lapse_status_t set_queue_type(lapse_config_t *cfg, const char *value,
                                     lapse_error_t *err) {
    if (strcmp(value, "classic") != 0 && strcmp(value, "quorum") != 0) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_VALUE,
                               "queue type \"%s\" is not classic or quorum", value);
    }
    cfg->quorum = strcmp(value, "quorum") == 0;
    return LAPSE_OK;
}

static const char *const level_names[] = {"error", "warning", "info", "debug"};

/* "warn" is accepted too: it is how the text log line spells the level. */
static lapse_status_t set_log_level(lapse_config_t *cfg, const char *value,
                                    lapse_error_t *err) {
    for (size_t i = 0; i < sizeof level_names / sizeof level_names[0]; i++) {
        if (strcmp(value, level_names[i]) == 0) {
            cfg->log_level = (lapse_log_level_t)i;
            return LAPSE_OK;
        }
    }
    if (strcmp(value, "warn") == 0) {
        cfg->log_level = LAPSE_LOG_WARN;
        return LAPSE_OK;
    }
    return lapse_error_set(err, LAPSE_ERR_CONFIG_VALUE,
                           "log level \"%s\" is not debug, info, warning or error",
                           value);
}

static lapse_status_t set_log_format(lapse_config_t *cfg, const char *value,
                                     lapse_error_t *err) {
    if (strcmp(value, "text") != 0 && strcmp(value, "json") != 0) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_VALUE,
                               "log format \"%s\" is not text or json", value);
    }
    cfg->log_json = strcmp(value, "json") == 0;
    return LAPSE_OK;
}

/* The path of a file setting, "" for none; the file itself is read when connecting. */
static lapse_status_t set_path(char *field, const char *what, const char *value,
                               lapse_error_t *err) {
    if (!copy_field(field, LAPSE__PATH_MAX, value)) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_VALUE,
                               "%s path is longer than %d bytes", what,
                               LAPSE__PATH_MAX - 1);
    }
    return LAPSE_OK;
}

static lapse_status_t set_password_file(lapse_config_t *cfg, const char *value,
                                        lapse_error_t *err) {
    return set_path(cfg->amqp_password_file, "amqp_password_file", value, err);
}

static lapse_status_t set_tls_ca(lapse_config_t *cfg, const char *value,
                                 lapse_error_t *err) {
    return set_path(cfg->tls_ca, "tls_ca", value, err);
}

static lapse_status_t set_tls_cert(lapse_config_t *cfg, const char *value,
                                   lapse_error_t *err) {
    return set_path(cfg->tls_cert, "tls_cert", value, err);
}

static lapse_status_t set_tls_key(lapse_config_t *cfg, const char *value,
                                  lapse_error_t *err) {
    return set_path(cfg->tls_key, "tls_key", value, err);
}

lapse_status_t lapse__config_check_tls(const lapse_config_t *cfg, lapse_error_t *err) {
    /* TLS files with a plain amqp:// URL would be ignored without a word, and the
     * operator would believe the connection encrypted. */
    if (!cfg->tls &&
        (cfg->tls_ca[0] != '\0' || cfg->tls_cert[0] != '\0' || cfg->tls_key[0] != '\0')) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_VALUE,
                               "--tls-ca, --tls-cert and --tls-key need an amqps:// URL");
    }
    if ((cfg->tls_cert[0] != '\0') != (cfg->tls_key[0] != '\0')) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_VALUE,
                               "a client certificate needs both --tls-cert and --tls-key "
                               "(LAPSE_TLS_CERT, LAPSE_TLS_KEY)");
    }
    return LAPSE_OK;
}

/*
 * The property table (librdkafka's rdkafka_conf.c is the model): every property once,
 * with its environment variable, its default and how it is parsed and shown. set, get,
 * the defaults of lapse_config_new and lapse_config_from_env all walk this table, so a
 * property is added by adding a row (and its field in config_int.h).
 *
 * A row is one of these kinds:
 *  PROP_CUSTOM  set/show by the functions named in the row (text kept in a char field);
 *  PROP_INT     a decimal integer in [lo, hi], stored in an int field;
 *  PROP_SPAN    a duration or "0", stored in an int64_t field (ms).
 */
typedef enum prop_kind { PROP_CUSTOM, PROP_INT, PROP_SPAN } prop_kind_t;

typedef struct prop {
    const char *name;
    const char *env; /* variable read by lapse_config_from_env; NULL: none */
    const char *def; /* applied by lapse_config_new; NULL: none */
    prop_kind_t kind;
    size_t field;     /* offsetof the value in lapse_config_t */
    long lo, hi;      /* PROP_INT range */
    const char *unit; /* PROP_INT: what the number counts, for the error text */
    lapse_status_t (*set)(lapse_config_t *cfg, const char *value, lapse_error_t *err);
    const char *(*show)(const lapse_config_t *cfg); /* PROP_CUSTOM without a text field */
} prop_t;

static const char *show_queue_type(const lapse_config_t *cfg) {
    return cfg->quorum ? "quorum" : "classic";
}

static const char *show_log_level(const lapse_config_t *cfg) {
    return level_names[cfg->log_level];
}

static const char *show_log_format(const lapse_config_t *cfg) {
    return cfg->log_json ? "json" : "text";
}

/* The URL without its password: lapse_config_get never hands a secret out. */
static const char *show_amqp_url(const lapse_config_t *cfg) {
    return cfg->amqp_url_shown;
}

static const char *show_store(const lapse_config_t *cfg) {
    return cfg->store_shown;
}

#define FIELD(f) offsetof(lapse_config_t, f)

static const prop_t props[] = {
    /* name, env, default, kind, field, lo, hi, unit, set, show */
    {"amqp_url", "LAPSE_AMQP_URL", DEFAULT_AMQP_URL, PROP_CUSTOM, FIELD(amqp_url), 0, 0,
     NULL, set_amqp_url, show_amqp_url},
    {"amqp_password_file", "LAPSE_AMQP_PASSWORD_FILE", "", PROP_CUSTOM,
     FIELD(amqp_password_file), 0, 0, NULL, set_password_file, NULL},
    {"tls_ca", "LAPSE_TLS_CA", "", PROP_CUSTOM, FIELD(tls_ca), 0, 0, NULL, set_tls_ca,
     NULL},
    {"tls_cert", "LAPSE_TLS_CERT", "", PROP_CUSTOM, FIELD(tls_cert), 0, 0, NULL,
     set_tls_cert, NULL},
    {"tls_key", "LAPSE_TLS_KEY", "", PROP_CUSTOM, FIELD(tls_key), 0, 0, NULL, set_tls_key,
     NULL},
    {"store", "LAPSE_STORE", "sqlite:lapse.db", PROP_CUSTOM, FIELD(store), 0, 0, NULL,
     set_store, show_store},
    {"store_schema", "LAPSE_STORE_SCHEMA", "lapse", PROP_CUSTOM, FIELD(store_schema), 0,
     0, NULL, set_store_schema, NULL},
    {"orders_map", "LAPSE_ORDERS_MAP", "", PROP_CUSTOM, FIELD(orders_map), 0, 0, NULL,
     set_orders_map, NULL},
    {"prefix", "LAPSE_PREFIX", "lapse", PROP_CUSTOM, FIELD(prefix), 0, 0, NULL,
     set_prefix, NULL},
    {"classes", "LAPSE_CLASSES", "30m", PROP_CUSTOM, FIELD(classes_text), 0, 0, NULL,
     set_classes, NULL},
    {"queue_type", "LAPSE_QUEUE_TYPE", "classic", PROP_CUSTOM, 0, 0, 0, NULL,
     set_queue_type, show_queue_type},
    {"heartbeat", "LAPSE_HEARTBEAT", "30", PROP_INT, FIELD(heartbeat), 0, 3600,
     "a number of seconds", NULL, NULL},
    /* AMQP's basic.qos prefetch-count is a short; 0 would mean unlimited. */
    {"prefetch", "LAPSE_PREFETCH", "1000", PROP_INT, FIELD(prefetch), 1, 65535,
     "an integer", NULL, NULL},
    {"max_attempts", "LAPSE_MAX_ATTEMPTS", "10", PROP_INT, FIELD(max_attempts), 1, 1000,
     "an integer", NULL, NULL},
    {"sweep_every", "LAPSE_SWEEP_EVERY", "60s", PROP_SPAN, FIELD(sweep_every_ms), 0, 0,
     NULL, NULL, NULL},
    {"sweep_grace", "LAPSE_GRACE", "60s", PROP_SPAN, FIELD(sweep_grace_ms), 0, 0, NULL,
     NULL, NULL},
    {"sweep_in_flight", "LAPSE_IN_FLIGHT", "30s", PROP_SPAN, FIELD(sweep_in_flight_ms), 0,
     0, NULL, NULL, NULL},
    {"retention", "LAPSE_RETENTION", "30d", PROP_SPAN, FIELD(retention_ms), 0, 0, NULL,
     NULL, NULL},
    {"events_queue", "LAPSE_EVENTS_QUEUE", "", PROP_CUSTOM, FIELD(events_queue), 0, 0,
     NULL, set_events_queue, NULL},
    {"log_level", "LAPSE_LOG_LEVEL", "info", PROP_CUSTOM, 0, 0, 0, NULL, set_log_level,
     show_log_level},
    {"log_format", "LAPSE_LOG_FORMAT", "text", PROP_CUSTOM, 0, 0, 0, NULL, set_log_format,
     show_log_format},
    {"metrics_listen", "LAPSE_METRICS_LISTEN", "", PROP_CUSTOM, FIELD(metrics_listen), 0,
     0, NULL, set_metrics_listen, NULL},
};

#undef FIELD

static const prop_t *find_prop(const char *name) {
    for (size_t i = 0; name != NULL && i < sizeof props / sizeof props[0]; i++) {
        if (strcmp(props[i].name, name) == 0) {
            return &props[i];
        }
    }
    return NULL;
}

static lapse_status_t set_int(const prop_t *p, lapse_config_t *cfg, const char *value,
                              lapse_error_t *err) {
    int v = 0;
    if (!parse_int_range(value, p->lo, p->hi, &v)) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_VALUE,
                               "%s \"%s\" is not %s in %ld..%ld", p->name, value, p->unit,
                               p->lo, p->hi);
    }
    memcpy((char *)cfg + p->field, &v, sizeof v);
    return LAPSE_OK;
}

static lapse_status_t set_span(const prop_t *p, lapse_config_t *cfg, const char *value,
                               lapse_error_t *err) {
    int64_t ms = 0;
    if (strcmp(value, "0") != 0 && lapse_duration_parse(value, &ms) != LAPSE_OK) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_DURATION,
                               "%s \"%s\" is not a duration (e.g. 60s) or 0", p->name,
                               value);
    }
    memcpy((char *)cfg + p->field, &ms, sizeof ms);
    return LAPSE_OK;
}

lapse_status_t lapse_config_set(lapse_config_t *cfg, const char *name, const char *value,
                                lapse_error_t *err) {
    lapse_error_clear(err);
    if (cfg == NULL || name == NULL || value == NULL) {
        return lapse_error_set(err, LAPSE_ERR_INVALID, "no config, property or value");
    }
    const prop_t *p = find_prop(name);
    if (p == NULL) {
        return lapse_error_set(err, LAPSE_ERR_CONFIG_UNKNOWN, "unknown property \"%s\"",
                               name);
    }
    if (p->set != NULL) {
        return p->set(cfg, value, err);
    }
    return p->kind == PROP_INT ? set_int(p, cfg, value, err)
                               : set_span(p, cfg, value, err);
}

lapse_config_t *lapse_config_new(void) {
    lapse_config_t *cfg = calloc(1, sizeof *cfg);
    if (cfg == NULL) {
        return NULL;
    }
    /* Defaults go through the setters so they are parsed exactly like user input. */
    for (size_t i = 0; i < sizeof props / sizeof props[0]; i++) {
        if (props[i].def != NULL &&
            lapse_config_set(cfg, props[i].name, props[i].def, NULL) != LAPSE_OK) {
            free(cfg);
            return NULL;
        }
    }
    return cfg;
}

void lapse_config_free(lapse_config_t *cfg) {
    free(cfg);
}

lapse_status_t lapse_config_from_env(lapse_config_t *cfg, lapse_error_t *err) {
    lapse_error_clear(err);
    if (cfg == NULL) {
        return lapse_error_set(err, LAPSE_ERR_INVALID, "no config");
    }
    /* All or nothing, like lapse_config_set: apply to a copy, keep it only if every
     * variable was valid. */
    lapse_config_t next = *cfg;
    for (size_t i = 0; i < sizeof props / sizeof props[0]; i++) {
        const char *value = props[i].env != NULL ? getenv(props[i].env) : NULL;
        /* An empty variable counts as unset, as shells and compose files produce them. */
        if (value == NULL || value[0] == '\0') {
            continue;
        }
        lapse_error_t detail;
        lapse_status_t rc = lapse_config_set(&next, props[i].name, value, &detail);
        if (rc != LAPSE_OK) {
            return lapse_error_set(err, rc, "%s: %s", props[i].env, detail.text);
        }
    }
    *cfg = next;
    return LAPSE_OK;
}

const char *lapse_config_get(const lapse_config_t *cfg, const char *name) {
    const prop_t *p = find_prop(name);
    if (cfg == NULL || p == NULL) {
        return NULL;
    }
    if (p->show != NULL) {
        return p->show(cfg);
    }
    const char *field = (const char *)cfg + p->field;
    if (p->kind == PROP_CUSTOM) {
        return field;
    }
    /* Numbers are formatted on demand into the config's scratch buffer. The config is
     * always heap-allocated by lapse_config_new, so writing through the cast is defined;
     * the const only promises that no property changes. */
    char *scratch = ((lapse_config_t *)cfg)->scratch;
    size_t cap = sizeof cfg->scratch;
    if (p->kind == PROP_INT) {
        int v;
        memcpy(&v, field, sizeof v);
        snprintf(scratch, cap, "%d", v);
        return scratch;
    }
    int64_t ms;
    memcpy(&ms, field, sizeof ms);
    if (ms == 0) {
        snprintf(scratch, cap, "0");
    } else {
        lapse_duration_format(ms, scratch, cap);
    }
    return scratch;
}

const char *lapse_config_property_name(size_t i) {
    return i < sizeof props / sizeof props[0] ? props[i].name : NULL;
}

const char *lapse_config_property_env(const char *name) {
    const prop_t *p = find_prop(name);
    return p != NULL ? p->env : NULL;
}

const char *lapse_config_property_default(const char *name) {
    const prop_t *p = find_prop(name);
    return p != NULL ? p->def : NULL;
}

void lapse_config_set_log_cb(lapse_config_t *cfg, lapse_log_cb cb, void *opaque) {
    if (cfg == NULL) {
        return;
    }
    cfg->log_cb = cb;
    cfg->log_opaque = opaque;
}

void lapse_config_set_log_burst_cb(lapse_config_t *cfg, lapse_log_burst_cb cb) {
    if (cfg != NULL) {
        cfg->log_burst_cb = cb;
    }
}

const lapse__class_t *lapse__config_find_class(const lapse_config_t *cfg,
                                               int64_t ttl_ms) {
    if (cfg == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < cfg->n_classes; i++) {
        if (cfg->classes[i].ttl_ms == ttl_ms) {
            return &cfg->classes[i];
        }
    }
    return NULL;
}

bool lapse_config_has_class(const lapse_config_t *cfg, int64_t ttl_ms) {
    return lapse__config_find_class(cfg, ttl_ms) != NULL;
}

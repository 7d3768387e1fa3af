/* SPDX-License-Identifier: MIT
 * Configuration: defaults, each property good and bad, URL parsing, environment, logging.
 */
#include "config_int.h"

#include <lapse/message.h>
#include <lapse/store.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static const char *const env_vars[] = {"LAPSE_AMQP_URL",
                                       "LAPSE_STORE",
                                       "LAPSE_PREFIX",
                                       "LAPSE_CLASSES",
                                       "LAPSE_QUEUE_TYPE",
                                       "LAPSE_HEARTBEAT",
                                       "LAPSE_PREFETCH",
                                       "LAPSE_MAX_ATTEMPTS",
                                       "LAPSE_SWEEP_EVERY",
                                       "LAPSE_GRACE",
                                       "LAPSE_IN_FLIGHT",
                                       "LAPSE_EVENTS_QUEUE",
                                       "LAPSE_AMQP_PASSWORD_FILE",
                                       "LAPSE_TLS_CA",
                                       "LAPSE_TLS_CERT",
                                       "LAPSE_TLS_KEY"};

static int setup(void **state) {
    for (size_t i = 0; i < ARRAY_LEN(env_vars); i++) {
        unsetenv(env_vars[i]);
    }
    lapse_config_t *cfg = lapse_config_new();
    if (cfg == NULL) {
        return -1;
    }
    *state = cfg;
    return 0;
}

static int teardown(void **state) {
    lapse_config_free(*state);
    for (size_t i = 0; i < ARRAY_LEN(env_vars); i++) {
        unsetenv(env_vars[i]);
    }
    return 0;
}

static void test_defaults_follow_design(void **state) {
    lapse_config_t *cfg = *state;
    /* The getter never hands out a password (issue 13). */
    assert_string_equal(lapse_config_get(cfg, "amqp_url"),
                        "amqp://guest:***@localhost:5672/%2f");
    assert_false(cfg->tls);
    assert_string_equal(lapse_config_get(cfg, "amqp_password_file"), "");
    assert_string_equal(lapse_config_get(cfg, "tls_ca"), "");
    assert_string_equal(lapse_config_get(cfg, "tls_cert"), "");
    assert_string_equal(lapse_config_get(cfg, "tls_key"), "");
    assert_string_equal(cfg->host, "localhost");
    assert_int_equal(cfg->port, 5672);
    assert_string_equal(cfg->user, "guest");
    assert_string_equal(cfg->password, "guest");
    assert_string_equal(cfg->vhost, "/");
    assert_string_equal(lapse_config_get(cfg, "store"), "sqlite:lapse.db");
    assert_string_equal(lapse_config_get(cfg, "prefix"), "lapse");
    assert_string_equal(lapse_config_get(cfg, "classes"), "30m");
    assert_int_equal(cfg->n_classes, 1);
    assert_string_equal(cfg->classes[0].name, "30m");
    assert_int_equal(cfg->classes[0].ttl_ms, 1800000);
    assert_string_equal(lapse_config_get(cfg, "prefetch"), "1000");
    assert_string_equal(lapse_config_get(cfg, "heartbeat"), "30");
    /* The old test hook is gone from the library (issue 10): tests use libfaketime. */
    assert_null(lapse_config_get(cfg, "clock_skew"));
    assert_string_equal(lapse_config_get(cfg, "queue_type"), "classic");
    assert_string_equal(lapse_config_get(cfg, "max_attempts"), "10");
    assert_string_equal(lapse_config_get(cfg, "sweep_every"), "1m");
    assert_string_equal(lapse_config_get(cfg, "sweep_grace"), "1m");
    assert_string_equal(lapse_config_get(cfg, "sweep_in_flight"), "30s");
    assert_int_equal(cfg->sweep_in_flight_ms, 30000);
    assert_string_equal(lapse_config_get(cfg, "events_queue"), "");
    assert_string_equal(lapse_config_get(cfg, "metrics_listen"), "");
    assert_int_equal(lapse_config_set(cfg, "queue_type", "quorum", NULL), LAPSE_OK);
    assert_true(cfg->quorum);
    assert_string_equal(lapse_config_get(cfg, "queue_type"), "quorum");
    assert_int_equal(lapse_config_set(cfg, "queue_type", "classic", NULL), LAPSE_OK);
    assert_false(cfg->quorum);
    assert_null(cfg->log_cb);
    lapse_config_free(NULL);
}

static void test_amqp_url_is_parsed(void **state) {
    lapse_config_t *cfg = *state;
    static const struct {
        const char *url, *shown, *host, *user, *password, *vhost;
        int port;
        bool tls;
    } cases[] = {
        {"amqp://guest:guest@localhost:5672/%2f", "amqp://guest:***@localhost:5672/%2f",
         "localhost", "guest", "guest", "/", 5672, false},
        {"amqp://guest:guest@localhost:5672/%2F", "amqp://guest:***@localhost:5672/%2F",
         "localhost", "guest", "guest", "/", 5672, false},
        {"amqp://app:s3cret@mq.example.com:5673/orders",
         "amqp://app:***@mq.example.com:5673/orders", "mq.example.com", "app", "s3cret",
         "orders", 5673, false},
        {"amqp://mq", "amqp://mq", "mq", "guest", "guest", "/", 5672, false},
        {"amqp://u:p@10.0.0.7/shop%2Feu", "amqp://u:***@10.0.0.7/shop%2Feu", "10.0.0.7",
         "u", "p", "shop/eu", 5672, false},
        {"amqp://a%40b:p%3Aw%2F@h:1/v", "amqp://a%40b:***@h:1/v", "h", "a@b", "p:w/", "v",
         1, false},
        {"amqp://u:p@[::1]:65535/x", "amqp://u:***@[::1]:65535/x", "::1", "u", "p", "x",
         65535, false},
        /* TLS: port 5671 unless given; a user without a password (the password file
         * gives it) shows as it is. */
        {"amqps://u:p@mq.example.com/%2f", "amqps://u:***@mq.example.com/%2f",
         "mq.example.com", "u", "p", "/", 5671, true},
        {"amqps://lapse@mq:5999/shop", "amqps://lapse@mq:5999/shop", "mq", "lapse",
         "guest", "shop", 5999, true},
        {"amqps://u:@mq/v", "amqps://u:***@mq/v", "mq", "u", "", "v", 5671, true},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        lapse_error_t err;
        if (lapse_config_set(cfg, "amqp_url", cases[i].url, &err) != LAPSE_OK) {
            fail_msg("%s: %s", cases[i].url, err.text);
        }
        assert_string_equal(lapse_config_get(cfg, "amqp_url"), cases[i].shown);
        assert_string_equal(cfg->amqp_url, cases[i].url);
        assert_int_equal(cfg->tls, cases[i].tls);
        assert_string_equal(cfg->host, cases[i].host);
        assert_string_equal(cfg->user, cases[i].user);
        assert_string_equal(cfg->password, cases[i].password);
        assert_string_equal(cfg->vhost, cases[i].vhost);
        assert_int_equal(cfg->port, cases[i].port);
    }
}

/* Snapshot of everything a failed set must leave alone. */
static void assert_same_config(const lapse_config_t *a, const lapse_config_t *b) {
    assert_string_equal(a->amqp_url, b->amqp_url);
    assert_string_equal(a->host, b->host);
    assert_int_equal(a->port, b->port);
    assert_string_equal(a->user, b->user);
    assert_string_equal(a->password, b->password);
    assert_string_equal(a->vhost, b->vhost);
    assert_string_equal(a->store, b->store);
    assert_string_equal(a->prefix, b->prefix);
    assert_int_equal(a->n_classes, b->n_classes);
    assert_memory_equal(a->classes, b->classes, a->n_classes * sizeof a->classes[0]);
    assert_string_equal(a->classes_text, b->classes_text);
    assert_string_equal(a->events_queue, b->events_queue);
    assert_string_equal(a->metrics_listen, b->metrics_listen);
    assert_int_equal(a->prefetch, b->prefetch);
    assert_int_equal(a->heartbeat, b->heartbeat);
    assert_int_equal(a->quorum, b->quorum);
    assert_int_equal(a->max_attempts, b->max_attempts);
    assert_int_equal(a->sweep_every_ms, b->sweep_every_ms);
    assert_int_equal(a->sweep_grace_ms, b->sweep_grace_ms);
    assert_int_equal(a->sweep_in_flight_ms, b->sweep_in_flight_ms);
}

static const struct {
    const char *name, *value;
    lapse_status_t rc;
} bad_values[] = {
    {"amqp_url", "", LAPSE_ERR_CONFIG_URL},
    {"amqp_url", "http://h/", LAPSE_ERR_CONFIG_URL},
    {"amqp_url", "AMQP://h", LAPSE_ERR_CONFIG_URL},
    {"amqp_url", "amqpss://h/%2f", LAPSE_ERR_CONFIG_URL},
    {"amqp_url", "AMQPS://h/%2f", LAPSE_ERR_CONFIG_URL},
    {"amqp_url", "amqps://h/", LAPSE_ERR_CONFIG_URL},
    {"amqp_url", "amqp://h:99999/%2f", LAPSE_ERR_CONFIG_URL},
    {"amqp_url", "amqp://h:0/%2f", LAPSE_ERR_CONFIG_URL},
    {"amqp_url", "amqp://h:abc/%2f", LAPSE_ERR_CONFIG_URL},
    {"amqp_url", "amqp://h/", LAPSE_ERR_CONFIG_URL},
    {"amqp_url", "amqp://h/a/b", LAPSE_ERR_CONFIG_URL},
    {"amqp_url", "amqp://h/%zz", LAPSE_ERR_CONFIG_URL},
    {"amqp_url", "amqp://h/v%00x", LAPSE_ERR_CONFIG_URL},
    {"amqp_url", "amqp://u:p w@h/%2f", LAPSE_ERR_CONFIG_URL},
    {"amqp_url", "amqp://h/v?heartbeat=5", LAPSE_ERR_CONFIG_URL},
    {"store", "", LAPSE_ERR_CONFIG_STORE},
    {"store", "sqlite:", LAPSE_ERR_CONFIG_STORE},
    {"store", "lapse.db", LAPSE_ERR_CONFIG_STORE},
    {"store", "mysql://h/db", LAPSE_ERR_CONFIG_STORE},
    {"store", "postgres:/h", LAPSE_ERR_CONFIG_STORE},
    {"prefix", "", LAPSE_ERR_CONFIG_PREFIX},
    {"prefix", "a.b", LAPSE_ERR_CONFIG_PREFIX},
    {"prefix", "a b", LAPSE_ERR_CONFIG_PREFIX},
    {"prefix", "caf\xc3\xa9", LAPSE_ERR_CONFIG_PREFIX},
    {"prefix", "0123456789012345678901234567890123456789012345678",
     LAPSE_ERR_CONFIG_PREFIX},
    {"classes", "", LAPSE_ERR_CONFIG_CLASS},
    {"classes", ",", LAPSE_ERR_CONFIG_CLASS},
    {"classes", "15m,", LAPSE_ERR_CONFIG_CLASS},
    {"classes", ",15m", LAPSE_ERR_CONFIG_CLASS},
    {"classes", "15m,,30m", LAPSE_ERR_CONFIG_CLASS},
    {"classes", "15m,0s", LAPSE_ERR_CONFIG_CLASS},
    {"classes", "15", LAPSE_ERR_CONFIG_CLASS},
    {"classes", "15m;30m", LAPSE_ERR_CONFIG_CLASS},
    {"classes", "-15m", LAPSE_ERR_CONFIG_CLASS},
    {"classes", "50d", LAPSE_ERR_CONFIG_CLASS},
    {"classes", "4294967296ms", LAPSE_ERR_CONFIG_CLASS},
    {"classes", "1s,2s,3s,4s,5s,6s,7s,8s,9s,10s,11s,12s,13s,14s,15s,16s,17s",
     LAPSE_ERR_CONFIG_CLASS},
    {"classes", "12345678901234567890123456789012345m", LAPSE_ERR_CONFIG_CLASS},
    {"prefetch", "0", LAPSE_ERR_CONFIG_VALUE},
    {"prefetch", "65536", LAPSE_ERR_CONFIG_VALUE},
    {"prefetch", "-1", LAPSE_ERR_CONFIG_VALUE},
    {"prefetch", "", LAPSE_ERR_CONFIG_VALUE},
    {"prefetch", "10x", LAPSE_ERR_CONFIG_VALUE},
    {"prefetch", " 10", LAPSE_ERR_CONFIG_VALUE},
    {"prefetch", "99999999999999999999999", LAPSE_ERR_CONFIG_VALUE},
    {"heartbeat", "3601", LAPSE_ERR_CONFIG_VALUE},
    {"heartbeat", "-5", LAPSE_ERR_CONFIG_VALUE},
    {"heartbeat", "30s", LAPSE_ERR_CONFIG_VALUE},
    {"queue_type", "Quorum", LAPSE_ERR_CONFIG_VALUE},
    {"queue_type", "", LAPSE_ERR_CONFIG_VALUE},
    {"queue_type", "stream", LAPSE_ERR_CONFIG_VALUE},
    {"max_attempts", "0", LAPSE_ERR_CONFIG_VALUE},
    {"max_attempts", "1001", LAPSE_ERR_CONFIG_VALUE},
    {"max_attempts", "3x", LAPSE_ERR_CONFIG_VALUE},
    {"sweep_every", "soon", LAPSE_ERR_CONFIG_DURATION},
    {"sweep_grace", "-5s", LAPSE_ERR_CONFIG_DURATION},
    {"sweep_in_flight", "", LAPSE_ERR_CONFIG_DURATION},
    {"sweep_in_flight", "30", LAPSE_ERR_CONFIG_DURATION},
    {"events_queue", "amq.events", LAPSE_ERR_CONFIG_VALUE},
    {"events_queue", "my events", LAPSE_ERR_CONFIG_VALUE},
    {"events_queue", "events/cancelled", LAPSE_ERR_CONFIG_VALUE},
    {"events_queue", "caf\xc3\xa9", LAPSE_ERR_CONFIG_VALUE},
    {"events_queue",
     "0123456789012345678901234567890123456789012345678901234567890123456789012345678901"
     "23456789012345",
     LAPSE_ERR_CONFIG_VALUE},
    {"metrics_listen", "9464", LAPSE_ERR_CONFIG_VALUE},
    {"metrics_listen", "localhost:", LAPSE_ERR_CONFIG_VALUE},
    {"metrics_listen", "localhost:65536", LAPSE_ERR_CONFIG_VALUE},
    {"metrics_listen", "localhost:94x4", LAPSE_ERR_CONFIG_VALUE},
    {"metrics_listen", "local host:9464", LAPSE_ERR_CONFIG_VALUE},
    {"metrics_listen", "[::1:9464", LAPSE_ERR_CONFIG_VALUE},
    {"metrics_listen", "::1:9464", LAPSE_ERR_CONFIG_VALUE},
    {"metrics_listen", "[]:9464", LAPSE_ERR_CONFIG_VALUE},
    {"events-queue", "x", LAPSE_ERR_CONFIG_UNKNOWN},
    {"queue-type", "quorum", LAPSE_ERR_CONFIG_UNKNOWN},
    {"", "x", LAPSE_ERR_CONFIG_UNKNOWN},
    {"PREFIX", "x", LAPSE_ERR_CONFIG_UNKNOWN},
};

static void test_bad_values_are_refused_and_change_nothing(void **state) {
    lapse_config_t *cfg = *state;
    /* Start from non-default values so "unchanged" cannot be confused with "reset". */
    assert_int_equal(lapse_config_set(cfg, "classes", "15m,45m", NULL), LAPSE_OK);
    assert_int_equal(lapse_config_set(cfg, "prefix", "shop", NULL), LAPSE_OK);
    assert_int_equal(lapse_config_set(cfg, "amqp_url", "amqp://u:p@mq:5673/v", NULL),
                     LAPSE_OK);
    lapse_config_t before = *cfg;
    for (size_t i = 0; i < ARRAY_LEN(bad_values); i++) {
        lapse_error_t err;
        lapse_status_t rc =
            lapse_config_set(cfg, bad_values[i].name, bad_values[i].value, &err);
        if (rc != bad_values[i].rc || err.code != rc || err.text[0] == '\0') {
            fail_msg("%s=\"%s\": got %s \"%s\", want %s", bad_values[i].name,
                     bad_values[i].value, lapse_status_name(rc), err.text,
                     lapse_status_name(bad_values[i].rc));
        }
        assert_same_config(cfg, &before);
    }
}

static void test_url_errors_do_not_leak_the_password(void **state) {
    lapse_config_t *cfg = *state;
    lapse_error_t err;
    assert_int_equal(lapse_config_set(cfg, "amqp_url", "amqp://u:hunter2@h:99999/", &err),
                     LAPSE_ERR_CONFIG_URL);
    assert_null(strstr(err.text, "hunter2"));
    assert_int_equal(lapse_config_set(cfg, "amqp_url", "amqp://u:hunter2@h/", &err),
                     LAPSE_ERR_CONFIG_URL);
    assert_null(strstr(err.text, "hunter2"));
    assert_non_null(strstr(err.text, "%2f"));
    /* Accepted, it is still never handed out: no property's value holds it. */
    assert_int_equal(lapse_config_set(cfg, "amqp_url", "amqps://u:hunter2@h/%2f", &err),
                     LAPSE_OK);
    assert_string_equal(cfg->password, "hunter2");
    for (size_t i = 0; lapse_config_property_name(i) != NULL; i++) {
        const char *value = lapse_config_get(cfg, lapse_config_property_name(i));
        assert_non_null(value);
        assert_null(strstr(value, "hunter2"));
    }
}

static void test_null_arguments(void **state) {
    lapse_config_t *cfg = *state;
    lapse_error_t err;
    assert_int_equal(lapse_config_set(NULL, "prefix", "x", &err), LAPSE_ERR_INVALID);
    assert_int_equal(lapse_config_set(cfg, NULL, "x", &err), LAPSE_ERR_INVALID);
    assert_int_equal(lapse_config_set(cfg, "prefix", NULL, &err), LAPSE_ERR_INVALID);
    assert_null(lapse_config_get(cfg, NULL));
    assert_null(lapse_config_get(NULL, "prefix"));
    assert_null(lapse_config_get(cfg, "nonsense"));
    assert_null(lapse_config_get(cfg, "password"));
    assert_int_equal(lapse_config_from_env(NULL, &err), LAPSE_ERR_INVALID);
    lapse_config_set_log_cb(NULL, NULL, NULL);
}

static void test_store_prefix_and_numbers(void **state) {
    lapse_config_t *cfg = *state;
    static const struct {
        const char *name, *value, *get;
    } good[] = {
        {"store", "sqlite:/var/lib/lapse/orders.db", NULL},
        {"store", "sqlite::memory:", NULL},
        {"store", "postgres://lapse@db/orders", NULL},
        {"store", "postgresql://db:5432/orders?sslmode=require", NULL},
        {"prefix", "shop-eu_2", NULL},
        {"prefix", "x", NULL},
        {"prefix", "012345678901234567890123456789012345678901234567", NULL},
        {"prefetch", "1", NULL},
        {"prefetch", "65535", NULL},
        {"prefetch", "0100", "100"},
        {"heartbeat", "0", NULL},
        {"heartbeat", "3600", NULL},
        {"events_queue", "lapse.events.cancelled", NULL},
        {"events_queue", "billing:order-events_v2", NULL},
        {"events_queue",
         "0123456789012345678901234567890123456789012345678901234567890123456789012345678"
         "90"
         "12345678901234",
         NULL},
        {"events_queue", "", NULL},
        {"metrics_listen", "127.0.0.1:9464", NULL},
        {"metrics_listen", "metrics.internal:0", NULL},
        {"metrics_listen", "[::1]:9464", NULL},
        {"metrics_listen", ":9464", NULL},
        {"metrics_listen", "", NULL},
    };
    for (size_t i = 0; i < ARRAY_LEN(good); i++) {
        lapse_error_t err;
        if (lapse_config_set(cfg, good[i].name, good[i].value, &err) != LAPSE_OK) {
            fail_msg("%s=\"%s\": %s", good[i].name, good[i].value, err.text);
        }
        assert_int_equal(err.code, LAPSE_OK);
        const char *want = good[i].get != NULL ? good[i].get : good[i].value;
        assert_string_equal(lapse_config_get(cfg, good[i].name), want);
    }
    assert_int_equal(cfg->prefetch, 100);
    assert_int_equal(cfg->heartbeat, 3600);
}

static void test_classes_are_canonical_sorted_and_unique(void **state) {
    lapse_config_t *cfg = *state;
    static const struct {
        const char *value, *text;
        size_t n;
    } cases[] = {
        {"30m", "30m", 1},
        {"45m,15m,30m", "15m,30m,45m", 3},
        {"1800s,30m,1800000ms,0030m", "30m", 1},
        {"60m,90s,1500ms,2h,1d,24h", "1500ms,90s,1h,2h,1d", 5},
        {" 15m , 30m ", "15m,30m", 2},
        {"4294967295ms", "4294967295ms", 1},
        {"49d", "49d", 1},
        {"1s,2s,3s,4s,5s,6s,7s,8s,9s,10s,11s,12s,13s,14s,15s,16s,16s,1s",
         "1s,2s,3s,4s,5s,6s,7s,8s,9s,10s,11s,12s,13s,14s,15s,16s", 16},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        lapse_error_t err;
        if (lapse_config_set(cfg, "classes", cases[i].value, &err) != LAPSE_OK) {
            fail_msg("\"%s\": %s", cases[i].value, err.text);
        }
        assert_string_equal(lapse_config_get(cfg, "classes"), cases[i].text);
        assert_int_equal(cfg->n_classes, cases[i].n);
        for (size_t k = 1; k < cfg->n_classes; k++) {
            assert_true(cfg->classes[k - 1].ttl_ms < cfg->classes[k].ttl_ms);
        }
    }
    assert_int_equal(lapse_config_set(cfg, "classes", "45m,15m,30m", NULL), LAPSE_OK);
    assert_string_equal(cfg->classes[0].name, "15m");
    assert_int_equal(cfg->classes[0].ttl_ms, 900000);
    assert_string_equal(cfg->classes[2].name, "45m");
    assert_int_equal(cfg->classes[2].ttl_ms, 2700000);

    const lapse__class_t *cls = lapse__config_find_class(cfg, 1800000);
    assert_non_null(cls);
    assert_string_equal(cls->name, "30m");
    assert_null(lapse__config_find_class(cfg, 1800001));
    assert_null(lapse__config_find_class(cfg, 0));
    assert_null(lapse__config_find_class(NULL, 1800000));
}

static void test_class_errors_name_the_item(void **state) {
    lapse_config_t *cfg = *state;
    lapse_error_t err;
    assert_int_equal(lapse_config_set(cfg, "classes", "15m,half-hour", &err),
                     LAPSE_ERR_CONFIG_CLASS);
    assert_non_null(strstr(err.text, "\"half-hour\""));
}

static void test_clock_skew_is_no_property(void **state) {
    lapse_config_t *cfg = *state;
    lapse_error_t err;
    /* The test hook that shifted the process's clock is gone from the library: a shipped
     * binary must not be able to cancel early or accept a late payment on request. */
    assert_int_equal(lapse_config_set(cfg, "clock_skew", "-2h", &err),
                     LAPSE_ERR_CONFIG_UNKNOWN);
}

static void test_env_overrides_defaults(void **state) {
    lapse_config_t *cfg = *state;
    lapse_error_t err;
    /* Nothing set: nothing changes. */
    assert_int_equal(lapse_config_from_env(cfg, &err), LAPSE_OK);
    assert_string_equal(lapse_config_get(cfg, "prefix"), "lapse");

    setenv("LAPSE_AMQP_URL", "amqp://app:pw@broker:5673/shop", 1);
    setenv("LAPSE_STORE", "sqlite:/tmp/x.db", 1);
    setenv("LAPSE_PREFIX", "shop", 1);
    setenv("LAPSE_CLASSES", "45m,15m", 1);
    setenv("LAPSE_EVENTS_QUEUE", "shop.events.cancelled", 1);
    assert_int_equal(lapse_config_from_env(cfg, &err), LAPSE_OK);
    assert_string_equal(lapse_config_get(cfg, "events_queue"), "shop.events.cancelled");
    assert_string_equal(cfg->host, "broker");
    assert_int_equal(cfg->port, 5673);
    assert_string_equal(cfg->vhost, "shop");
    assert_string_equal(lapse_config_get(cfg, "store"), "sqlite:/tmp/x.db");
    assert_string_equal(lapse_config_get(cfg, "prefix"), "shop");
    assert_string_equal(lapse_config_get(cfg, "classes"), "15m,45m");

    /* A flag applied after the environment wins, as the CLI does it. */
    assert_int_equal(lapse_config_set(cfg, "prefix", "flag", NULL), LAPSE_OK);
    assert_string_equal(lapse_config_get(cfg, "prefix"), "flag");
}

/* Every setting has a variable, and lapse_config_from_env reads each one. */
static void test_env_covers_every_setting(void **state) {
    lapse_config_t *cfg = *state;
    static const struct {
        const char *env, *name, *value, *get;
    } cases[] = {
        {"LAPSE_QUEUE_TYPE", "queue_type", "quorum", "quorum"},
        {"LAPSE_HEARTBEAT", "heartbeat", "10", "10"},
        {"LAPSE_PREFETCH", "prefetch", "200", "200"},
        {"LAPSE_MAX_ATTEMPTS", "max_attempts", "3", "3"},
        {"LAPSE_SWEEP_EVERY", "sweep_every", "0", "0"},
        {"LAPSE_GRACE", "sweep_grace", "120s", "2m"},
        {"LAPSE_IN_FLIGHT", "sweep_in_flight", "10s", "10s"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        assert_string_equal(lapse_config_property_env(cases[i].name), cases[i].env);
        setenv(cases[i].env, cases[i].value, 1);
    }
    lapse_error_t err;
    assert_int_equal(lapse_config_from_env(cfg, &err), LAPSE_OK);
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        assert_string_equal(lapse_config_get(cfg, cases[i].name), cases[i].get);
    }
    assert_true(cfg->quorum);
    assert_int_equal(cfg->sweep_in_flight_ms, 10000);

    /* The table itself: every property is listed once, every variable is LAPSE_* and
     * unique, and every default reads back as lapse_config_new set it. */
    size_t n = 0, with_env = 0;
    lapse_config_t *fresh = lapse_config_new();
    assert_non_null(fresh);
    for (const char *name; (name = lapse_config_property_name(n)) != NULL; n++) {
        for (size_t k = 0; k < n; k++) {
            assert_string_not_equal(lapse_config_property_name(k), name);
        }
        const char *env = lapse_config_property_env(name);
        const char *def = lapse_config_property_default(name);
        assert_non_null(lapse_config_get(fresh, name));
        if (env) {
            with_env++;
            assert_true(strncmp(env, "LAPSE_", 6) == 0);
            for (size_t k = 0; k < n; k++) {
                const char *other =
                    lapse_config_property_env(lapse_config_property_name(k));
                assert_true(other == NULL || strcmp(other, env) != 0);
            }
            assert_non_null(def);
        }
        if (def) {
            lapse_config_t *probe = lapse_config_new();
            assert_non_null(probe);
            assert_int_equal(lapse_config_set(probe, name, def, NULL), LAPSE_OK);
            assert_string_equal(lapse_config_get(probe, name),
                                lapse_config_get(fresh, name));
            lapse_config_free(probe);
        }
    }
    lapse_config_free(fresh);
    assert_int_equal(n, 22);
    assert_int_equal(with_env, 22); /* every property has its variable */
    assert_null(lapse_config_property_name(n + 1));
    assert_null(lapse_config_property_env("clock_skew"));
    assert_null(lapse_config_property_default("clock_skew"));
    assert_null(lapse_config_property_env("nonsense"));
    assert_null(lapse_config_property_default(NULL));
}

static void test_env_empty_counts_as_unset(void **state) {
    lapse_config_t *cfg = *state;
    setenv("LAPSE_PREFIX", "", 1);
    assert_int_equal(lapse_config_from_env(cfg, NULL), LAPSE_OK);
    assert_string_equal(lapse_config_get(cfg, "prefix"), "lapse");
}

static void test_env_error_names_variable_and_changes_nothing(void **state) {
    lapse_config_t *cfg = *state;
    lapse_config_t before = *cfg;
    setenv("LAPSE_AMQP_URL", "amqp://other:1234/v", 1);
    setenv("LAPSE_PREFIX", "shop", 1);
    setenv("LAPSE_CLASSES", "15m,soon", 1);
    lapse_error_t err;
    assert_int_equal(lapse_config_from_env(cfg, &err), LAPSE_ERR_CONFIG_CLASS);
    assert_int_equal(err.code, LAPSE_ERR_CONFIG_CLASS);
    assert_non_null(strstr(err.text, "LAPSE_CLASSES"));
    assert_non_null(strstr(err.text, "\"soon\""));
    /* The valid variables before the bad one were not applied either. */
    assert_same_config(cfg, &before);
}

struct log_capture {
    int calls;
    lapse_log_level_t level;
    char line[2048];
};

static void capture_log(void *opaque, lapse_log_level_t level, const char *line) {
    struct log_capture *cap = opaque;
    cap->calls++;
    cap->level = level;
    snprintf(cap->line, sizeof cap->line, "%s", line);
}

static void test_log_goes_to_the_sink_as_one_line(void **state) {
    lapse_config_t *cfg = *state;
    struct log_capture cap = {0};
    lapse__log(cfg, LAPSE_LOG_INFO, "no sink yet %d", 1);
    lapse__log(NULL, LAPSE_LOG_INFO, "no config");

    lapse_config_set_log_cb(cfg, capture_log, &cap);
    lapse__log(cfg, LAPSE_LOG_WARN, "event=%s order_id=%s", "park", "ord-1");
    assert_int_equal(cap.calls, 1);
    assert_int_equal(cap.level, LAPSE_LOG_WARN);
    assert_string_equal(cap.line, "event=park order_id=ord-1");

    lapse__log(cfg, LAPSE_LOG_ERROR, "reason=%s", "line one\nline two\r\n");
    /* Control bytes are escaped, not blanked: the line stays one line and still says
     * what was there. */
    assert_string_equal(cap.line, "reason=line one\\x0aline two\\x0d\\x0a");

    char big[3000];
    memset(big, 'z', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    lapse__log(cfg, LAPSE_LOG_ERROR, "%s", big);
    assert_int_equal(strlen(cap.line), 1023);

    lapse_config_set_log_cb(cfg, NULL, NULL);
    lapse__log(cfg, LAPSE_LOG_INFO, "dropped");
    assert_int_equal(cap.calls, 3);
}

/* TLS files only with amqps://, a client certificate only with its key (issue 13). */
static void test_tls_settings_go_together(void **state) {
    lapse_config_t *cfg = *state;
    lapse_error_t err;
    assert_int_equal(lapse__config_check_tls(cfg, &err), LAPSE_OK);
    assert_int_equal(lapse_config_set(cfg, "tls_ca", "/etc/lapse/ca.pem", NULL),
                     LAPSE_OK);
    assert_string_equal(lapse_config_get(cfg, "tls_ca"), "/etc/lapse/ca.pem");
    assert_int_equal(lapse__config_check_tls(cfg, &err), LAPSE_ERR_CONFIG_VALUE);
    assert_non_null(strstr(err.text, "amqps://"));
    assert_int_equal(lapse_config_set(cfg, "amqp_url", "amqps://u:p@h/%2f", NULL),
                     LAPSE_OK);
    assert_int_equal(lapse__config_check_tls(cfg, &err), LAPSE_OK);
    assert_int_equal(lapse_config_set(cfg, "tls_cert", "c.pem", NULL), LAPSE_OK);
    assert_int_equal(lapse__config_check_tls(cfg, &err), LAPSE_ERR_CONFIG_VALUE);
    assert_non_null(strstr(err.text, "--tls-key"));
    assert_int_equal(lapse_config_set(cfg, "tls_key", "c.key", NULL), LAPSE_OK);
    assert_int_equal(lapse__config_check_tls(cfg, &err), LAPSE_OK);
    assert_int_equal(lapse_config_set(cfg, "tls_cert", "", NULL), LAPSE_OK);
    assert_int_equal(lapse__config_check_tls(cfg, &err), LAPSE_ERR_CONFIG_VALUE);
    /* Paths are kept as given, up to 1023 bytes. */
    char long_path[LAPSE__PATH_MAX + 1];
    memset(long_path, 'p', sizeof long_path - 1);
    long_path[sizeof long_path - 1] = '\0';
    assert_int_equal(lapse_config_set(cfg, "amqp_password_file", long_path, &err),
                     LAPSE_ERR_CONFIG_VALUE);
    long_path[LAPSE__PATH_MAX - 1] = '\0';
    assert_int_equal(lapse_config_set(cfg, "amqp_password_file", long_path, &err),
                     LAPSE_OK);
}

/* The store URI's password is never handed out: lapse_config_get masks it (user info,
 * password= and sslpassword=), and a URI libpq cannot parse is refused without the
 * token libpq would quote. */
static void test_store_password_never_shown(void **state) {
    (void)state;
    struct {
        const char *uri, *shown;
    } cases[] = {
        {"postgresql://u:pgsecret@db:5432/shop", "postgresql://u:***@db:5432/shop"},
        {"postgres://db/shop?password=pgsecret&sslmode=require",
         "postgres://db/shop?password=***&sslmode=require"},
        {"postgresql://u@db/shop?sslmode=require&sslpassword=pgsecret",
         "postgresql://u@db/shop?sslmode=require&sslpassword=***"},
        {"postgresql://u@db/shop?mypassword=x", "postgresql://u@db/shop?mypassword=x"},
        {"sqlite:/var/lib/lapse/p:w@x.db", "sqlite:/var/lib/lapse/p:w@x.db"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lapse_config_t *cfg = lapse_config_new();
        assert_int_equal(lapse_config_set(cfg, "store", cases[i].uri, NULL), LAPSE_OK);
        assert_string_equal(lapse_config_get(cfg, "store"), cases[i].shown);
        lapse_config_free(cfg);
    }
    const char *bad[] = {"postgresql://u:pg%ZZsecret@127.0.0.1:1/db",
                         "postgres://u:pg%00secret@127.0.0.1:1/db"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        lapse_status_t rc = LAPSE_OK;
        lapse_error_t err = {0};
        assert_null(lapse_store_open(bad[i], &rc, &err));
        printf("%s -> %s\n", bad[i], err.text);
        assert_int_equal(rc, LAPSE_ERR_STORE_OPEN);
        assert_null(strstr(err.text, "secret"));
        assert_non_null(strstr(err.text, "does not parse"));
    }
}

int main(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_defaults_follow_design),
        T(test_amqp_url_is_parsed),
        T(test_bad_values_are_refused_and_change_nothing),
        T(test_url_errors_do_not_leak_the_password),
        T(test_null_arguments),
        T(test_store_prefix_and_numbers),
        T(test_classes_are_canonical_sorted_and_unique),
        T(test_class_errors_name_the_item),
        T(test_clock_skew_is_no_property),
        T(test_env_overrides_defaults),
        T(test_env_covers_every_setting),
        T(test_env_empty_counts_as_unset),
        T(test_env_error_names_variable_and_changes_nothing),
        T(test_log_goes_to_the_sink_as_one_line),
        T(test_tls_settings_go_together),
        T(test_store_password_never_shown),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}

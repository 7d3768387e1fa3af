/* SPDX-License-Identifier: MIT
 * The metrics registry and its Prometheus text renderer: exact text for known values,
 * histograms cumulative with +Inf equal to _count, label escaping, exact decimals, the
 * health rule, and the listen address's syntax. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "metrics_int.h"

#include <lapse/lapse.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Render m's snapshot; new string, free()d by the caller. */
static char *render(lapse__metrics_t *m) {
    lapse__metrics_values_t v;
    lapse__metrics_snapshot(m, &v);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    assert_non_null(out);
    lapse__metrics_render(&v, out);
    assert_int_equal(fclose(out), 0);
    assert_int_equal(strlen(text), len);
    return text;
}

static void assert_contains(const char *text, const char *want) {
    if (strstr(text, want) == NULL) {
        fail_msg("missing:\n%s\n--- in:\n%s", want, text);
    }
}

static char *scaled(int64_t v, int64_t scale) {
    static char buf[64];
    FILE *out = fmemopen(buf, sizeof buf, "w");
    assert_non_null(out);
    lapse__metrics_write_scaled(out, v, scale);
    fclose(out);
    return buf;
}

static void test_scaled_decimals_are_exact(void **state) {
    (void)state;
    assert_string_equal(scaled(1500, 1000), "1.5");
    assert_string_equal(scaled(5, 1000), "0.005");
    assert_string_equal(scaled(0, 1000), "0");
    assert_string_equal(scaled(300000, 1000), "300");
    assert_string_equal(scaled(1, 1000000), "0.000001");
    assert_string_equal(scaled(2500000, 1000000), "2.5");
    assert_string_equal(scaled(-2, 1), "-2");
    assert_string_equal(scaled(-1250, 1000), "-1.25");
    assert_string_equal(scaled(INT64_MIN, 1), "-9223372036854775808");
}

static void test_label_values_are_escaped(void **state) {
    (void)state;
    char buf[128];
    FILE *out = fmemopen(buf, sizeof buf, "w");
    assert_non_null(out);
    lapse__metrics_write_label(out, "a\"b\\c\nd-é");
    fclose(out);
    assert_string_equal(buf, "a\\\"b\\\\c\\nd-é");

    lapse__metrics_t *m = lapse__metrics_new("shop\"eu\\1");
    assert_non_null(m);
    char *text = render(m);
    assert_contains(text, "lapse_build_info{version=\"" LAPSE_VERSION
                          "\",prefix=\"shop\\\"eu\\\\1\"} 1\n");
    free(text);
    lapse__metrics_free(m);
}

static void test_counters_render_exactly(void **state) {
    (void)state;
    lapse__metrics_t *m = lapse__metrics_new("lapse");
    assert_non_null(m);
    lapse__metrics_cancelled(m, 20);
    lapse__metrics_cancelled(m, 1500);
    lapse__metrics_cancelled(m, 400000);
    for (int i = 0; i < 4; i++) {
        lapse__metrics_decision(m, LAPSE__DEC_NOOP_PAID);
    }
    lapse__metrics_decision(m, LAPSE__DEC_NOOP_CANCELLED);
    lapse__metrics_decision(m, LAPSE__DEC_EARLY);
    lapse__metrics_decision(m, LAPSE__DEC_PARKED);
    lapse__metrics_decision(m, LAPSE__DEC_PARKED);
    lapse__metrics_reconnect(m);
    lapse__metrics_events(m, 3);
    lapse__metrics_sweep_cancelled(m, 2);
    lapse__metrics_batch(m, 7);
    lapse__metrics_batch(m, 3);
    lapse__metrics_outbox(m, 12);
    lapse__metrics_clock(m, 250, false);
    lapse__metrics_subscribed(m, true, NULL);
    char *text = render(m);
    assert_contains(text, "# HELP lapse_decisions_total Deliveries decided by this "
                          "consumer, by decision.\n"
                          "# TYPE lapse_decisions_total counter\n"
                          "lapse_decisions_total{decision=\"cancelled\"} 3\n"
                          "lapse_decisions_total{decision=\"noop_paid\"} 4\n"
                          "lapse_decisions_total{decision=\"noop_cancelled\"} 1\n"
                          "lapse_decisions_total{decision=\"early\"} 1\n"
                          "lapse_decisions_total{decision=\"retry\"} 0\n"
                          "lapse_decisions_total{decision=\"parked\"} 2\n");
    assert_contains(text, "# TYPE lapse_deliveries_total counter\n"
                          "lapse_deliveries_total 10\n");
    assert_contains(text, "\nlapse_parked_total 2\n");
    assert_contains(text, "\nlapse_sweep_cancelled_total 2\n");
    assert_contains(text, "\nlapse_events_published_total 3\n");
    assert_contains(text, "# TYPE lapse_reconnects_total counter\n"
                          "lapse_reconnects_total 1\n");
    assert_contains(text, "# TYPE lapse_cancel_lag_seconds histogram\n"
                          "lapse_cancel_lag_seconds_bucket{le=\"0.005\"} 0\n"
                          "lapse_cancel_lag_seconds_bucket{le=\"0.01\"} 0\n"
                          "lapse_cancel_lag_seconds_bucket{le=\"0.025\"} 1\n"
                          "lapse_cancel_lag_seconds_bucket{le=\"0.05\"} 1\n"
                          "lapse_cancel_lag_seconds_bucket{le=\"0.1\"} 1\n"
                          "lapse_cancel_lag_seconds_bucket{le=\"0.25\"} 1\n"
                          "lapse_cancel_lag_seconds_bucket{le=\"0.5\"} 1\n"
                          "lapse_cancel_lag_seconds_bucket{le=\"1\"} 1\n"
                          "lapse_cancel_lag_seconds_bucket{le=\"2.5\"} 2\n"
                          "lapse_cancel_lag_seconds_bucket{le=\"5\"} 2\n"
                          "lapse_cancel_lag_seconds_bucket{le=\"10\"} 2\n"
                          "lapse_cancel_lag_seconds_bucket{le=\"30\"} 2\n"
                          "lapse_cancel_lag_seconds_bucket{le=\"60\"} 2\n"
                          "lapse_cancel_lag_seconds_bucket{le=\"300\"} 2\n"
                          "lapse_cancel_lag_seconds_bucket{le=\"+Inf\"} 3\n"
                          "lapse_cancel_lag_seconds_sum 401.52\n"
                          "lapse_cancel_lag_seconds_count 3\n");
    assert_contains(text, "lapse_batch_size_bucket{le=\"2\"} 0\n"
                          "lapse_batch_size_bucket{le=\"5\"} 1\n"
                          "lapse_batch_size_bucket{le=\"10\"} 2\n");
    assert_contains(text, "lapse_batch_size_sum 10\nlapse_batch_size_count 2\n");
    assert_contains(text, "# TYPE lapse_outbox_pending gauge\nlapse_outbox_pending 12\n");
    assert_contains(text, "\nlapse_clock_bound_known 1\n");
    assert_contains(text, "\nlapse_clock_ahead_seconds 0.25\n");
    assert_contains(text, "\nlapse_subscribed 1\n");
    assert_contains(text, "\nlapse_store_up 1\n");
    assert_true(text[strlen(text) - 1] == '\n');
    free(text);
    lapse__metrics_free(m);
}

static void test_fresh_registry_renders_unknowns(void **state) {
    (void)state;
    lapse__metrics_t *m = lapse__metrics_new("lapse");
    char *text = render(m);
    assert_contains(text, "\nlapse_outbox_pending -1\n");
    assert_contains(text, "\nlapse_clock_bound_known 0\n");
    assert_contains(text, "\nlapse_clock_ahead_seconds NaN\n");
    assert_contains(text, "\nlapse_subscribed 0\n");
    assert_contains(text,
                    "lapse_cancel_lag_seconds_sum 0\nlapse_cancel_lag_seconds_count 0\n");
    free(text);
    lapse__metrics_clock(m, 100, false);
    lapse__metrics_clock(m, INT64_MAX, true); /* a step drops the bound */
    text = render(m);
    assert_contains(text, "\nlapse_clock_steps_total 1\n");
    assert_contains(text, "\nlapse_clock_ahead_seconds NaN\n");
    free(text);
    lapse__metrics_free(m);
}

/* Every sample line belongs to a family announced by HELP and TYPE before it, and every
 * histogram series is cumulative, ends with +Inf, and its +Inf bucket equals _count. */
static void test_exposition_is_well_formed(void **state) {
    (void)state;
    lapse__metrics_t *m = lapse__metrics_new("lapse");
    for (int64_t us = 1; us < 20000000; us = us * 3 + 7) {
        lapse__metrics_latency(m, LAPSE__OP_STORE_CANCEL, us);
        lapse__metrics_latency(m, LAPSE__OP_BROKER_ACK, us / 2);
    }
    lapse__metrics_latency(m, LAPSE__OP_BROKER_CONFIRM, 1000);
    for (size_t n = 1; n < 9000; n = n * 2 + 1) {
        lapse__metrics_batch(m, n);
    }
    char *text = render(m);
    assert_contains(text, "# TYPE lapse_store_latency_seconds histogram\n"
                          "lapse_store_latency_seconds_bucket{op=\"cancel_batch\","
                          "le=\"0.0001\"} ");
    assert_contains(text, "lapse_broker_latency_seconds_bucket{op=\"confirm\","
                          "le=\"0.001\"} 1\n");
    assert_contains(text, "lapse_broker_latency_seconds_sum{op=\"confirm\"} 0.001\n"
                          "lapse_broker_latency_seconds_count{op=\"confirm\"} 1\n");
    char family[128] = "", type[32] = "", series[256] = "";
    unsigned long long last = 0;
    bool in_buckets = false;
    size_t histograms = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "# HELP ", 7) == 0) {
            sscanf(line + 7, "%127s", family);
            type[0] = '\0';
            continue;
        }
        if (strncmp(line, "# TYPE ", 7) == 0) {
            char name[128];
            assert_int_equal(sscanf(line + 7, "%127s %31s", name, type), 2);
            assert_string_equal(name, family);
            continue;
        }
        assert_true(type[0] != '\0');
        assert_int_equal(strncmp(line, family, strlen(family)), 0);
        const char *rest = line + strlen(family);
        if (strcmp(type, "histogram") != 0) {
            assert_true(*rest == ' ' || *rest == '{');
            continue;
        }
        const char *space = strrchr(line, ' ');
        unsigned long long value = strtoull(space + 1, NULL, 10);
        if (strncmp(rest, "_bucket{", 8) == 0) {
            /* The series: the labels before le. */
            const char *le = strstr(rest, "le=\"");
            assert_non_null(le);
            char now[256];
            snprintf(now, sizeof now, "%.*s", (int)(le - rest), rest);
            if (!in_buckets || strcmp(now, series) != 0) {
                snprintf(series, sizeof series, "%s", now);
                last = 0;
                in_buckets = true;
            }
            assert_true(value >= last);
            last = value;
            continue;
        }
        if (strncmp(rest, "_count", 6) == 0) {
            /* _count follows its +Inf bucket, which it equals. */
            assert_true(in_buckets);
            assert_int_equal(value, last);
            in_buckets = false;
            histograms++;
            continue;
        }
        assert_int_equal(strncmp(rest, "_sum", 4), 0);
    }
    /* cancel lag, batch size, two store ops, two broker ops */
    assert_int_equal(histograms, 6);
    free(text);
    lapse__metrics_free(m);
}

static void test_health_needs_subscription_and_store(void **state) {
    (void)state;
    lapse__metrics_t *m = lapse__metrics_new("lapse");
    char why[200];
    assert_false(lapse__metrics_health(m, why, sizeof why));
    assert_string_equal(why, "broker: not subscribed yet");
    lapse__metrics_subscribed(m, true, NULL);
    assert_true(lapse__metrics_health(m, why, sizeof why));
    assert_string_equal(why, "ok");
    lapse__metrics_store(m, false, "database is locked\nretrying");
    assert_false(lapse__metrics_health(m, why, sizeof why));
    assert_string_equal(why, "store: database is locked retrying");
    lapse__metrics_store(m, true, NULL);
    lapse__metrics_subscribed(m, false, "connection closed by the broker");
    assert_false(lapse__metrics_health(m, why, sizeof why));
    assert_string_equal(why, "broker: connection closed by the broker");
    lapse__metrics_free(m);
    /* A consumer without metrics records into NULL. */
    lapse__metrics_decision(NULL, LAPSE__DEC_EARLY);
    lapse__metrics_cancelled(NULL, 5);
    lapse__metrics_subscribed(NULL, true, NULL);
    lapse__metrics_free(NULL);
}

static void test_listen_address_syntax(void **state) {
    (void)state;
    static const struct {
        const char *text, *host, *port;
    } good[] = {
        {"127.0.0.1:9464", "127.0.0.1", "9464"},
        {"localhost:0", "localhost", "0"},
        {"[::1]:9464", "::1", "9464"},
        {"[::]:65535", "::", "65535"},
        {":9464", "", "9464"},
        {"metrics.internal-1:80", "metrics.internal-1", "80"},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char host[64], port[8];
        if (!lapse__metrics_listen_parse(good[i].text, host, sizeof host, port,
                                         sizeof port)) {
            fail_msg("refused %s", good[i].text);
        }
        assert_string_equal(host, good[i].host);
        assert_string_equal(port, good[i].port);
    }
    static const char *const bad[] = {
        "",
        "9464",
        "host:",
        "host:65536",
        "host:-1",
        "host:94a",
        "::1:9464",
        "[::1:9464",
        "[]:9464",
        "ho st:1",
        "[::1]9464",
        "host:123456",
        "[fe80::1%eth0]:9464",
        "h\"x:1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char host[64], port[8];
        if (lapse__metrics_listen_parse(bad[i], host, sizeof host, port, sizeof port)) {
            fail_msg("took %s", bad[i]);
        }
    }
    char tiny[4], port[8];
    assert_false(
        lapse__metrics_listen_parse("localhost:1", tiny, sizeof tiny, port, sizeof port));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scaled_decimals_are_exact),
        cmocka_unit_test(test_label_values_are_escaped),
        cmocka_unit_test(test_counters_render_exactly),
        cmocka_unit_test(test_fresh_registry_renders_unknowns),
        cmocka_unit_test(test_exposition_is_well_formed),
        cmocka_unit_test(test_health_needs_subscription_and_store),
        cmocka_unit_test(test_listen_address_syntax),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT
 * Metrics and health (issue 13): a consumer run with --metrics-listen 127.0.0.1:0 (the
 * port it got is read from its log) through the pipeline: 100 orders with 2-3 s windows,
 * half paid in time. Scrapes of /metrics during and after the run give counters equal
 * to what the store shows (decisions cancelled and noop_paid, the cancel-lag histogram's
 * count, deliveries, batch sizes). /healthz and `lapse health` say 200/0 while it
 * consumes, 503/1 once the broker node is killed, 200/0 again after it restarts, and
 * "no consumer answers" once the consumer stopped. On PostgreSQL (integration_metrics_pg)
 * the same for the store: its cluster killed, 503 "store: ...", 200 once it is back.
 *
 * This test kills the shared test node: it always restarts it, and the group teardown
 * makes sure it answers again before the next test runs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define ORDERS 100

static bool is_paid(int i) {
    return i % 4 < 2; /* half, spread over both classes */
}

/* GET url into <dir>/<file> with curl; returns the HTTP status (0: nothing answered). */
static int http_get(h_ctx_t *h, const char *url, const char *file) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s", h_path(h, file));
    char cmd[2 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "curl -s --max-time 5 -o '%s' -w '%%{http_code}' '%s'",
             path, url);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int status = 0;
    if (fscanf(p, "%d", &status) != 1) {
        status = 0;
    }
    pclose(p);
    return status;
}

/* The whole of <dir>/<file>; new, free()d by the caller. */
static char *slurp(h_ctx_t *h, const char *file) {
    FILE *f = fopen(h_path(h, file), "r");
    assert_non_null(f);
    char *text = NULL;
    size_t cap = 0;
    ssize_t n = getdelim(&text, &cap, '\0', f);
    fclose(f);
    assert_true(n >= 0);
    return text;
}

/* The value of the sample named series ("name" or "name{labels}") in a scrape; -1 when
 * it is not there. */
static double sample(const char *scrape, const char *series) {
    size_t n = strlen(series);
    for (const char *line = scrape; line && *line; line = strchr(line, '\n')) {
        if (*line == '\n') {
            line++;
        }
        if (strncmp(line, series, n) == 0 && line[n] == ' ') {
            return strtod(line + n + 1, NULL);
        }
    }
    return -1;
}

typedef struct scrape {
    double cancelled, noop_paid, noop_cancelled, parked, deliveries, lag_count, batch_sum,
        batch_count, reconnects, subscribed, sweep_cancelled;
} scrape_t;

static scrape_t scrape(h_ctx_t *h, const char *base) {
    char url[128];
    snprintf(url, sizeof url, "%s/metrics", base);
    assert_int_equal(http_get(h, url, "metrics.txt"), 200);
    char *text = slurp(h, "metrics.txt");
    scrape_t s = {
        .cancelled = sample(text, "lapse_decisions_total{decision=\"cancelled\"}"),
        .noop_paid = sample(text, "lapse_decisions_total{decision=\"noop_paid\"}"),
        .noop_cancelled =
            sample(text, "lapse_decisions_total{decision=\"noop_cancelled\"}"),
        .parked = sample(text, "lapse_parked_total"),
        .deliveries = sample(text, "lapse_deliveries_total"),
        .lag_count = sample(text, "lapse_cancel_lag_seconds_count"),
        .batch_sum = sample(text, "lapse_batch_size_sum"),
        .batch_count = sample(text, "lapse_batch_size_count"),
        .reconnects = sample(text, "lapse_reconnects_total"),
        .subscribed = sample(text, "lapse_subscribed"),
        .sweep_cancelled = sample(text, "lapse_sweep_cancelled_total"),
    };
    /* The +Inf bucket is the count, and the scrape is a well-formed exposition. */
    assert_true(sample(text, "lapse_cancel_lag_seconds_bucket{le=\"+Inf\"}") ==
                s.lag_count);
    assert_non_null(strstr(text, "# TYPE lapse_cancel_lag_seconds histogram\n"));
    assert_true(sample(text, "lapse_outbox_pending") >= -1);
    free(text);
    return s;
}

/* `$LAPSE_PG_NODE_SCRIPT cmd $LAPSE_TEST_PG_NODE`, output to <dir>/pg-node.log. */
static int pg_node(h_ctx_t *h, const char *cmd) {
    const char *script = getenv("LAPSE_PG_NODE_SCRIPT");
    const char *name = getenv("LAPSE_TEST_PG_NODE");
    assert_non_null(script);
    assert_non_null(name);
    char line[2 * PATH_MAX];
    snprintf(line, sizeof line, "'%s' %s '%s' >>'%s' 2>&1", script, cmd, name,
             h_path(h, "pg-node.log"));
    int rc = system(line);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* Poll /healthz until it answers want (0: nothing answers) or timeout_ms passes; the
 * last status. */
static int wait_health(h_ctx_t *h, const char *base, int want, int timeout_ms) {
    char url[128];
    snprintf(url, sizeof url, "%s/healthz", base);
    int64_t until = h_now_ms() + h_ms(timeout_ms);
    int status;
    while ((status = http_get(h, url, "healthz.txt")) != want && h_now_ms() < until) {
        usleep(200000);
    }
    return status;
}

static void test_metrics_equal_the_store_and_health_follows_the_broker(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "metrics", "2s,3s", true);
    pid_t consumer = h_spawn_consumer(
        &h, "consumer.log", (const char *[]){"--metrics-listen", "127.0.0.1:0", NULL});

    /* The port the kernel gave, from the consumer's log. */
    char base[64] = "";
    for (int t = 0; t < 100 && !base[0]; t++) {
        FILE *f = fopen(h_path(&h, "consumer.log"), "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) {
            const char *at = strstr(line, "event=metrics_listening address=");
            int port = 0;
            if (at &&
                sscanf(at, "event=metrics_listening address=127.0.0.1:%d", &port) == 1) {
                snprintf(base, sizeof base, "http://127.0.0.1:%d", port);
            }
        }
        if (f) {
            fclose(f);
        }
        usleep(100000);
    }
    assert_true(base[0] != '\0');
    char listen[64];
    snprintf(listen, sizeof listen, "%s", base + strlen("http://"));
    assert_int_equal(wait_health(&h, base, 200, 20000), 200);

    FILE *f = fopen(h_path(&h, "orders.jsonl"), "w");
    assert_non_null(f);
    for (int i = 0; i < ORDERS; i++) {
        fprintf(f, "{\"order_id\":\"ord-%d\",\"timeout\":\"%s\"}\n", i,
                i % 2 ? "3s" : "2s");
    }
    fclose(f);
    assert_int_equal(
        h_lapse(&h, NULL, 0, "publish", "--batch", h_path(&h, "orders.jsonl"), NULL), 0);
    assert_int_equal(h_pay_in_time(&h, ORDERS, is_paid), ORDERS / 2);

    /* During the run: never more cancellations counted than the store holds (the store
     * commits before the consumer counts), and healthy. */
    char out[256];
    assert_int_equal(
        h_lapse(&h, out, sizeof out, "health", "--metrics-listen", listen, NULL), 0);
    assert_string_equal(out, "ok\n");
    int64_t until = h_now_ms() + h_ms(30000);
    scrape_t s;
    for (;;) {
        s = scrape(&h, base);
        int64_t in_store =
            h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='cancelled'");
        assert_true(s.cancelled <= (double)in_store || in_store == ORDERS / 2);
        if ((s.cancelled == ORDERS / 2 && s.noop_paid == ORDERS / 2) ||
            h_now_ms() > until) {
            break;
        }
        usleep(250000);
    }
    /* After: equal to what the store shows. */
    int64_t cancelled =
        h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='cancelled'");
    int64_t paid_expired = h_sql_int(&h,
                                     "SELECT count(*) FROM orders WHERE status='paid'"
                                     " AND deadline_ms <= %lld",
                                     (long long)h_now_ms());
    printf("scrape cancelled=%.0f noop_paid=%.0f lag_count=%.0f deliveries=%.0f "
           "batches=%.0f store_cancelled=%lld store_paid_expired=%lld\n",
           s.cancelled, s.noop_paid, s.lag_count, s.deliveries, s.batch_count,
           (long long)cancelled, (long long)paid_expired);
    assert_int_equal(cancelled, ORDERS / 2);
    assert_int_equal(paid_expired, ORDERS / 2);
    assert_true(s.cancelled + s.sweep_cancelled == (double)cancelled);
    assert_true(s.sweep_cancelled == 0);
    assert_true(s.noop_paid == (double)paid_expired);
    assert_true(s.lag_count == s.cancelled);
    assert_true(s.noop_cancelled == 0 && s.parked == 0);
    assert_true(s.deliveries == ORDERS);
    assert_true(s.batch_sum == ORDERS);
    assert_true(s.batch_count >= 1 && s.batch_count <= ORDERS);
    assert_true(s.reconnects == 0 && s.subscribed == 1);
    /* The same counts as the consumer's decision lines. */
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=cancelled"),
                     (size_t)s.cancelled);
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=noop_paid"),
                     (size_t)s.noop_paid);

    /* The broker killed: 503 with the reason, `lapse health` exits 1. */
    int64_t t_kill = h_now_ms();
    assert_int_equal(h_node(&h, "kill"), 0);
    assert_int_equal(wait_health(&h, base, 503, 15000), 503);
    int64_t t_503 = h_now_ms();
    char *why = slurp(&h, "healthz.txt");
    printf("healthz after the kill (%lld ms): 503 %s", (long long)(t_503 - t_kill), why);
    assert_int_equal(strncmp(why, "broker: ", 8), 0);
    free(why);
    size_t unhealthy_before = h_count_lines(&h, "cli.log", "lapse health: unhealthy");
    assert_int_equal(h_lapse(&h, NULL, 0, "health", "--metrics-listen", listen, NULL), 1);
    assert_int_equal(h_count_lines(&h, "cli.log",
                                   "lapse health: unhealthy (HTTP 503): "
                                   "broker: "),
                     unhealthy_before + 1);
    s = scrape(&h, base);
    assert_true(s.subscribed == 0);

    /* Back: 200 again once it subscribed again. */
    assert_int_equal(h_node(&h, "restart"), 0);
    int64_t t_up = h_now_ms();
    assert_int_equal(wait_health(&h, base, 200, 60000), 200);
    printf("healthz 200 again %lld ms after the restart\n",
           (long long)(h_now_ms() - t_up));
    assert_int_equal(
        h_lapse(&h, out, sizeof out, "health", "--metrics-listen", listen, NULL), 0);
    s = scrape(&h, base);
    assert_true(s.reconnects >= 1 && s.subscribed == 1);

    if (h.pg) {
        /* The store killed: the consumer notices within its outbox count (every 5 s)
         * and says so; back once the cluster answers again. */
        assert_int_equal(pg_node(&h, "kill"), 0);
        assert_int_equal(wait_health(&h, base, 503, 15000), 503);
        why = slurp(&h, "healthz.txt");
        printf("healthz with the store killed: 503 %s", why);
        assert_int_equal(strncmp(why, "store: ", 7), 0);
        free(why);
        assert_int_equal(h_lapse(&h, NULL, 0, "health", "--metrics-listen", listen, NULL),
                         1);
        assert_int_equal(pg_node(&h, "restart-immediate"), 0);
        assert_int_equal(wait_health(&h, base, 200, 30000), 200);
        assert_int_equal(
            h_lapse(&h, out, sizeof out, "health", "--metrics-listen", listen, NULL), 0);
    }

    /* Stopped: nothing answers. */
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(15000)), 0);
    assert_int_equal(h_lapse(&h, NULL, 0, "health", "--metrics-listen", listen, NULL), 1);
    char needle[128];
    snprintf(needle, sizeof needle, "lapse health: no consumer answers on %s", listen);
    assert_int_equal(h_count_lines(&h, "cli.log", needle), 1);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_equal_the_store_and_health_follows_the_broker),
    };
    return cmocka_run_group_tests(tests, NULL, h_group_ensure_node);
}

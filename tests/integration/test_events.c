/* SPDX-License-Identifier: MIT
 * No event is ever dropped: order.cancelled events published while no queue is bound to
 * the events exchange wait in the outbox and reach a queue bound later, once each; a
 * standalone `lapse sweep` publishes the events of what it cancelled; a consumer stopped
 * with SIGTERM publishes what it still owes before it exits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <lapse/message.h>
#include <lapse/store.h>

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define OUT_CAP 65536
#define SEC     INT64_C(1000)

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The value of key=N in a line of key=value pairs; fails the test when absent. */
static long long kv(const char *out, const char *key) {
    char needle[64];
    snprintf(needle, sizeof needle, " %s=", key);
    const char *p = strstr(out, needle);
    if (!p) {
        fail_msg("no %s= in '%s'", key, out);
    }
    return atoll(p + strlen(needle));
}

static int64_t unpublished(h_ctx_t *h) {
    return h_sql_int(h, sf_sql_unpublished(h->sf.backend));
}

/* `lapse status --json` (extra global flags may come first), parsed. */
static json_t *status_json(h_ctx_t *h, const char *flag, const char *value) {
    char out[OUT_CAP];
    int code = flag ? h_lapse(h, out, sizeof out, flag, value, "status", "--json", NULL)
                    : h_lapse(h, out, sizeof out, "status", "--json", NULL);
    assert_int_equal(code, 0);
    json_error_t jerr;
    json_t *root = json_loads(out, 0, &jerr);
    if (!root) {
        fail_msg("status --json: %s: %s", jerr.text, out);
    }
    return root;
}

static long long outbox_pending(h_ctx_t *h) {
    json_t *root = status_json(h, NULL, NULL);
    json_t *pending = json_object_get(json_object_get(root, "outbox"), "pending");
    assert_true(json_is_integer(pending));
    long long n = json_integer_value(pending);
    json_decref(root);
    return n;
}

/* The events drained from a queue, each checked against the store. */
typedef struct seen {
    h_ctx_t *h;
    char ids[64][256];
    size_t n;
    size_t dup;
} seen_t;

static void check_event(void *opaque, const h_msg_t *m) {
    seen_t *s = opaque;
    for (size_t i = 0; i < s->n; i++) {
        if (strcmp(s->ids[i], m->message_id) == 0) {
            s->dup++;
            return;
        }
    }
    assert_true(s->n < 64);
    snprintf(s->ids[s->n++], sizeof s->ids[0], "%s", m->message_id);

    /* The properties of README's contract. */
    assert_string_equal(m->type, LAPSE_EVENT_CANCELLED);
    assert_string_equal(m->app_id, "lapse");
    assert_string_equal(m->content_type, "application/json");
    assert_int_equal(m->delivery_mode, 2);

    json_error_t jerr;
    json_t *body = json_loads(m->body, 0, &jerr);
    if (!body) {
        fail_msg("event body is not JSON: %s: %s", jerr.text, m->body);
    }
    const char *order_id = json_string_value(json_object_get(body, "order_id"));
    assert_non_null(order_id);
    char want_id[200];
    snprintf(want_id, sizeof want_id, "order.cancelled:%s", order_id);
    assert_string_equal(m->message_id, want_id);
    assert_string_equal(json_string_value(json_object_get(body, "event")),
                        LAPSE_EVENT_CANCELLED);

    /* deadline and cancelled_at are the store's, spelled RFC 3339. */
    assert_int_equal(h_sql_int(s->h,
                               "SELECT count(*) FROM orders WHERE order_id='%s' AND "
                               "status='cancelled'",
                               order_id),
                     1);
    char want[LAPSE_RFC3339_LEN];
    lapse_time_format_rfc3339(
        h_sql_int(s->h, "SELECT deadline_ms FROM orders WHERE order_id='%s'", order_id),
        want);
    assert_string_equal(json_string_value(json_object_get(body, "deadline")), want);
    lapse_time_format_rfc3339(
        h_sql_int(s->h, "SELECT cancelled_at_ms FROM orders WHERE order_id='%s'",
                  order_id),
        want);
    assert_string_equal(json_string_value(json_object_get(body, "cancelled_at")), want);

    /* holds: exactly the order's, all released. */
    json_t *holds = json_object_get(body, "holds");
    assert_true(json_is_array(holds));
    assert_int_equal(
        json_array_size(holds),
        h_sql_int(s->h, "SELECT count(*) FROM holds WHERE order_id='%s'", order_id));
    size_t i;
    json_t *hold;
    json_array_foreach(holds, i, hold) {
        assert_int_equal(h_sql_int(s->h,
                                   "SELECT count(*) FROM holds WHERE order_id='%s' AND "
                                   "resource='%s' AND released_at_ms IS NOT NULL",
                                   order_id, json_string_value(hold)),
                         1);
    }
    json_decref(body);
}

/* Drain queue; every event once, each matching the store. Returns how many. */
static size_t drain_events(h_ctx_t *h, amqp_connection_state_t conn, const char *queue,
                           int idle_ms) {
    seen_t *s = calloc(1, sizeof *s);
    assert_non_null(s);
    s->h = h;
    size_t total = h_drain(conn, queue, idle_ms, check_event, s);
    assert_int_equal(s->dup, 0);
    assert_int_equal(total, s->n);
    free(s);
    return total;
}

static void publish_orders(h_ctx_t *h, int n, const char *timeout) {
    FILE *f = fopen(h_path(h, "orders.jsonl"), "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        if (i % 3 == 0) {
            fprintf(f, "{\"order_id\":\"ord-%d\",\"timeout\":\"%s\"}\n", i, timeout);
        } else {
            fprintf(f,
                    "{\"order_id\":\"ord-%d\",\"timeout\":\"%s\",\"holds\":[\"seat-%d\","
                    "\"slot-%d\"]}\n",
                    i, timeout, i, i);
        }
    }
    fclose(f);
    assert_int_equal(
        h_lapse(h, NULL, 0, "publish", "--batch", h_path(h, "orders.jsonl"), NULL), 0);
}

/* a) Cancelled while no queue is bound: a warning names the exchange and the backlog,
 * status shows it; bound later, every event arrives exactly once. */
static void test_events_wait_for_a_queue_then_arrive_once(void **state) {
    (void)state;
    enum { N = 12 };
    h_ctx_t h;
    h_setup(&h, "events-a", "2s", true);
    char events_x[128], tap[160];
    snprintf(events_x, sizeof events_x, "%s.events", h.prefix);
    snprintf(tap, sizeof tap, "%s.tap", h.prefix);
    amqp_connection_state_t conn = h_amqp_open(&h);

    pid_t consumer = h_spawn_consumer(&h, "consumer.log", NULL);
    h_wait_lines(&h, "consumer.log", "event=consuming", 1, h_ms(10000));
    publish_orders(&h, N, "2s");
    assert_int_equal(h_wait_sql(&h, N, h_ms(20000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     N);

    /* The retries after the first refusal are probes of one event each, and the warning
     * counts every event waiting. */
    char needle[256];
    snprintf(needle, sizeof needle,
             "event=events_unroutable exchange=%s returned=1 waiting=%d ", events_x, N);
    h_wait_lines(&h, "consumer.log", needle, 1, h_ms(15000));
    assert_true(h_count_lines(&h, "consumer.log", needle) >= 1);
    assert_int_equal(unpublished(&h), N);
    assert_int_equal(outbox_pending(&h), N);
    char out[OUT_CAP];
    assert_int_equal(h_lapse(&h, out, sizeof out, "status", NULL), 0);
    snprintf(needle, sizeof needle, "outbox: pending=%d ", N);
    assert_non_null(strstr(out, needle));
    assert_true(h_alive(consumer));

    /* A queue is bound: the backlog goes out at the next try, each event once. */
    h_tap(&h, conn, "tap", events_x, LAPSE_EVENT_CANCELLED);
    int64_t bound_at = mono_ms();
    assert_int_equal(h_wait_sql(&h, 0, h_ms(45000), sf_sql_unpublished(h.sf.backend)), 0);
    printf("events-a backlog of %d published %lld ms after the bind\n", N,
           (long long)(mono_ms() - bound_at));
    h_wait_lines(&h, "consumer.log", "event=events_routable", 1, h_ms(5000));
    assert_int_equal(h_count_lines(&h, "consumer.log", "event=events_routable"), 1);
    assert_int_equal(drain_events(&h, conn, tap, 1500), N);
    assert_int_equal(outbox_pending(&h), 0);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM events"), N);

    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    assert_int_equal(
        h_count_lines(&h, "consumer.log", "event=events_flushed published=0"), 1);
    /* Nothing was published twice, at the stop or before it. */
    assert_int_equal(drain_events(&h, conn, tap, 500), 0);
    h_amqp_close(conn);
    h_teardown(&h);
}

static lapse_store_t *open_store(h_ctx_t *h) {
    lapse_status_t rc;
    lapse_error_t err;
    lapse_store_t *store = lapse_store_open(h->store, &rc, &err);
    if (!store) {
        fail_msg("open %s: %s", h->store, err.text);
    }
    return store;
}

/* b) Orders whose messages were lost (recorded and confirmed, then gone): a standalone
 * sweep, with no consumer anywhere, cancels them and publishes their events. With no
 * queue bound it says so in one warning line and exits 0; once the topology's events
 * queue is declared, the next sweep publishes what waits. */
static void test_standalone_sweep_publishes_its_events(void **state) {
    (void)state;
    enum { N = 7 };
    h_ctx_t h;
    h_setup(&h, "events-b", "2s", true);
    char events_x[128], queue[160];
    snprintf(events_x, sizeof events_x, "%s.events", h.prefix);
    snprintf(queue, sizeof queue, "%s.events.cancelled", h.prefix);
    lapse_store_t *store = open_store(&h);
    int64_t now = h_now_ms();
    for (int i = 0; i < N; i++) {
        char id[32], hold[32];
        snprintf(id, sizeof id, "lost-%d", i);
        snprintf(hold, sizeof hold, "room-%d", i);
        const char *holds[1] = {hold};
        lapse_new_order_t order = {.order_id = id,
                                   .deadline_ms = now - 90 * SEC - i,
                                   .created_at_ms = now - 3600 * SEC,
                                   .holds = holds,
                                   .n_holds = i % 2};
        lapse_status_t result = LAPSE_ERR_INVALID;
        lapse_error_t err;
        assert_int_equal(lapse_store_insert_orders(store, &order, 1, &result, &err),
                         LAPSE_OK);
        assert_int_equal(result, LAPSE_OK);
        const char *ids[1] = {id};
        assert_int_equal(lapse_store_mark_scheduled(store, ids, 1, &err), LAPSE_OK);
    }
    lapse_store_close(store);

    /* A dry run with the broker out of reach: it connects to none, so it cannot fail. */
    char amqp[sizeof h.amqp];
    snprintf(amqp, sizeof amqp, "%s", h.amqp);
    snprintf(h.amqp, sizeof h.amqp, "amqp://guest:guest@127.0.0.1:1/%%2f");
    char out[OUT_CAP];
    assert_int_equal(h_lapse(&h, out, sizeof out, "sweep", "--dry-run", NULL), 0);
    assert_int_equal(kv(out, "would_cancel"), N);
    snprintf(h.amqp, sizeof h.amqp, "%s", amqp);
    assert_int_equal(h_count_lines(&h, "cli.log", "level=warn"), 0);

    /* No queue bound: cancelled all the same, exit 0, one warning about the events. */
    assert_int_equal(h_lapse(&h, out, sizeof out, "sweep", NULL), 0);
    printf("sweep (no queue): %s", out);
    assert_int_equal(kv(out, "cancelled"), N);
    assert_int_equal(kv(out, "events_published"), 0);
    assert_int_equal(kv(out, "events_waiting"), N);
    char needle[256];
    snprintf(needle, sizeof needle, "event=events_unroutable exchange=%s ", events_x);
    assert_int_equal(h_count_lines(&h, "cli.log", needle), 1);
    assert_int_equal(h_count_lines(&h, "cli.log", "level=warn event=events_unroutable"),
                     1);
    assert_int_equal(unpublished(&h), N);

    /* The topology's events queue, in one step; status now lists it. */
    assert_int_equal(
        h_lapse(&h, NULL, 0, "--events-queue", queue, "topology", "declare", NULL), 0);
    json_t *st = status_json(&h, "--events-queue", queue);
    json_t *q = json_object_get(json_object_get(st, "queues"), queue);
    assert_non_null(q);
    assert_int_equal(json_integer_value(json_object_get(q, "messages")), 0);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(st, "outbox"), "pending")), N);
    json_decref(st);

    /* The next sweep has nothing to cancel and publishes what waits. */
    assert_int_equal(h_lapse(&h, out, sizeof out, "sweep", NULL), 0);
    printf("sweep (queue bound): %s", out);
    assert_int_equal(kv(out, "cancelled"), 0);
    assert_int_equal(kv(out, "events_published"), N);
    assert_int_equal(kv(out, "events_waiting"), 0);
    assert_int_equal(unpublished(&h), 0);
    assert_int_equal(h_count_lines(&h, "cli.log", "level=warn event=events_unroutable"),
                     1);
    amqp_connection_state_t conn = h_amqp_open(&h);
    assert_int_equal(h_queue_depth(conn, queue), N);
    assert_int_equal(drain_events(&h, conn, queue, 500), N);
    h_amqp_close(conn);
    h_teardown(&h);
}

/* retry_in_ms of the events_unroutable lines of file after the first skip of them: the
 * largest, -1 when there is none. */
static long long retry_in_ms_after(h_ctx_t *h, const char *file, size_t skip) {
    FILE *f = fopen(h_path(h, file), "r");
    if (!f) {
        return -1;
    }
    char line[1024];
    long long retry = -1;
    size_t seen = 0;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "event=events_unroutable ");
        if (p && seen++ >= skip && (p = strstr(p, " retry_in_ms="))) {
            long long v = atoll(p + strlen(" retry_in_ms="));
            retry = v > retry ? v : retry;
        }
    }
    fclose(f);
    return retry;
}

/* c) SIGTERM while events are owed. A consumer that cancelled N orders with no queue
 * bound exits 0 at once and says its N events wait. A second consumer cancels M more, is
 * held back from publishing them by the unroutable backoff, and is stopped just after a
 * queue was bound: it publishes its M in its last seconds, and only those (the first
 * consumer's N may be someone else's business), exiting 0 within the bound. A sweep then
 * publishes the N. Every event arrives once. */
static void test_sigterm_publishes_what_is_owed(void **state) {
    (void)state;
    enum { N = 10, M = 8 };
    h_ctx_t h;
    h_setup(&h, "events-c", "2s", true);
    char events_x[128], tap[160];
    snprintf(events_x, sizeof events_x, "%s.events", h.prefix);
    snprintf(tap, sizeof tap, "%s.tap", h.prefix);
    amqp_connection_state_t conn = h_amqp_open(&h);

    pid_t first = h_spawn_consumer(&h, "consumer1.log", NULL);
    h_wait_lines(&h, "consumer1.log", "event=consuming", 1, h_ms(10000));
    publish_orders(&h, N, "2s");
    assert_int_equal(h_wait_sql(&h, N, h_ms(20000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     N);
    h_wait_lines(&h, "consumer1.log", "event=events_unroutable", 1, h_ms(10000));
    int64_t t0 = mono_ms();
    assert_int_equal(h_stop(first, SIGTERM, h_ms(10000)), 0);
    int64_t first_exit_ms = mono_ms() - t0;
    char needle[256];
    snprintf(needle, sizeof needle,
             "event=events_left exchange=%s published=0 owed=%d waiting=%d ", events_x, N,
             N);
    assert_int_equal(h_count_lines(&h, "consumer1.log", needle), 1);
    assert_int_equal(unpublished(&h), N);

    /* The second consumer: refused at its start (the first one's backlog), then it
     * cancels M orders of its own, which it owes from then on. */
    pid_t second = h_spawn_consumer(&h, "consumer2.log", NULL);
    h_wait_lines(&h, "consumer2.log", "event=events_unroutable", 1, h_ms(10000));
    FILE *f = fopen(h_path(&h, "more.jsonl"), "w");
    assert_non_null(f);
    for (int i = 0; i < M; i++) {
        fprintf(f, "{\"order_id\":\"more-%d\",\"timeout\":\"2s\"}\n", i);
    }
    fclose(f);
    assert_int_equal(
        h_lapse(&h, NULL, 0, "publish", "--batch", h_path(&h, "more.jsonl"), NULL), 0);
    assert_int_equal(h_wait_sql(&h, N + M, h_ms(20000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     N + M);
    /* Once its next try is at least 2 s away, a queue is bound and it is stopped: its
     * events are then still owed, and only the stop path can publish them. */
    size_t before = h_count_lines(&h, "consumer2.log", "event=events_unroutable");
    long long retry = -1;
    for (int64_t until = mono_ms() + h_ms(90000);
         (retry = retry_in_ms_after(&h, "consumer2.log", before)) < 2000 &&
         mono_ms() < until;) {
        size_t lines = h_count_lines(&h, "consumer2.log", "event=events_unroutable");
        h_wait_lines(&h, "consumer2.log", "event=events_unroutable", lines + 1, 40000);
        before = retry < 2000 ? lines : before;
    }
    assert_true(retry >= 2000);
    size_t refusals = h_count_lines(&h, "consumer2.log", "event=events_unroutable");
    h_tap(&h, conn, "tap", events_x, "#");
    assert_int_equal(unpublished(&h), N + M);
    t0 = mono_ms();
    assert_int_equal(h_stop(second, SIGTERM, h_ms(10000)), 0);
    int64_t second_exit_ms = mono_ms() - t0;
    printf("sigterm: exit without a queue %lld ms, with owed events %lld ms (retry was "
           "%lld ms away)\n",
           (long long)first_exit_ms, (long long)second_exit_ms, retry);
    assert_true(second_exit_ms < 5000 + h_ms(2000));
    assert_int_equal(h_count_lines(&h, "consumer2.log", "event=events_unroutable"),
                     refusals);
    snprintf(needle, sizeof needle,
             "event=events_flushed published=%d owed=%d waiting=%d", M, M, N);
    assert_int_equal(h_count_lines(&h, "consumer2.log", needle), 1);
    assert_int_equal(unpublished(&h), N);
    assert_int_equal(h_sql_int(&h,
                               "SELECT count(*) FROM events WHERE NOT (%s)"
                               " AND order_id LIKE 'more-%%'",
                               sf_unpublished_where(h.sf.backend)),
                     M);
    assert_int_equal(drain_events(&h, conn, tap, 500), M);

    /* The first consumer's events, left in the outbox, go with the next sweep. */
    char out[OUT_CAP];
    assert_int_equal(h_lapse(&h, out, sizeof out, "sweep", NULL), 0);
    assert_int_equal(kv(out, "events_published"), N);
    assert_int_equal(unpublished(&h), 0);
    assert_int_equal(drain_events(&h, conn, tap, 500), N);
    h_amqp_close(conn);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events_wait_for_a_queue_then_arrive_once),
        cmocka_unit_test(test_standalone_sweep_publishes_its_events),
        cmocka_unit_test(test_sigterm_publishes_what_is_owed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT
 * Fault matrix h (issue 4): a three-node cluster on this machine, quorum queues with
 * at-least-once dead-lettering. The expired queue is led by node 2, the holding queues by
 * node 1, the consumer and the publisher talk to node 3. Node 2 is killed while 2000
 * orders expire (restarted 5 s later), then node 1 while 1000 more are held (restarted
 * 5 s later): nothing lost, so the sweep finds nothing, nothing doubled, nothing early.
 * Label `cluster`; the nodes are started and clustered by the cluster_start fixture. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PHASE1     2000 /* expire while the expired queue's leader dies */
#define PHASE2     1000 /* held while the holding queue's leader dies */
#define WAVES      8
#define KILL_AFTER 300
#define DOWN_MS    5000

static char nodes[3][64];
static int port_base;

static void url_of(int i, char *out, size_t cap) {
    snprintf(out, cap, "amqp://guest:guest@127.0.0.1:%d/%%2f", port_base + i);
}

static int pay_lo, pay_hi;

static bool every_twentieth_in_range(int i) {
    return i >= pay_lo && i < pay_hi && i % 20 == 0;
}

static long long kv(const char *text, const char *key) {
    char needle[64];
    snprintf(needle, sizeof needle, "%s=", key);
    const char *p = strstr(text, needle);
    return p ? atoll(p + strlen(needle)) : -1;
}

/* The node leading quorum queue <prefix>.<suffix>, per the management API of node 3. */
static bool leader_is(h_ctx_t *h, const char *suffix, int node) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "curl -sf --max-time 10 -u guest:guest "
             "'http://127.0.0.1:%d/api/queues/%%2f/%s.%s' >'%s'",
             port_base + 2 + 10000, h->prefix, suffix, h_path(h, "queue.json"));
    if (system(cmd) != 0) {
        return false;
    }
    char want[128];
    snprintf(want, sizeof want, "\"leader\":\"%s@localhost\"", nodes[node]);
    return h_count_lines(h, "queue.json", want) == 1;
}

static int64_t cancelled(h_ctx_t *h) {
    return h_sql_int(h, "SELECT count(*) FROM orders WHERE status='cancelled'");
}

/* Orders ord-<lo>..ord-<hi-1> with the class timeout, in waves wave_ms apart. */
static void publish_orders(h_ctx_t *h, int lo, int hi, const char *timeout, int waves,
                           int wave_ms) {
    int per = (hi - lo) / waves;
    for (int w = 0; w < waves; w++) {
        char file[48];
        snprintf(file, sizeof file, "orders-%d-%d.jsonl", lo, w);
        FILE *f = fopen(h_path(h, file), "w");
        assert_non_null(f);
        int end = w == waves - 1 ? hi : lo + (w + 1) * per;
        for (int i = lo + w * per; i < end; i++) {
            fprintf(f,
                    "{\"order_id\":\"ord-%d\",\"timeout\":\"%s\",\"holds\":[\"r-%d\"]}\n",
                    i, timeout, i);
        }
        fclose(f);
        assert_int_equal(h_lapse(h, NULL, 0, "publish", "--batch", h_path(h, file), NULL),
                         0);
        if (wave_ms > 0) {
            usleep((useconds_t)wave_ms * 1000);
        }
    }
}

static void test_cluster_leaders_killed(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "fault-h", "5s,8s", false);
    int64_t t0 = h_now_ms();

    /* Quorum queues are led by the node the declaring client is connected to: everything
     * declared through node 2, then the holding queues again through node 1. */
    url_of(1, h.amqp, sizeof h.amqp);
    assert_int_equal(h_lapse(&h, NULL, 0, "topology", "declare", NULL), 0);
    url_of(0, h.amqp, sizeof h.amqp);
    amqp_connection_state_t conn = h_amqp_open(&h);
    const char *holds[] = {"hold.5s", "hold.8s"};
    for (int k = 0; k < 2; k++) {
        char q[160];
        snprintf(q, sizeof q, "%s.%s", h.prefix, holds[k]);
        assert_non_null(amqp_queue_delete(conn, 1, amqp_cstring_bytes(q), 0, 0));
    }
    h_amqp_close(conn);
    assert_int_equal(h_lapse(&h, NULL, 0, "topology", "declare", NULL), 0);
    assert_true(leader_is(&h, "expired", 1));
    assert_true(leader_is(&h, "hold.5s", 0));
    assert_true(leader_is(&h, "hold.8s", 0));

    url_of(2, h.amqp, sizeof h.amqp);
    conn = h_amqp_open(&h);
    const char *tap = h_tap_events(&h, conn);
    h_watch_t *watch = h_watch_start(&h);
    pid_t consumer = h_spawn_consumer(&h, "consumer.log", NULL);

    /* Phase 1: the expired queue's leader dies while 2000 orders expire. */
    publish_orders(&h, 0, PHASE1, "5s", WAVES, 250);
    pay_lo = 0;
    pay_hi = PHASE1;
    size_t paid = h_pay_in_time(&h, PHASE1, every_twentieth_in_range);
    int64_t unpaid1 = PHASE1 - (int64_t)paid;
    assert_int_equal(h_wait_sql(&h, KILL_AFTER, h_ms(30000),
                                "SELECT min(count(*), %d) FROM orders"
                                " WHERE status='cancelled'",
                                KILL_AFTER),
                     KILL_AFTER);
    assert_int_equal(h_node_named(&h, "kill", nodes[1]), 0);
    int64_t at_kill1 = cancelled(&h);
    usleep(DOWN_MS * 1000);
    assert_int_equal(h_node_named(&h, "restart", nodes[1]), 0);
    fprintf(stderr, "node 2 (expired leader) killed at %lld of %lld cancelled\n",
            (long long)at_kill1, (long long)unpaid1);
    assert_true(at_kill1 < unpaid1);
    assert_int_equal(h_wait_sql(&h, unpaid1, h_ms(60000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     unpaid1);

    /* Phase 2: the holding queues' leader dies while 1000 orders are held. */
    publish_orders(&h, PHASE1, PHASE1 + PHASE2, "8s", 1, 0);
    pay_lo = PHASE1;
    pay_hi = PHASE1 + PHASE2;
    size_t paid2 = h_pay_in_time(&h, PHASE1 + PHASE2, every_twentieth_in_range);
    paid += paid2;
    int64_t unpaid = PHASE1 + PHASE2 - (int64_t)paid;
    int64_t first2 =
        h_sql_int(&h, "SELECT deadline_ms FROM orders WHERE order_id='ord-%d'", PHASE1);
    assert_int_equal(h_node_named(&h, "kill", nodes[0]), 0);
    int64_t at_kill2 = cancelled(&h);
    int64_t kill2_before_deadline = first2 - h_now_ms();
    usleep(DOWN_MS * 1000);
    assert_int_equal(h_node_named(&h, "restart", nodes[0]), 0);
    fprintf(stderr, "node 1 (holding leader) killed %lld ms before the first deadline\n",
            (long long)kill2_before_deadline);
    assert_true(at_kill2 == unpaid1);
    int64_t last = h_sql_int(&h, "SELECT max(deadline_ms) FROM orders");
    int64_t got = h_wait_sql(&h, unpaid, h_ms(60000),
                             "SELECT count(*) FROM orders WHERE status='cancelled'");
    int64_t by_consumer = got;
    long long swept = 0;
    if (got < unpaid) {
        while (h_now_ms() < last + 2100) {
            usleep(50000);
        }
        char out[1024];
        assert_int_equal(h_lapse(&h, out, sizeof out, "sweep", "--grace", "2s", NULL), 0);
        fprintf(stderr, "sweep: %s", out);
        swept = kv(out, "cancelled");
    }
    assert_int_equal(h_wait_outbox_empty(&h, h_ms(20000)), 0);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(15000)), 0);

    static const char *const logs[] = {"consumer.log", "cli.log", NULL};
    h_laws_t laws;
    h_check_laws(&h, logs, watch, &laws);
    size_t tap_total = 0;
    size_t tap_orders = h_tap_event_orders(conn, tap, &tap_total);
    h_amqp_close(conn);
    char extra[512];
    snprintf(extra, sizeof extra,
             "nodes=3 at_kill1=%lld kill2_before_deadline_ms=%lld reconnects=%zu"
             " by_consumer=%lld swept=%lld redelivered_noops=%zu tap_events=%zu"
             " tap_orders=%zu runtime_ms=%lld",
             (long long)at_kill1, (long long)kill2_before_deadline,
             h_count_lines(&h, "consumer.log", "event=reconnect"), (long long)by_consumer,
             swept, h_count_lines(&h, "consumer.log", "decision=noop_cancelled"),
             tap_total, tap_orders, (long long)(h_now_ms() - t0));
    h_print_matrix("h", &laws, extra);

    H_ASSERT_LAWS(laws);
    assert_int_equal(laws.orders, PHASE1 + PHASE2);
    assert_int_equal(laws.paid, (int64_t)paid);
    assert_int_equal(laws.cancelled, unpaid);
    assert_int_equal(laws.unpublished, 0);
    assert_int_equal(swept, 0);
    assert_int_equal(tap_orders, (size_t)unpaid);
    h_teardown(&h);
}

/* Whatever happened above, every node answers again (the cluster_stop fixture stops
 * them). */
static int ensure_nodes(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "fault-h-nodes", "5s", false);
    int rc = 0;
    for (int i = 0; i < 3; i++) {
        if (h_node_named(&h, "status", nodes[i]) != 0 &&
            h_node_named(&h, "restart", nodes[i]) != 0) {
            rc = -1;
        }
    }
    h_teardown(&h);
    return rc;
}

int main(void) {
    const char *list = getenv("LAPSE_CLUSTER_NODES");
    const char *port = getenv("LAPSE_CLUSTER_PORT");
    if (!list || !port ||
        sscanf(list, "%63[^,],%63[^,],%63s", nodes[0], nodes[1], nodes[2]) != 3) {
        fprintf(stderr, "LAPSE_CLUSTER_NODES (a,b,c) and LAPSE_CLUSTER_PORT must be set "
                        "(run through ctest -L cluster)\n");
        return 1;
    }
    port_base = atoi(port);
    setenv("LAPSE_QUEUE_TYPE", "quorum", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cluster_leaders_killed),
    };
    return cmocka_run_group_tests(tests, NULL, ensure_nodes);
}

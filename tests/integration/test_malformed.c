/* SPDX-License-Identifier: MIT
 * Test d: poison messages in the expired queue are parked verbatim with the right reason,
 * one each, while the consumer stays up and every good order around them is cancelled. */
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

#define GOOD_BEFORE 5 /* good-0 .. good-4, cancelled before any bad message is sent */
#define GOOD_MIDDLE 3 /* between the two halves of the bad messages */
#define GOOD_AFTER  4
#define GOOD        (GOOD_BEFORE + GOOD_MIDDLE + GOOD_AFTER)
#define LARGE_LEN   5000
#define PAST        "2020-01-01T00:00:00.000Z"

typedef struct bad {
    const char *what;
    const char *body; /* NULL: the LARGE_LEN body built at run time */
    size_t len;
    const char *status; /* the reason must start with "<status>: " */
    const char *detail; /* and contain this */
    int seen;
} bad_t;

#define BODY(s) s, sizeof(s) - 1

static bad_t bads[] = {
    {"not JSON", BODY("this is not json"), "ERR_MSG_JSON", "not valid JSON", 0},
    {"JSON array", BODY("[1,2,3]"), "ERR_MSG_JSON", "an array", 0},
    {"empty object", BODY("{}"), "ERR_MSG_FIELD", "missing field", 0},
    {"missing deadline",
     BODY("{\"v\":1,\"order_id\":\"bad-nodeadline\",\"created_at\":\"" PAST "\"}"),
     "ERR_MSG_FIELD", "deadline", 0},
    {"deadline as a number",
     BODY("{\"v\":1,\"order_id\":\"bad-numdeadline\",\"deadline\":1577836800000,"
          "\"created_at\":\"" PAST "\"}"),
     "ERR_MSG_FIELD", "an integer, not a string", 0},
    {"deadline not a time",
     BODY("{\"v\":1,\"order_id\":\"bad-time\",\"deadline\":\"yesterday\","
          "\"created_at\":\"" PAST "\"}"),
     "ERR_MSG_TIME", "deadline", 0},
    {"version 2",
     BODY("{\"v\":2,\"order_id\":\"bad-v2\",\"deadline\":\"" PAST
          "\",\"created_at\":\"" PAST "\"}"),
     "ERR_MSG_VERSION", "version 2", 0},
    {"order id with a space",
     BODY("{\"v\":1,\"order_id\":\"bad id\",\"deadline\":\"" PAST
          "\",\"created_at\":\"" PAST "\"}"),
     "ERR_MSG_ORDER_ID", "outside", 0},
    {"invalid UTF-8",
     BODY("{\"v\":1,\"order_id\":\"caf\xc3\x28\",\"deadline\":\"" PAST
          "\",\"created_at\":\"" PAST "\"}"),
     "ERR_MSG_UTF8", "invalid UTF-8 at offset 22", 0},
    {"NUL byte", BODY("{\"v\":1\0}"), "ERR_MSG_UTF8", "NUL byte at offset 6", 0},
    {"5000-byte body", NULL, LARGE_LEN, "ERR_MSG_TOO_LARGE", "5000", 0},
    {"empty body", "", 0, "ERR_MSG_JSON", "empty", 0},
    {"unknown order",
     BODY("{\"v\":1,\"order_id\":\"unknown-1\",\"deadline\":\"" PAST
          "\",\"created_at\":\"" PAST "\"}"),
     "unknown order", "unknown-1", 0},
};

#define N_BAD (sizeof bads / sizeof bads[0])

static char large[LARGE_LEN];

/* An otherwise valid message for an unknown id, padded to LARGE_LEN bytes: the size
 * check must come first. */
static void build_large(void) {
    const char *head = "{\"v\":1,\"order_id\":\"bad-large\",\"deadline\":\"" PAST
                       "\",\"created_at\":\"" PAST "\",\"pad\":\"";
    size_t head_len = strlen(head);
    memset(large, 'x', sizeof large);
    memcpy(large, head, head_len);
    large[LARGE_LEN - 2] = '"';
    large[LARGE_LEN - 1] = '}';
    for (size_t i = 0; i < N_BAD; i++) {
        if (bads[i].body == NULL) {
            bads[i].body = large;
        }
    }
}

static void publish_good(h_ctx_t *h, int i) {
    char id[32];
    snprintf(id, sizeof id, "good-%d", i);
    assert_int_equal(h_lapse(h, NULL, 0, "publish", id, "--timeout", "2s", NULL), 0);
}

static void publish_bad(h_ctx_t *h, amqp_connection_state_t conn, size_t k) {
    char exchange[128], mid[32];
    snprintf(exchange, sizeof exchange, "%s.expired", h->prefix);
    snprintf(mid, sizeof mid, "mal-%zu", k);
    h_publish_raw(conn, exchange, "order.expired", bads[k].body, bads[k].len, mid);
}

static void on_parked(void *opaque, const h_msg_t *m) {
    size_t *stray = opaque;
    size_t k;
    if (sscanf(m->message_id, "mal-%zu", &k) != 1 || k >= N_BAD) {
        fprintf(stderr, "parked message with unexpected message_id '%s'\n",
                m->message_id);
        ++*stray;
        return;
    }
    bad_t *b = &bads[k];
    b->seen++;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s: ", b->status);
    if (strncmp(m->reason, prefix, strlen(prefix)) != 0 ||
        !strstr(m->reason, b->detail)) {
        fprintf(stderr, "%s: reason '%s', want '%s...%s'\n", b->what, m->reason, prefix,
                b->detail);
        ++*stray;
    }
    if (m->len != b->len || memcmp(m->body, b->body, b->len) != 0) {
        fprintf(stderr, "%s: parked body differs (%zu bytes, sent %zu)\n", b->what,
                m->len, b->len);
        ++*stray;
    }
}

static void test_poison_parked_verbatim_consumer_survives(void **state) {
    (void)state;
    build_large();
    h_ctx_t h;
    h_setup(&h, "malformed", "2s", true);
    pid_t consumer = h_spawn_consumer(&h, "consumer.log", NULL);
    h_wait_lines(&h, "consumer.log", "event=consuming", 1, h_ms(10000));
    assert_int_equal(h_count_lines(&h, "consumer.log", "event=consuming"), 1);

    /* Good orders first, cancelled before the poison arrives: the consumer's batch slots
     * have held real orders by then. */
    int good = 0;
    for (; good < GOOD_BEFORE; good++) {
        publish_good(&h, good);
    }
    assert_int_equal(h_wait_sql(&h, GOOD_BEFORE, h_ms(15000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     GOOD_BEFORE);

    amqp_connection_state_t conn = h_amqp_open(&h);
    for (size_t k = 0; k < N_BAD / 2; k++) {
        publish_bad(&h, conn, k);
    }
    for (int end = good + GOOD_MIDDLE; good < end; good++) {
        publish_good(&h, good);
    }
    for (size_t k = N_BAD / 2; k < N_BAD; k++) {
        publish_bad(&h, conn, k);
    }
    for (int end = good + GOOD_AFTER; good < end; good++) {
        publish_good(&h, good);
    }

    assert_int_equal(h_wait_sql(&h, GOOD, h_ms(20000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     GOOD);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders"), GOOD);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='cancelled' "
                                   "AND cancelled_at_ms < deadline_ms"),
                     0);
    assert_int_equal(h_sql_int(&h, "SELECT count(DISTINCT order_id) FROM events"), GOOD);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM events"), GOOD);
    h_wait_lines(&h, "consumer.log", "decision=parked", N_BAD, h_ms(10000));
    assert_true(h_alive(consumer));

    /* Every bad message was parked (not requeued, not dropped): the expired queue is
     * empty and the parked queue holds one verbatim copy of each. */
    char queue[128];
    snprintf(queue, sizeof queue, "%s.expired", h.prefix);
    assert_int_equal(h_queue_depth(conn, queue), 0);
    snprintf(queue, sizeof queue, "%s.parked", h.prefix);
    size_t stray = 0;
    size_t parked = h_drain(conn, queue, h_ms(500), on_parked, &stray);
    h_amqp_close(conn);
    for (size_t k = 0; k < N_BAD; k++) {
        if (bads[k].seen != 1) {
            fprintf(stderr, "%s: parked %d times\n", bads[k].what, bads[k].seen);
        }
        assert_int_equal(bads[k].seen, 1);
    }
    assert_int_equal(stray, 0);
    assert_int_equal(parked, N_BAD);

    assert_true(h_alive(consumer));
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);

    /* One decision line per message, each naming the right order (or none). */
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=parked"), N_BAD);
    assert_int_equal(h_count_lines(&h, "consumer.log", "order_id=- decision=parked"),
                     N_BAD - 1);
    assert_int_equal(h_count_lines(&h, "consumer.log",
                                   "order_id=unknown-1 decision=parked reason=\""
                                   "unknown order: unknown-1\""),
                     1);
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=cancelled"), GOOD);
    for (size_t k = 0; k < N_BAD; k++) {
        size_t same = 0;
        for (size_t j = 0; j < N_BAD; j++) {
            same += strcmp(bads[j].status, bads[k].status) == 0;
        }
        char needle[96];
        snprintf(needle, sizeof needle, "decision=parked reason=\"%s: ", bads[k].status);
        assert_int_equal(h_count_lines(&h, "consumer.log", needle), same);
    }
    assert_int_equal(h_count_lines(&h, "consumer.log", "event=reconnect"), 0);
    assert_int_equal(h_count_lines(&h, "consumer.log", "event=stopped"), 1);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_poison_parked_verbatim_consumer_survives),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

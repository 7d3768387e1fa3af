/* SPDX-License-Identifier: MIT
 * Readable in the UI: an expiry message carries x-lapse-deadline, the stored deadline in
 * RFC 3339 UTC, beside x-lapse-deadline-ms; so does a message the consumer sends back to
 * wait (early). Read back from the queues themselves with basic.get. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <lapse/message.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct found {
    const char *order_id;
    h_msg_t msg; /* a copy of the strings that matter; body not kept */
    int count;
} found_t;

static void keep(void *opaque, const h_msg_t *m) {
    found_t *f = opaque;
    if (strcmp(m->message_id, f->order_id) == 0) {
        f->msg = *m;
        f->msg.body = NULL;
        f->count++;
    }
}

/* The stored deadline of order_id, and its RFC 3339 spelling into text. */
static int64_t stored_deadline(h_ctx_t *h, const char *order_id,
                               char text[LAPSE_RFC3339_LEN]) {
    int64_t ms =
        h_sql_int(h, "SELECT deadline_ms FROM orders WHERE order_id='%s'", order_id);
    assert_true(ms > 0);
    lapse_time_format_rfc3339(ms, text);
    return ms;
}

static void assert_deadline_headers(h_ctx_t *h, const found_t *f) {
    char want[LAPSE_RFC3339_LEN];
    int64_t ms = stored_deadline(h, f->order_id, want);
    printf("%s: x-lapse-deadline=%s x-lapse-deadline-ms=%lld (stored %lld)\n",
           f->order_id, f->msg.deadline, (long long)f->msg.deadline_ms, (long long)ms);
    assert_int_equal(f->count, 1);
    assert_string_equal(f->msg.deadline, want);
    assert_int_equal(f->msg.deadline_ms, ms);
    /* And it parses back to the same instant. */
    int64_t parsed = 0;
    assert_int_equal(lapse_time_parse_rfc3339(f->msg.deadline, &parsed), LAPSE_OK);
    assert_int_equal(parsed, ms);
}

/* Look for order_id in the ladder's rungs and the expired queue (a message may be between
 * two rungs for a moment: looked for again until found). */
static void find_on_ladder(h_ctx_t *h, amqp_connection_state_t conn, found_t *f) {
    char q[160];
    for (int round = 0; round < 20 && f->count == 0; round++) {
        for (int k = 0; k < 28; k++) {
            snprintf(q, sizeof q, "%s.delay.%02d", h->prefix, k);
            if (h_queue_depth(conn, q) > 0) {
                h_drain(conn, q, 0, keep, f);
            }
        }
        snprintf(q, sizeof q, "%s.expired", h->prefix);
        h_drain(conn, q, 0, keep, f);
        if (f->count == 0) {
            usleep(100000);
        }
    }
}

static void test_held_messages_carry_a_readable_deadline(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "dl-header", "30m", true);
    amqp_connection_state_t conn = h_amqp_open(&h);

    /* A class's holding queue. */
    assert_int_equal(h_lapse(&h, NULL, 0, "publish", "held", "--timeout", "30m", NULL),
                     0);
    char q[160];
    snprintf(q, sizeof q, "%s.hold.30m", h.prefix);
    found_t held = {.order_id = "held"};
    h_drain(conn, q, 200, keep, &held);
    assert_deadline_headers(&h, &held);
    assert_string_equal(held.msg.type, LAPSE_MSG_TYPE);

    /* The delay ladder (no class of 45 s): the rung it starts on. */
    assert_int_equal(
        h_lapse(&h, NULL, 0, "publish", "laddered", "--timeout", "45s", NULL), 0);
    found_t laddered = {.order_id = "laddered"};
    find_on_ladder(&h, conn, &laddered);
    assert_deadline_headers(&h, &laddered);

    /* Sent back to wait: a consumer whose clock is a minute behind sees the order early
     * and publishes it down the ladder for the rest of its window. */
    assert_int_equal(h_lapse(&h, NULL, 0, "publish", "early", "--timeout", "2s", NULL),
                     0);
    if (!h_faketime_available()) {
        h_amqp_close(conn);
        h_teardown(&h); /* the sanitized build: why is printed above */
        skip();
    }
    pid_t consumer =
        h_spawn_env(&h, "consumer.log", (const char *const[]){"consume", NULL},
                    (const char *const[]){H_FAKETIME_ENV, "FAKETIME=-60", NULL});
    for (int waited = 0;
         h_count_lines(&h, "consumer.log", "order_id=early decision=early") < 1 &&
         waited < h_ms(20000);
         waited += 50) {
        usleep(50000);
    }
    assert_int_equal(h_count_lines(&h, "consumer.log", "order_id=early decision=early"),
                     1);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    assert_int_equal(h_sql_int(&h,
                               "SELECT count(*) FROM orders WHERE order_id='early' AND "
                               "status='pending'"),
                     1);
    found_t early = {.order_id = "early"};
    find_on_ladder(&h, conn, &early);
    assert_deadline_headers(&h, &early);

    h_amqp_close(conn);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_held_messages_carry_a_readable_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT
 * The retry path: a delivery whose cancel keeps failing in the store goes back down the
 * ladder with a growing delay, counted in x-lapse-attempts, and is parked after
 * --max-attempts with its reason and count; the orders batched with it are not held
 * back; once the cause is fixed, `lapse parked replay` completes it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A trigger that makes every update of order 'poison' fail, in each backend's dialect. */
static const char *const POISON_SQLITE =
    "CREATE TRIGGER poison BEFORE UPDATE ON orders WHEN "
    "OLD.order_id = 'poison' BEGIN SELECT RAISE(ABORT, 'poisoned row'); END";
static const char *const POISON_PG =
    "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS"
    " $$BEGIN RAISE EXCEPTION 'poisoned row'; END$$;"
    "CREATE TRIGGER poison BEFORE UPDATE ON orders FOR EACH ROW"
    " WHEN (OLD.order_id = 'poison') EXECUTE FUNCTION poison()";

static void test_failing_cancel_is_retried_then_parked(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "retry", "2s", true);
    /* Twenty orders in one batch; the store refuses to touch one of them. */
    FILE *f = fopen(h_path(&h, "orders.jsonl"), "w");
    assert_non_null(f);
    for (int i = 0; i < 20; i++) {
        fprintf(f, "{\"order_id\":\"ord-%d\",\"timeout\":\"2s\",\"holds\":[\"r-%d\"]}\n",
                i, i);
    }
    fputs("{\"order_id\":\"poison\",\"timeout\":\"2s\",\"holds\":[\"r-p\"]}\n", f);
    fclose(f);
    assert_int_equal(
        h_lapse(&h, NULL, 0, "publish", "--batch", h_path(&h, "orders.jsonl"), NULL), 0);
    h_sql_exec(&h, "%s", h.pg ? POISON_PG : POISON_SQLITE);
    pid_t consumer = h_spawn_consumer(
        &h, "consumer.log",
        (const char *const[]){"--max-attempts", "3", "--sweep-every", "0", NULL});
    /* The others are cancelled on time, not held back by the poisoned one. */
    assert_int_equal(h_wait_sql(&h, 20, h_ms(15000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     20);
    assert_int_equal(h_sql_int(&h,
                               "SELECT count(*) FROM orders WHERE status='cancelled' "
                               "AND cancelled_at_ms - deadline_ms > %d",
                               h_ms(1000)),
                     0);
    /* Attempts 1 and 2 wait 1 s and 2 s on the ladder; the third failure parks it. */
    char parked_q[160];
    snprintf(parked_q, sizeof parked_q, "%s.parked", h.prefix);
    amqp_connection_state_t conn = h_amqp_open(&h);
    for (int t = 0; t < h_ms(200) && h_queue_depth(conn, parked_q) < 1; t++) {
        usleep(100000);
    }
    assert_int_equal(h_queue_depth(conn, parked_q), 1);
    assert_int_equal(h_count_lines(&h, "consumer.log",
                                   "order_id=poison decision=retry attempt=1 of=3 "
                                   "delay_ms=1000"),
                     1);
    assert_int_equal(h_count_lines(&h, "consumer.log",
                                   "order_id=poison decision=retry attempt=2 of=3 "
                                   "delay_ms=2000"),
                     1);
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=retry"), 2);
    assert_int_equal(
        h_count_lines(&h, "consumer.log",
                      "order_id=poison decision=parked reason=\"failed 3 times"),
        1);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE order_id='poison' "
                                   "AND status='pending'"),
                     1);

    /* An operator sees why and how often. */
    char out[8192];
    assert_int_equal(h_lapse(&h, out, sizeof out, "parked", "list", "--json", NULL), 0);
    json_t *root = json_loads(out, 0, NULL);
    assert_non_null(root);
    json_t *m = json_array_get(json_object_get(root, "messages"), 0);
    assert_non_null(m);
    assert_string_equal(json_string_value(json_object_get(m, "order_id")), "poison");
    assert_int_equal(json_integer_value(json_object_get(m, "attempts")), 3);
    assert_non_null(
        strstr(json_string_value(json_object_get(m, "reason")), "poisoned row"));
    json_decref(root);

    /* Cause fixed, message replayed: cancelled once, its hold released, one event. */
    h_sql_exec(&h, "%s", h.pg ? "DROP TRIGGER poison ON orders" : "DROP TRIGGER poison");
    assert_int_equal(h_lapse(&h, NULL, 0, "parked", "replay", "poison", NULL), 0);
    assert_int_equal(h_wait_sql(&h, 1, h_ms(15000),
                                "SELECT count(*) FROM orders WHERE order_id='poison' AND "
                                "status='cancelled'"),
                     1);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    assert_int_equal(h_queue_depth(conn, parked_q), 0);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM events"), 21);
    assert_int_equal(
        h_sql_int(&h, "SELECT count(*) FROM holds WHERE released_at_ms IS NULL"), 0);
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=cancelled"), 21);
    h_amqp_close(conn);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failing_cancel_is_retried_then_parked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

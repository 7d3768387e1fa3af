/* SPDX-License-Identifier: MIT
 * Issue 10, bounded memory: 16 MiB bodies in <prefix>.expired are parked with a reason
 * and their first 16384 bytes, never held whole (the consumer reads and drops the rest
 * frame by frame), while good orders beside them are cancelled once and never early. The
 * consumer's peak RSS (VmHWM) stays far below one such body. */
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

#define GOOD     20
#define BIG      6
#define BIG_SIZE (16u << 20)
/* A consumer holding one body whole would pass 16 MiB; one batch of them, 96 MiB. The
 * normal build peaks at about 7 MB; holding whole bodies, 39 MB. */
#define HWM_BOUND_KB (24 * 1024)

typedef struct parked {
    size_t n;
    size_t with_reason;
    size_t cut_to_keep;
} parked_t;

static void on_parked(void *opaque, const h_msg_t *m) {
    parked_t *p = opaque;
    p->n++;
    char want[96];
    snprintf(want, sizeof want, "ERR_MSG_TOO_LARGE: body is %u bytes, more than 4096",
             BIG_SIZE);
    p->with_reason += strstr(m->reason, want) != NULL;
    p->cut_to_keep += m->len == 16384 && m->body[0] == 'x' && m->body[16383] == 'x';
}

static void test_big_bodies_parked_without_being_held(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "bodies", "3s", true);
    for (int i = 0; i < GOOD; i++) {
        char id[32];
        snprintf(id, sizeof id, "ord-%d", i);
        assert_int_equal(h_lapse(&h, NULL, 0, "publish", id, "--timeout", "3s", NULL), 0);
    }
    amqp_connection_state_t conn = h_amqp_open(&h);
    char *big = malloc(BIG_SIZE);
    assert_non_null(big);
    memset(big, 'x', BIG_SIZE);
    char exchange[128];
    snprintf(exchange, sizeof exchange, "%s.expired", h.prefix);
    for (int i = 0; i < BIG; i++) {
        char id[32];
        snprintf(id, sizeof id, "big-%d", i);
        h_publish_raw(conn, exchange, "order.expired", big, BIG_SIZE, id);
    }
    free(big);

    /* Under ASan, freed memory waits in a quarantine (up to 256 MB) and counts in the
     * RSS: SQLite's batch statements free about 90 KB each (an ephemeral table's page
     * cache), which took an ASan consumer from 21 to 39 MB with no memory of lapse's
     * own held. A 1 MB quarantine measures lapse, not the sanitizer (20 MB); one body
     * held whole would still add 16 MB. The normal build ignores the variable. */
    const char *asan = getenv("ASAN_OPTIONS");
    char small_quarantine[512];
    snprintf(small_quarantine, sizeof small_quarantine, "%s%squarantine_size_mb=1",
             asan != NULL ? asan : "", asan != NULL && asan[0] != '\0' ? ":" : "");
    setenv("ASAN_OPTIONS", small_quarantine, 1);
    h_watch_t *watch = h_watch_start(&h);
    pid_t consumer = h_spawn_consumer(&h, "consumer.log", NULL);
    char parked_queue[128];
    snprintf(parked_queue, sizeof parked_queue, "%s.parked", h.prefix);
    assert_int_equal(h_wait_sql(&h, GOOD, h_ms(60000),
                                "SELECT COUNT(*) FROM orders WHERE status='cancelled'"),
                     GOOD);
    for (int waited = 0; h_queue_depth(conn, parked_queue) < BIG && waited < h_ms(60000);
         waited += 100) {
        usleep(100 * 1000);
    }
    long hwm = h_status_kb(consumer, "VmHWM");
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(15000)), 0);

    parked_t p = {0};
    h_drain(conn, parked_queue, 500, on_parked, &p);
    printf("bodies: %d bodies of %u bytes parked=%zu with_reason=%zu cut_to_keep=%zu "
           "consumer_hwm_kb=%ld (bound %d)\n",
           BIG, BIG_SIZE, p.n, p.with_reason, p.cut_to_keep, hwm, HWM_BOUND_KB);
    assert_int_equal(p.n, BIG);
    assert_int_equal(p.with_reason, BIG);
    assert_int_equal(p.cut_to_keep, BIG);
    assert_true(hwm > 0);
    assert_true(hwm < HWM_BOUND_KB);

    const char *logs[] = {"consumer.log", NULL};
    h_laws_t laws;
    h_check_laws(&h, logs, watch, &laws);
    h_print_matrix("bodies", &laws, NULL);
    H_ASSERT_LAWS(laws);
    h_amqp_close(conn);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_big_bodies_parked_without_being_held),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

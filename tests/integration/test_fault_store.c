/* SPDX-License-Identifier: MIT
 * Fault matrix c (issue 4): the SQLite file locked by another process (BEGIN EXCLUSIVE
 * held by a child) while orders expire. Nothing is acked before its commit, so every
 * order is cancelled once the lock goes: none twice, none early, none before the lock
 * went, paid ones never. With a 10 s lock the consumer's in-process store retries ride
 * it out (event=store_retry); with a 14 s lock they are exhausted and the deliveries take
 * the retry path down the ladder (decision=retry, x-lapse-attempts), still losing and
 * doubling nothing. SIGTERM ends the consumer cleanly within 10 s while the lock holds,
 * whether it was consuming or still opening the file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define ORDERS 300

static bool every_twentieth(int i) {
    return i % 20 == 0;
}

/* Another process (the sqlite3 shell) takes the write lock, says so on the pipe, holds
 * it hold_ms and exits. It is exec'd at once: this test runs a watcher thread, and a
 * forked child that used SQLite or malloc could deadlock on a lock that thread held
 * (it did, under ASan). Everything the child needs is prepared before the fork. */
static pid_t lock_store(h_ctx_t *h, int hold_ms) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    char sleep_cmd[64];
    snprintf(sleep_cmd, sizeof sleep_cmd, ".shell sleep %d.%03d", hold_ms / 1000,
             hold_ms % 1000);
    /* -bail: if the lock cannot be taken, nothing is said; ".shell echo" says it at
     * once (the shell's own output to a pipe would wait in its buffer). */
    const char *argv[] = {"sqlite3",
                          "-bail",
                          "-cmd",
                          ".timeout 10000",
                          h->db_path,
                          "BEGIN EXCLUSIVE;",
                          ".shell echo locked",
                          sleep_cmd,
                          "ROLLBACK;",
                          NULL};
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDOUT_FILENO);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    char said[8] = "";
    assert_true(read(fds[0], said, 6) == 6);
    close(fds[0]);
    assert_memory_equal(said, "locked", 6);
    return pid;
}

static void run(const char *row, const char *name, int lock_ms, bool want_retry_path) {
    h_ctx_t h;
    h_setup(&h, name, "2s", true);
    int64_t t0 = h_now_ms();
    amqp_connection_state_t conn = h_amqp_open(&h);
    const char *tap = h_tap_events(&h, conn);
    h_watch_t *watch = h_watch_start(&h);
    pid_t consumer = h_spawn_consumer(&h, "consumer.log", NULL);
    /* Consuming before the lock: a consumer still opening the store when it is taken
     * waits in its open, not in a cancel, and logs no store_retry (a loaded CI machine
     * once took 11 s to get here, and row c failed on store_retry_lines=0). */
    assert_int_equal(h_wait_lines(&h, "consumer.log", "event=consuming", 1, h_ms(15000)),
                     1);

    FILE *f = fopen(h_path(&h, "orders.jsonl"), "w");
    assert_non_null(f);
    for (int i = 0; i < ORDERS; i++) {
        fprintf(f, "{\"order_id\":\"ord-%d\",\"timeout\":\"2s\",\"holds\":[\"r-%d\"]}\n",
                i, i);
    }
    fclose(f);
    assert_int_equal(
        h_lapse(&h, NULL, 0, "publish", "--batch", h_path(&h, "orders.jsonl"), NULL), 0);
    size_t paid = h_pay_in_time(&h, ORDERS, every_twentieth);
    assert_int_equal(paid, ORDERS / 20);
    const int64_t unpaid = ORDERS - (int64_t)paid;

    /* Locked before the first deadline, held well past the last one. */
    pid_t locker = lock_store(&h, lock_ms);
    int64_t t_lock = h_now_ms();
    int64_t first = h_sql_int(&h, "SELECT min(deadline_ms) FROM orders");
    int64_t last = h_sql_int(&h, "SELECT max(deadline_ms) FROM orders");
    assert_true(t_lock < first);
    assert_true(h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='cancelled'") ==
                0);
    /* Nothing is cancelled while the lock holds. Asked half a second before it ends
     * (WAL lets this reader in), not after: once the locker is gone, the consumer's
     * busy wait may commit before this process is scheduled again. */
    int64_t check_at = t_lock + lock_ms - 500;
    if (h_now_ms() < check_at) {
        usleep((useconds_t)(check_at - h_now_ms()) * 1000);
    }
    assert_int_equal(
        h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='cancelled'"), 0);
    assert_int_equal(h_stop(locker, 0, lock_ms + h_ms(10000)), 0);
    int64_t t_unlock = h_now_ms();
    fprintf(stderr, "store locked %lld ms, deadlines %lld..%lld ms into it\n",
            (long long)(t_unlock - t_lock), (long long)(first - t_lock),
            (long long)(last - t_lock));

    assert_int_equal(h_wait_sql(&h, unpaid, h_ms(40000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     unpaid);
    int64_t t_done = h_now_ms();
    assert_int_equal(h_wait_outbox_empty(&h, h_ms(15000)), 0);
    assert_true(h_alive(consumer));
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);

    static const char *const logs[] = {"consumer.log", NULL};
    h_laws_t laws;
    h_check_laws(&h, logs, watch, &laws);
    /* Nothing was visible before the lock went (checked above); cancelled_at_ms is the
     * consumer's time when it took up the batch, before it waited for the store, so it
     * may predate the commit: reported, not a law. */
    int64_t stamped_before_unlock =
        h_sql_int(&h,
                  "SELECT count(*) FROM orders WHERE status='cancelled'"
                  " AND cancelled_at_ms < %lld",
                  (long long)t_unlock - 100);
    int64_t observed_lag = t_done - first;
    size_t store_retries = h_count_lines(&h, "consumer.log", "event=store_retry");
    size_t retry_path = h_count_lines(&h, "consumer.log", "decision=retry ");
    size_t parked = h_count_lines(&h, "consumer.log", "decision=parked");
    size_t tap_total = 0;
    size_t tap_orders = h_tap_event_orders(conn, tap, &tap_total);
    h_amqp_close(conn);
    char extra[384];
    snprintf(extra, sizeof extra,
             "lock_ms=%lld store_retry_lines=%zu retry_path=%zu parked=%zu"
             " stamped_before_unlock=%lld observed_max_lag_ms<=%lld"
             " drain_after_unlock_ms=%lld tap_events=%zu"
             " tap_orders=%zu runtime_ms=%lld",
             (long long)(t_unlock - t_lock), store_retries, retry_path, parked,
             (long long)stamped_before_unlock, (long long)observed_lag,
             (long long)(t_done - t_unlock), tap_total, tap_orders,
             (long long)(h_now_ms() - t0));
    h_print_matrix(row, &laws, extra);

    H_ASSERT_LAWS(laws);
    assert_int_equal(laws.orders, ORDERS);
    assert_int_equal(laws.paid, (int64_t)paid);
    assert_int_equal(laws.cancelled, unpaid);
    assert_int_equal(laws.unpublished, 0);
    assert_true(store_retries >= 1);
    assert_int_equal(parked, 0);
    if (want_retry_path) {
        assert_true(retry_path >= 1);
    }
    assert_int_equal(tap_orders, (size_t)unpaid);
    h_teardown(&h);
}

/* Two in-process tries of 5 s busy wait each outlast a 10 s lock. */
static void test_store_locked_10s(void **state) {
    (void)state;
    run("c", "fault-c", 10000, false);
}

/* A 14 s lock outlasts them: the retry path, with growing delay, carries the orders. */
static void test_store_locked_past_the_in_process_retries(void **state) {
    (void)state;
    run("c-retry", "fault-c2", 14000, true);
}

/* Issue 10: SIGTERM is honoured within 10 s in every wait of the consumer, here a store
 * locked for longer than any retry loop (issue 10 asks for a 120 s lock and SIGTERM at
 * 60 s; 40 s and 20 s show the same: by 20 s every retry loop has run several times).
 * Orders fall due during the lock (deliveries wait on the store) and the sweep runs
 * every second (its walk and cancels wait on the store). */
static void test_sigterm_while_the_store_is_locked(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "fault-c-term", "2s", true);
    pid_t consumer = h_spawn_consumer(
        &h, "consumer.log",
        (const char *const[]){"--sweep-every", "1s", "--grace", "1s", NULL});
    FILE *f = fopen(h_path(&h, "orders.jsonl"), "w");
    assert_non_null(f);
    for (int i = 0; i < 50; i++) {
        fprintf(f, "{\"order_id\":\"ord-%d\",\"timeout\":\"2s\"}\n", i);
    }
    fclose(f);
    assert_int_equal(
        h_lapse(&h, NULL, 0, "publish", "--batch", h_path(&h, "orders.jsonl"), NULL), 0);
    /* The consumer is running before the lock: one that is still opening the file
     * when the lock comes waits in its open instead (20 tries of a 5 s busy wait),
     * test_sigterm_while_opening_a_locked_store's case. */
    for (int64_t until = h_now_ms() + h_ms(20000);
         h_count_lines(&h, "consumer.log", "event=consuming") == 0 &&
         h_now_ms() < until;) {
        usleep(50000);
    }
    assert_true(h_count_lines(&h, "consumer.log", "event=consuming") >= 1);
    pid_t locker = lock_store(&h, 40000);
    int64_t t_lock = h_now_ms();
    usleep((useconds_t)(20000 - (h_now_ms() - t_lock)) * 1000);
    assert_true(h_alive(consumer));
    int64_t t_term = h_now_ms();
    int code = h_stop(consumer, SIGTERM, 10000);
    int64_t took = h_now_ms() - t_term;
    fprintf(stderr, "SIGTERM %lld ms into a 40 s lock: exit %d after %lld ms\n",
            (long long)(t_term - t_lock), code, (long long)took);
    assert_int_equal(code, 0);
    assert_true(took < 10000);
    assert_true(h_count_lines(&h, "consumer.log", "event=store_retry") >= 1);
    /* Nothing was cancelled: the store never answered. */
    assert_int_equal(
        h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='cancelled'"), 0);
    kill(locker, SIGTERM);
    h_stop(locker, 0, h_ms(45000));
    h_teardown(&h);
}

/* SIGTERM while the consumer is still opening a store another process holds locked: the
 * open (20 tries of a 5 s busy wait, about 100 s) ends at the stop flag, within one busy
 * wait and one backoff, and the consumer stops cleanly, having touched nothing. */
static void test_sigterm_while_opening_a_locked_store(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "fault-c-open", "2s", true);
    assert_int_equal(h_lapse(&h, NULL, 0, "publish", "ord-0", "--timeout", "2s", NULL),
                     0);
    pid_t locker = lock_store(&h, 60000);
    pid_t consumer = h_spawn_consumer(&h, "consumer.log", NULL);
    usleep(3000 * 1000);
    assert_true(h_alive(consumer));
    int64_t t_term = h_now_ms();
    int code = h_stop(consumer, SIGTERM, 10000);
    int64_t took = h_now_ms() - t_term;
    fprintf(stderr, "SIGTERM 3 s into opening a locked store: exit %d after %lld ms\n",
            code, (long long)took);
    assert_int_equal(code, 0);
    assert_true(took < 8000);
    assert_int_equal(h_count_lines(&h, "consumer.log", "event=consuming"), 0);
    kill(locker, SIGTERM);
    h_stop(locker, 0, h_ms(65000));
    /* Its order untouched: still pending, its message still held. */
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='pending'"),
                     1);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_locked_10s),
        cmocka_unit_test(test_store_locked_past_the_in_process_retries),
        cmocka_unit_test(test_sigterm_while_the_store_is_locked),
        cmocka_unit_test(test_sigterm_while_opening_a_locked_store),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

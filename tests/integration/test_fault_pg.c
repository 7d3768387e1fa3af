/* SPDX-License-Identifier: MIT
 * PostgreSQL faults (issue 11), each checked with the four laws: the server stopped with
 * -m immediate mid-flow and started again; lapse's backends terminated mid-batch; one
 * order's row held by another transaction for 30 s; three consumers with a sweep every
 * second, one of them SIGKILLed; and consumers and a publisher whose wall clocks are
 * wrong by five minutes, which cannot make anything early because the server's clock
 * decides. No queue is bound to the events exchange here: the events stay in the outbox,
 * where the laws count them. Runs only against the private PostgreSQL cluster
 * (LAPSE_TEST_STORE=postgresql, LAPSE_PG_NODE_SCRIPT and LAPSE_TEST_PG_NODE name it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"
#include "store_pg_sql.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The cluster script on the test's cluster: restart-immediate, status, ... */
static int pg_node(h_ctx_t *h, const char *cmd) {
    const char *script = getenv("LAPSE_PG_NODE_SCRIPT");
    const char *name = getenv("LAPSE_TEST_PG_NODE");
    assert_non_null(script);
    assert_non_null(name);
    char line[1024];
    snprintf(line, sizeof line, "'%s' %s '%s' >>'%s' 2>&1", script, cmd, name,
             h_path(h, "pg-node.log"));
    int rc = system(line);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* psql on the test's database, in the background; returns its pid. */
static pid_t psql_spawn(h_ctx_t *h, const char *sql, const char *log) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        FILE *out = freopen(h_path(h, log), "a", stdout);
        (void)out;
        dup2(STDOUT_FILENO, STDERR_FILENO);
        execlp("psql", "psql", h->store, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql,
               (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* ord-<first> .. ord-<first+n-1>, the timeouts taken in turn. */
static void write_orders_from(h_ctx_t *h, const char *file, int first, int n,
                              const char *const *timeouts, size_t n_timeouts) {
    FILE *f = fopen(h_path(h, file), "w");
    assert_non_null(f);
    for (int i = first; i < first + n; i++) {
        fprintf(f, "{\"order_id\":\"ord-%d\",\"timeout\":\"%s\",\"holds\":[\"r-%d\"]}\n",
                i, timeouts[(size_t)i % n_timeouts], i);
    }
    fclose(f);
}

static void write_orders(h_ctx_t *h, const char *file, int n, const char *const *timeouts,
                         size_t n_timeouts) {
    write_orders_from(h, file, 0, n, timeouts, n_timeouts);
}

static bool every_fourth(int i) {
    return i % 4 == 0;
}

static int64_t cancelled(h_ctx_t *h) {
    return h_sql_int(h, "SELECT count(*) FROM orders WHERE status='cancelled'");
}

/* Publish n orders, pay every fourth in time, start one consumer with small batches. */
static pid_t start_flow(h_ctx_t *h, int n, size_t *paid, const char *log) {
    static const char *const timeouts[] = {"2s", "3s", "4s", "5s"};
    write_orders(h, "orders.jsonl", n, timeouts, 4);
    assert_int_equal(
        h_lapse(h, NULL, 0, "publish", "--batch", h_path(h, "orders.jsonl"), NULL), 0);
    *paid = h_pay_in_time(h, n, every_fourth);
    static const char *const extra[] = {"--prefetch", "20", NULL};
    return h_spawn_consumer(h, log, extra);
}

static void finish_flow(h_ctx_t *h, pid_t consumer, int n, size_t paid,
                        const char *const *logs, const char *row, const char *extra) {
    int64_t unpaid = n - (int64_t)paid;
    assert_int_equal(h_wait_sql(h, unpaid, h_ms(60000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     unpaid);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(15000)), 0);
    h_laws_t laws;
    h_check_laws(h, logs, NULL, &laws);
    h_print_matrix(row, &laws, extra);
    H_ASSERT_LAWS(laws);
    assert_int_equal(laws.orders, n);
    assert_int_equal(laws.paid, (int64_t)paid);
    assert_int_equal(laws.cancelled, unpaid);
}

static size_t store_failures(h_ctx_t *h, const char *log) {
    return h_count_lines(h, log, "ERR_STORE_BUSY") + h_count_lines(h, log, "store_retry");
}

static void test_server_stopped_immediately_mid_flow(void **state) {
    (void)state;
    H_SKIP_UNLESS_PG("PostgreSQL faults");
    h_ctx_t h;
    h_setup(&h, "pg-restart", "2s,3s,4s,5s", true);
    const int n = 400;
    size_t paid = 0;
    pid_t consumer = start_flow(&h, n, &paid, "consumer.log");
    /* Mid-flow: the first cancellations are in, most are not. */
    assert_true(h_wait_sql(&h, 1, h_ms(20000),
                           "SELECT count(*) > 0 FROM orders WHERE status='cancelled'") ==
                1);
    int64_t before = cancelled(&h);
    int64_t t = h_now_ms();
    assert_int_equal(pg_node(&h, "restart-immediate"), 0);
    char extra[160];
    snprintf(extra, sizeof extra, "cancelled_before_restart=%lld restart_ms=%lld",
             (long long)before, (long long)(h_now_ms() - t));
    assert_true(before < n - (int64_t)paid);
    static const char *const logs[] = {"consumer.log", NULL};
    finish_flow(&h, consumer, n, paid, logs, "pg-restart", extra);
    fprintf(stderr, "store failures seen by the consumer: %zu\n",
            store_failures(&h, "consumer.log"));
    h_teardown(&h);
}

static void test_backends_terminated_mid_batch(void **state) {
    (void)state;
    H_SKIP_UNLESS_PG("PostgreSQL faults");
    h_ctx_t h;
    h_setup(&h, "pg-terminate", "2s,3s,4s,5s", true);
    const int n = 400;
    size_t paid = 0;
    pid_t consumer = start_flow(&h, n, &paid, "consumer.log");
    int64_t killed = 0;
    /* lapse's sessions name themselves "lapse" (fallback_application_name). */
    for (int64_t until = h_now_ms() + h_ms(6000); h_now_ms() < until;) {
        killed +=
            h_sql_int(&h, "SELECT count(pg_terminate_backend(pid))"
                          " FROM pg_stat_activity WHERE application_name = 'lapse'");
        usleep(150000);
    }
    char extra[96];
    snprintf(extra, sizeof extra, "backends_terminated=%lld", (long long)killed);
    assert_true(killed > 0);
    static const char *const logs[] = {"consumer.log", NULL};
    finish_flow(&h, consumer, n, paid, logs, "pg-terminate", extra);
    h_teardown(&h);
}

/* Another transaction holds ord-0's row for 30 s: the other orders are cancelled on time,
 * ord-0 alone waits (retry path) and is cancelled once the lock is gone. */
static void test_row_locked_for_30s_holds_up_only_its_order(void **state) {
    (void)state;
    H_SKIP_UNLESS_PG("PostgreSQL faults");
    h_ctx_t h;
    h_setup(&h, "pg-rowlock", "3s", true);
    const int n = 40;
    static const char *const timeouts[] = {"3s"};
    write_orders(&h, "orders.jsonl", n, timeouts, 1);
    assert_int_equal(
        h_lapse(&h, NULL, 0, "publish", "--batch", h_path(&h, "orders.jsonl"), NULL), 0);
    /* The advisory lock says the row lock is held (it is taken after it). */
    pid_t locker = psql_spawn(&h,
                              "BEGIN; SELECT 1 FROM lapse.orders WHERE order_id = 'ord-0'"
                              " FOR UPDATE; SELECT pg_advisory_lock(424242);"
                              " SELECT pg_sleep(30); COMMIT;",
                              "locker.log");
    assert_int_equal(
        h_wait_sql(&h, 1, h_ms(10000),
                   "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                   " AND objid = 424242 AND granted"),
        1);
    int64_t locked_at = h_now_ms();
    pid_t consumer = h_spawn_consumer(&h, "consumer.log", NULL);
    assert_int_equal(h_wait_sql(&h, n - 1, h_ms(20000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     n - 1);
    int64_t others_done = h_now_ms();
    /* Everything else went while the lock still held, and promptly. */
    assert_true(others_done < locked_at + 25000);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE order_id = 'ord-0'"
                                   " AND status = 'pending'"),
                     1);
    int64_t others_lag = h_sql_int(&h, "SELECT max(cancelled_at_ms - deadline_ms)"
                                       " FROM orders WHERE order_id <> 'ord-0'");
    assert_true(others_lag < 5000);
    assert_int_equal(h_wait_sql(&h, n, h_ms(90000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     n);
    int64_t held_ms = h_sql_int(&h, "SELECT cancelled_at_ms FROM orders"
                                    " WHERE order_id = 'ord-0'") -
                      locked_at;
    assert_true(held_ms >= 29000);
    assert_true(h_count_lines(&h, "consumer.log", "locked by another transaction") >= 1);
    int status = 0;
    assert_int_equal(waitpid(locker, &status, 0), locker);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(15000)), 0);
    static const char *const logs[] = {"consumer.log", NULL};
    h_laws_t laws;
    h_check_laws(&h, logs, NULL, &laws);
    char extra[160];
    snprintf(extra, sizeof extra, "others_lag_ms=%lld locked_order_after_ms=%lld",
             (long long)others_lag, (long long)held_ms);
    h_print_matrix("pg-rowlock", &laws, extra);
    H_ASSERT_LAWS(laws);
    assert_int_equal(laws.cancelled, n);
    h_teardown(&h);
}

/* Three consumers, each sweeping every second with a 1 s grace (so sweeps race the
 * consumers and each other for the same orders), one SIGKILLed mid-flow. */
static void test_three_sweeping_consumers_one_killed(void **state) {
    (void)state;
    H_SKIP_UNLESS_PG("PostgreSQL faults");
    h_ctx_t h;
    h_setup(&h, "pg-three", "2s,3s,4s,5s", true);
    const int n = 600;
    static const char *const timeouts[] = {"2s", "3s", "4s", "5s"};
    write_orders(&h, "orders.jsonl", n, timeouts, 4);
    static const char *const extra[] = {"--prefetch",  "20",      "--sweep-every",
                                        "1s",          "--grace", "1s",
                                        "--in-flight", "1s",      NULL};
    const char *logs[] = {"consumer-0.log", "consumer-1.log", "consumer-2.log", NULL};
    pid_t consumers[3];
    for (int c = 0; c < 3; c++) {
        consumers[c] = h_spawn_consumer(&h, logs[c], extra);
    }
    assert_int_equal(
        h_lapse(&h, NULL, 0, "publish", "--batch", h_path(&h, "orders.jsonl"), NULL), 0);
    size_t paid = h_pay_in_time(&h, n, every_fourth);
    assert_true(h_wait_sql(&h, 1, h_ms(20000),
                           "SELECT count(*) > 0 FROM orders WHERE status='cancelled'") ==
                1);
    assert_int_equal(h_stop(consumers[1], SIGKILL, h_ms(5000)), 128 + SIGKILL);
    int64_t at_kill = cancelled(&h);
    int64_t unpaid = n - (int64_t)paid;
    assert_int_equal(h_wait_sql(&h, unpaid, h_ms(60000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     unpaid);
    assert_int_equal(h_stop(consumers[0], SIGTERM, h_ms(15000)), 0);
    assert_int_equal(h_stop(consumers[2], SIGTERM, h_ms(15000)), 0);
    h_laws_t laws;
    h_check_laws(&h, logs, NULL, &laws);
    size_t swept = 0;
    for (int c = 0; c < 3; c++) {
        swept += h_count_lines(&h, logs[c], "event=sweep_cancel ");
    }
    char out[160];
    snprintf(out, sizeof out, "cancelled_at_kill=%lld swept=%zu", (long long)at_kill,
             swept);
    h_print_matrix("pg-three", &laws, out);
    H_ASSERT_LAWS(laws);
    assert_int_equal(laws.cancelled, unpaid);
    assert_int_equal(laws.paid, (int64_t)paid);
    h_teardown(&h);
}

/* Publish `half` orders from ord-<first> with the publisher 5 min ahead, then consume
 * them with a consumer whose clock is set by env, until all are cancelled. */
static void clock_round(h_ctx_t *h, int first, int half, const char *const *env,
                        const char *log) {
    static const char *const ahead[] = {H_FAKETIME_ENV, "FAKETIME=+300", NULL};
    static const char *const timeouts[] = {"4s"};
    char file[32];
    snprintf(file, sizeof file, "orders-%d.jsonl", first);
    write_orders_from(h, file, first, half, timeouts, 1);
    int64_t t0 = h_now_ms();
    const char *pub[] = {"publish", "--batch", h_path(h, file), NULL};
    pid_t p = h_spawn_env(h, "publish.log", pub, ahead);
    assert_int_equal(h_stop(p, 0, h_ms(30000)), 0);
    int64_t t1 = h_now_ms();
    /* The server's clock set the deadlines, not the publisher's, 5 min ahead. */
    char sql[160];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM orders WHERE deadline_ms BETWEEN %lld AND %lld",
             (long long)(t0 + 4000 - 1000), (long long)(t1 + 4000 + 1000));
    assert_int_equal(h_sql_int(h, "%s", sql), half);
    const char *consume[] = {"consume", NULL};
    pid_t c = h_spawn_env(h, log, consume, env);
    assert_int_equal(h_wait_sql(h, first + half, h_ms(30000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     first + half);
    assert_int_equal(h_stop(c, SIGTERM, h_ms(15000)), 0);
}

/* A publisher whose clock is 5 min ahead; a consumer 5 min ahead, then one 5 min behind:
 * deadlines are the server's now() + the timeout, nothing is cancelled early (a watcher
 * on the true clock looks), and the consumer that is behind still cancels on time,
 * because the server's clock decides and its own is never asked. */
static void test_wrong_host_clocks_cannot_cancel_early(void **state) {
    (void)state;
    H_SKIP_UNLESS_PG("PostgreSQL faults");
    if (!h_faketime_available()) {
        fprintf(stderr, "skipped: libfaketime is not installed (scripts/setup)\n");
        skip();
    }
    h_ctx_t h;
    h_setup(&h, "pg-clock", "4s", true);
    h_watch_t *watch = h_watch_start(&h);
    const int half = 50;
    static const char *const ahead[] = {H_FAKETIME_ENV, "FAKETIME=+300", NULL};
    static const char *const behind[] = {H_FAKETIME_ENV, "FAKETIME=-300", NULL};
    clock_round(&h, 0, half, ahead, "consumer-ahead.log");
    clock_round(&h, half, half, behind, "consumer-behind.log");
    int64_t behind_lag = h_sql_int(&h,
                                   "SELECT max(cancelled_at_ms - deadline_ms)"
                                   " FROM orders WHERE deadline_ms >= (SELECT"
                                   " min(deadline_ms) FROM orders WHERE order_id ="
                                   " 'ord-%d')",
                                   half);
    static const char *const logs[] = {"consumer-ahead.log", "consumer-behind.log", NULL};
    h_laws_t laws;
    h_check_laws(&h, logs, watch, &laws);
    char extra[128];
    snprintf(extra, sizeof extra,
             "publisher=+300s consumers=+300s,-300s behind_max_lag_ms=%lld",
             (long long)behind_lag);
    h_print_matrix("pg-clock", &laws, extra);
    H_ASSERT_LAWS(laws);
    assert_int_equal(laws.cancelled, 2 * half);
    assert_true(laws.watch_polls > 0);
    /* Behind by 5 min, yet on time. */
    assert_true(behind_lag < 5000);
    h_teardown(&h);
}

/* Six publishers start at once on a database without lapse's schema: one creates it
 * under the advisory lock, the others wait and find it done; a schema newer than the
 * binary is then refused with one clear line. */
static void test_schema_created_once_by_racing_processes(void **state) {
    (void)state;
    H_SKIP_UNLESS_PG("PostgreSQL faults");
    h_ctx_t h;
    h_setup(&h, "pg-schema", "30m", true);
    enum { RACERS = 6 };
    pid_t racers[RACERS];
    char ids[RACERS][16];
    for (int i = 0; i < RACERS; i++) {
        snprintf(ids[i], sizeof ids[i], "mig-%d", i);
        const char *args[] = {"--store-schema", "racey", "publish", ids[i],
                              "--timeout",      "1h",    NULL};
        racers[i] = h_spawn(&h, "racers.log", args);
    }
    for (int i = 0; i < RACERS; i++) {
        assert_int_equal(h_stop(racers[i], 0, h_ms(30000)), 0);
    }
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM racey.lapse_schema"), 1);
    assert_int_equal(h_sql_int(&h, "SELECT max(version) FROM racey.lapse_schema"),
                     PG_SCHEMA_VERSION);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM racey.orders"), RACERS);
    /* A later lapse migrated it to version 99: this one refuses to touch it. */
    h_sql_int(&h, "WITH u AS (UPDATE racey.lapse_schema SET version = 99 RETURNING 1)"
                  " SELECT count(*) FROM u");
    char out[256];
    assert_int_equal(
        h_lapse(&h, out, sizeof out, "--store-schema", "racey", "status", "mig-0", NULL),
        1);
    assert_true(h_count_lines(&h, "cli.log", "newer than this lapse") >= 1);
    h_teardown(&h);
}

/* The test's database name: the path of its URI, postgresql://user@/NAME?... */
static void db_name(const h_ctx_t *h, char *out, size_t cap) {
    const char *slash = strstr(h->store, "@/");
    assert_non_null(slash);
    snprintf(out, cap, "%s", slash + 2);
    out[strcspn(out, "?")] = '\0';
}

/* The pipeline through PgBouncer in transaction pooling mode with a pool of two server
 * connections for three lapse sessions and more: no named prepared statement and no
 * session state may leak from one transaction to the next. */
static void test_through_pgbouncer_transaction_pooling(void **state) {
    (void)state;
    H_SKIP_UNLESS_PG("PostgreSQL faults");
    const char *host = getenv("LAPSE_TEST_PG_HOST");
    const char *port = getenv("LAPSE_TEST_PG_PORT");
    assert_non_null(host);
    assert_non_null(port);
    if (access("/usr/sbin/pgbouncer", X_OK) != 0) {
        fprintf(stderr, "skipped: pgbouncer is not installed (scripts/setup)\n");
        skip();
    }
    h_ctx_t h;
    h_setup(&h, "pg-bouncer", "2s,3s,1m", true);
    char db[128], ini[4 * PATH_MAX];
    db_name(&h, db, sizeof db);
    int bouncer_port = atoi(port) + 100;
    /* h_path's buffer is static: one copy per path. */
    char users[PATH_MAX + 64], log[PATH_MAX + 64], pid[PATH_MAX + 64];
    snprintf(users, sizeof users, "%s", h_path(&h, "users.txt"));
    snprintf(log, sizeof log, "%s", h_path(&h, "pgbouncer.log"));
    snprintf(pid, sizeof pid, "%s", h_path(&h, "pgbouncer.pid"));
    snprintf(ini, sizeof ini,
             "[databases]\n* = host=%s port=%s\n"
             "[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = %d\n"
             "unix_socket_dir =\nauth_type = trust\nauth_file = %s\n"
             "pool_mode = transaction\ndefault_pool_size = 2\nmax_client_conn = 100\n"
             "logfile = %s\npidfile = %s\n",
             host, port, bouncer_port, users, log, pid);
    FILE *f = fopen(h_path(&h, "users.txt"), "w");
    assert_non_null(f);
    fputs("\"postgres\" \"\"\n", f);
    fclose(f);
    f = fopen(h_path(&h, "pgbouncer.ini"), "w");
    assert_non_null(f);
    fputs(ini, f);
    fclose(f);
    /* PgBouncer refuses to run as root; the cluster's own user runs it. */
    char cmd[3 * PATH_MAX + 128];
    snprintf(cmd, sizeof cmd,
             "chmod 0777 '%s' && chmod 0666 '%s'/*; runuser -u postgres -- "
             "/usr/sbin/pgbouncer -d '%s'",
             h.dir, h.dir, h_path(&h, "pgbouncer.ini"));
    assert_int_equal(system(cmd), 0);
    char direct[sizeof h.store];
    memcpy(direct, h.store, sizeof direct);
    snprintf(h.store, sizeof h.store, "postgresql://postgres@127.0.0.1:%d/%s",
             bouncer_port, db);
    const int n = 300;
    /* The orders paid below (every fourth) have a minute: 75 `lapse pay` runs, one
     * process and one PgBouncer connection each, can take longer than 2 s on a loaded
     * machine, and a payment after the deadline is rightly refused (CI saw 44 of 75). */
    static const char *const timeouts[] = {"1m", "2s", "3s", "2s"};
    write_orders(&h, "orders.jsonl", n, timeouts, 4);
    static const char *const extra[] = {"--prefetch", "20", "--sweep-every", "1s", NULL};
    const char *logs[] = {"consumer-0.log", "consumer-1.log", NULL};
    pid_t consumers[2];
    for (int c = 0; c < 2; c++) {
        consumers[c] = h_spawn_consumer(&h, logs[c], extra);
    }
    assert_int_equal(
        h_lapse(&h, NULL, 0, "publish", "--batch", h_path(&h, "orders.jsonl"), NULL), 0);
    /* Payments through PgBouncer too. */
    size_t paid = 0;
    for (int i = 0; i < n; i += 4) {
        char id[32];
        snprintf(id, sizeof id, "ord-%d", i);
        paid += h_lapse(&h, NULL, 0, "pay", id, NULL) == 0;
    }
    memcpy(h.store, direct, sizeof direct); /* the checks read the cluster directly */
    int64_t unpaid = n - (int64_t)paid;
    assert_int_equal(h_wait_sql(&h, unpaid, h_ms(60000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     unpaid);
    for (int c = 0; c < 2; c++) {
        assert_int_equal(h_stop(consumers[c], SIGTERM, h_ms(15000)), 0);
    }
    snprintf(cmd, sizeof cmd, "kill $(cat '%s')", h_path(&h, "pgbouncer.pid"));
    assert_int_equal(system(cmd), 0);
    h_laws_t laws;
    h_check_laws(&h, logs, NULL, &laws);
    h_print_matrix("pg-bouncer", &laws, "pool_mode=transaction pool=2");
    H_ASSERT_LAWS(laws);
    assert_int_equal(paid, (size_t)n / 4);
    assert_int_equal(laws.cancelled, unpaid);
    h_teardown(&h);
}

/* libpq's own environment: "postgresql://" alone, with PGHOST, PGPORT, PGUSER and
 * PGDATABASE naming the test's database, reaches the same store. */
static void test_pg_environment_variables(void **state) {
    (void)state;
    H_SKIP_UNLESS_PG("PostgreSQL faults");
    h_ctx_t h;
    h_setup(&h, "pg-env", "30m", true);
    assert_int_equal(h_lapse(&h, NULL, 0, "publish", "env-1", "--timeout", "1h", NULL),
                     0);
    char db[128], pghost[256], pgport[64], pgdb[160];
    db_name(&h, db, sizeof db);
    snprintf(pghost, sizeof pghost, "PGHOST=%s", getenv("LAPSE_TEST_PG_HOST"));
    snprintf(pgport, sizeof pgport, "PGPORT=%s", getenv("LAPSE_TEST_PG_PORT"));
    snprintf(pgdb, sizeof pgdb, "PGDATABASE=%s", db);
    const char *env[] = {pghost, pgport, pgdb, "PGUSER=postgres", NULL};
    const char *args[] = {"--store", "postgresql://", "pay", "env-1", NULL};
    pid_t p = h_spawn_env(&h, "env.log", args, env);
    assert_int_equal(h_stop(p, 0, h_ms(20000)), 0);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE order_id = 'env-1'"
                                   " AND status = 'paid'"),
                     1);
    h_teardown(&h);
}

/* GSSAPI encryption only when asked for: over TCP, libpq's default (gssencmode=prefer)
 * looks for Kerberos credentials before every connection, which sets up a Kerberos
 * context (half a megabyte of a consumer's memory); lapse's default is disable, and the
 * URI or PGGSSENCMODE asks for it. KRB5_TRACE names the file Kerberos opens for its trace
 * as it sets up a context: it exists exactly when the probe ran. */
static void test_gssapi_encryption_only_when_asked(void **state) {
    (void)state;
    H_SKIP_UNLESS_PG("PostgreSQL faults");
    h_ctx_t h;
    h_setup(&h, "pg-gss", "30m", true);
    assert_int_equal(h_lapse(&h, NULL, 0, "publish", "gss-1", "--timeout", "1h", NULL),
                     0);
    char db[128], tcp[512], asked[600];
    db_name(&h, db, sizeof db);
    snprintf(tcp, sizeof tcp, "postgresql://postgres@127.0.0.1:%s/%s",
             getenv("LAPSE_TEST_PG_PORT"), db);
    snprintf(asked, sizeof asked, "%s?gssencmode=prefer", tcp);
    const struct {
        const char *name, *uri, *env;
        bool probed;
    } cases[] = {
        {"default", tcp, NULL, false},
        {"uri", asked, NULL, true},
        {"env", tcp, "PGGSSENCMODE=prefer", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char trace[PATH_MAX + 32], trace_env[PATH_MAX + 48], log[64];
        snprintf(trace, sizeof trace, "%s/krb5-%s.trace", h.dir, cases[i].name);
        snprintf(trace_env, sizeof trace_env, "KRB5_TRACE=%s", trace);
        snprintf(log, sizeof log, "gss-%s.log", cases[i].name);
        const char *env[] = {trace_env, cases[i].env, NULL};
        const char *args[] = {"--store", cases[i].uri, "status", "gss-1", NULL};
        pid_t p = h_spawn_env(&h, log, args, env);
        assert_int_equal(h_stop(p, 0, h_ms(20000)), 0);
        bool probed = access(trace, F_OK) == 0;
        printf("gssencmode %s: Kerberos context set up: %s\n", cases[i].name,
               probed ? "yes" : "no");
        assert_true(probed == cases[i].probed);
    }
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_stopped_immediately_mid_flow),
        cmocka_unit_test(test_backends_terminated_mid_batch),
        cmocka_unit_test(test_row_locked_for_30s_holds_up_only_its_order),
        cmocka_unit_test(test_three_sweeping_consumers_one_killed),
        cmocka_unit_test(test_wrong_host_clocks_cannot_cancel_early),
        cmocka_unit_test(test_schema_created_once_by_racing_processes),
        cmocka_unit_test(test_through_pgbouncer_transaction_pooling),
        cmocka_unit_test(test_pg_environment_variables),
        cmocka_unit_test(test_gssapi_encryption_only_when_asked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

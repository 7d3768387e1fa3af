/* SPDX-License-Identifier: MIT
 * Integration-test harness: a scratch dir and prefix per test, the real lapse binary,
 * a real store (a SQLite file, or a PostgreSQL database of its own when
 * LAPSE_TEST_STORE=postgresql: see store_fixture.h), and a rabbitmq-c connection to the
 * private test node. */
#ifndef LAPSE_TEST_HARNESS_H
#define LAPSE_TEST_HARNESS_H

#include <amqp.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "store_fixture.h"

typedef struct h_ctx {
    char name[64];
    char dir[PATH_MAX];
    char db_path[PATH_MAX + 16]; /* the SQLite file; "" on PostgreSQL */
    char store[PATH_MAX + 160];  /* the store URI every lapse command gets */
    char prefix[96];
    char tap[112]; /* <prefix>.tap: the queue h_tap_events binds */
    char classes[128];
    char amqp[512];
    const char *bin;
    bool pg;       /* the store is PostgreSQL (LAPSE_TEST_STORE=postgresql) */
    sf_store_t sf; /* the test's store */
    sf_conn_t *db; /* the harness's connection for h_sql_int, opened on first use */
} h_ctx_t;

/* A message read back from a queue; strings are NUL-terminated copies. */
typedef struct h_msg {
    char *body;
    size_t len;
    char message_id[256];
    char reason[256];    /* header x-lapse-reason, "" when absent */
    char deadline[64];   /* header x-lapse-deadline, "" when absent */
    int64_t deadline_ms; /* header x-lapse-deadline-ms, -1 when absent */
    char type[64];       /* properties, "" when absent */
    char app_id[64];
    char content_type[64];
    int delivery_mode; /* 0 when absent */
    bool redelivered;
} h_msg_t;

typedef void (*h_msg_cb)(void *opaque, const h_msg_t *msg);

/* Scale timeouts under sanitizers/valgrind: LAPSE_TEST_TIMEOUT_MULTIPLIER (default 1). */
int h_ms(int ms);

/* Fresh temp dir, store and prefix "t-<name>-<pid>"; declares the topology unless
 * declare is false. The store is <dir>/lapse.db, or on PostgreSQL a new database (its
 * tables appear with the first lapse command). Aborts the test run with a message when
 * the environment is not there. */
void h_setup(h_ctx_t *h, const char *name, const char *classes, bool declare);

/* A cmocka group teardown for tests that kill or stop the shared test node: restarts it
 * when it is down, so the tests that follow find it answering; -1 when it cannot. */
int h_group_ensure_node(void **state);
/* Close the connection, delete the test's queues (<prefix>.*, best effort), the temp
 * dir and the PostgreSQL database (all kept with LAPSE_TEST_KEEP set). */
void h_teardown(h_ctx_t *h);

/* For tests (cmocka included before this header): on PostgreSQL, print why and skip the
 * rest of the test (tearing h down first); on SQLite, nothing. For the parts of a test
 * that are about SQLite itself (its file, its modes, its lock). */
#define H_SKIP_ON_PG(h, why)                                                             \
    do {                                                                                 \
        if ((h)->pg) {                                                                   \
            printf("skip on PostgreSQL: %s\n", why);                                     \
            fflush(stdout);                                                              \
            h_teardown(h);                                                               \
            skip();                                                                      \
        }                                                                                \
    } while (0)

/* For tests (cmocka included before this header) that are about PostgreSQL alone: on any
 * other store, print why and skip (before h_setup). */
#define H_SKIP_UNLESS_PG(why)                                                            \
    do {                                                                                 \
        const char *store_ = getenv("LAPSE_TEST_STORE");                                 \
        if (store_ == NULL || strcmp(store_, "postgresql") != 0) {                       \
            printf("skipped: %s need LAPSE_TEST_STORE=postgresql\n", why);               \
            fflush(stdout);                                                              \
            skip();                                                                      \
        }                                                                                \
    } while (0)

/* Run `lapse <global flags> args... (NULL-terminated)`, stdout into out (may be NULL),
 * stderr appended to <dir>/cli.log. Returns the exit code (-1 when it did not exit). */
int h_lapse(h_ctx_t *h, char *out, size_t cap, ...);

/* Like h_lapse, but runs `lapse args...` exactly as given: no global flags are added, so
 * the environment and the built-in defaults apply (NULL-terminated). */
int h_run(h_ctx_t *h, char *out, size_t cap, ...);

/* Start `lapse <global flags> consume [extra...]` in the background, stderr into
 * <dir>/<log>. extra may be NULL. */
pid_t h_spawn_consumer(h_ctx_t *h, const char *log, const char *const *extra);
/* Start `lapse <global flags> args...` (NULL-terminated; it may begin with more global
 * flags, e.g. --prefix) in the background, stderr into <dir>/<log>. */
pid_t h_spawn(h_ctx_t *h, const char *log, const char *const *args);

/* The same with stdin a pipe: *stdin_fd receives its write end (close-on-exec, so no
 * other child holds it open); closing it is the child's end of input. */
pid_t h_spawn_stdin(h_ctx_t *h, const char *log, const char *const *args, int *stdin_fd);

/* Send sig (0: none) and wait up to timeout_ms. Returns the exit code, 128+signal when
 * killed by a signal, -1 on timeout (the process is then killed). */
int h_stop(pid_t pid, int sig, int timeout_ms);
bool h_alive(pid_t pid);

/* Like h_spawn, with env ("NAME=value" strings, NULL-terminated; borrowed) added to the
 * test's own environment, replacing variables of the same names. */
pid_t h_spawn_env(h_ctx_t *h, const char *log, const char *const *args,
                  const char *const *env);

/* libfaketime (Debian package libfaketime, pulled in by faketime): preloaded into a child
 * it shifts the wall clock only, with FAKETIME_DONT_FAKE_MONOTONIC=1. Add FAKETIME=+3
 * (seconds) or FAKETIME_TIMESTAMP_FILE=<file> with FAKETIME_NO_CACHE=1. ASan insists on
 * coming first in the link order, so h_spawn_env adds verify_asan_link_order=0 to
 * ASAN_OPTIONS whenever env preloads something. */
#define H_LIBFAKETIME  "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
#define H_FAKETIME_ENV "LD_PRELOAD=" H_LIBFAKETIME, "FAKETIME_DONT_FAKE_MONOTONIC=1"
bool h_faketime_available(void);

/* Pay, through the store, "ord-<i>" for each i < n where pick(i), now (well inside their
 * windows). Returns how many payments were accepted. */
size_t h_pay_in_time(h_ctx_t *h, int n, bool (*pick)(int));

/* Scalar query on the test's store, on either backend (the same SQL: see
 * store_fixture.h); sql_fmt is formatted by sqlite3_vmprintf (%q, %Q). Read-only on
 * SQLite. NULL reads as 0, a boolean as 1 or 0, no row as -1. Before the first lapse
 * command has opened the store there are no tables: the query fails and the test run
 * aborts with the error, on both backends. */
int64_t h_sql_int(h_ctx_t *h, const char *sql_fmt, ...);
/* How much longer than on SQLite the events of a consumer killed with SIGKILL may wait in
 * the outbox before a live consumer publishes them: 0 on SQLite; on PostgreSQL the
 * claim the killed one held on them (LAPSE_STORE_EVENT_CLAIM_MS) and a consumer's pass
 * over the outbox backlog (CONSUMER_BACKLOG_EVERY_MS). */
int h_claim_wait_ms(const h_ctx_t *h);
/* Whether a lapse command has created the test's store yet (store_fixture.h's
 * sf_exists). */
bool h_store_exists(h_ctx_t *h);
/* Run a statement that changes the store (its own read-write connection); aborts the
 * test run when it fails. */
void h_sql_exec(h_ctx_t *h, const char *sql_fmt, ...);
/* Poll until the query equals expect or timeout_ms passes; returns the last value. */
int64_t h_wait_sql(h_ctx_t *h, int64_t expect, int timeout_ms, const char *sql_fmt, ...);

/* Poll until every outbox event is published (sf_sql_unpublished -> 0) or
 * timeout_ms passes; returns the events still unpublished (0: all went out). */
int64_t h_wait_outbox_empty(h_ctx_t *h, int timeout_ms);

/* Lines of <dir>/<file> that contain needle. */
size_t h_count_lines(h_ctx_t *h, const char *file, const char *needle);
/* Poll (every 20 ms) until at least want lines of <dir>/<file> contain needle or
 * timeout_ms passes; returns the last count. */
size_t h_wait_lines(h_ctx_t *h, const char *file, const char *needle, size_t want,
                    int timeout_ms);
/* Full path of a file in the test dir (static buffer: use before the next call). */
const char *h_path(h_ctx_t *h, const char *file);

/* rabbitmq-c helpers (channel 1). */
amqp_connection_state_t h_amqp_open(h_ctx_t *h);
void h_amqp_close(amqp_connection_state_t conn);
/* Declare a queue named <prefix>.<suffix> bound to exchange with routing key. */
void h_tap(h_ctx_t *h, amqp_connection_state_t conn, const char *suffix,
           const char *exchange, const char *routing_key);
/* Declare h->tap (<prefix>.tap) bound to the events exchange (<prefix>.events) with
 * "#": the consumers' order.cancelled events are published into it instead of coming
 * back unroutable and staying in the outbox. Returns h->tap. */
const char *h_tap_events(h_ctx_t *h, amqp_connection_state_t conn);
/* basic.get every message of <queue> (acking it) until empty for idle_ms. */
size_t h_drain(amqp_connection_state_t conn, const char *queue, int idle_ms, h_msg_cb cb,
               void *opaque);
/* Persistent publish of body to exchange/routing key (no confirms; a passive declare
 * after it makes sure the broker has processed it). */
void h_publish_raw(amqp_connection_state_t conn, const char *exchange,
                   const char *routing_key, const void *body, size_t len,
                   const char *message_id);
/* Passive-declare: messages in queue. */
int64_t h_queue_depth(amqp_connection_state_t conn, const char *queue);
/* queue's depth once it is want, or what it is after timeout_ms: for depths that the
 * test reads after a log line or an unconfirmed publish, which may run ahead of them. */
int64_t h_wait_depth(amqp_connection_state_t conn, const char *queue, int64_t want,
                     int timeout_ms);

/* Percentile (0..100) of n sorted values. */
int64_t h_percentile(const int64_t *sorted, size_t n, double p);
void h_sort(int64_t *v, size_t n);

/* The four laws (docs/design.md, "The four laws"), checked over every order in the
 * test's store: counts of the orders that break one, so that a failure says which law
 * and how often. */
typedef struct h_laws {
    int64_t orders, paid, cancelled, pending;
    int64_t lost;        /* past its deadline, never paid, still pending (law 3) */
    int64_t wrong;       /* paid with a cancel time or an event (law 2) */
    int64_t early;       /* cancelled_at_ms < deadline_ms, or seen cancelled by the
                          * watcher before its deadline (law 1) */
    int64_t doubled;     /* more than one event row, or more than one cancellation in
                          * the logs (decision=cancelled, event=sweep_cancel) (law 4) */
    int64_t no_event;    /* cancelled without exactly one event row (law 4) */
    int64_t holds_wrong; /* holds released and status cancelled disagree (law 4) */
    int64_t unpublished; /* event rows not yet published (informational) */
    int64_t max_lag_ms;  /* max(cancelled_at_ms - deadline_ms), -1 when none */
    int64_t watch_polls; /* store polls the watcher made, 0 without one */
} h_laws_t;

/* A thread that polls the store every ~5 ms (its own connection) and counts
 * orders it sees cancelled while the wall clock is still before their deadline: a
 * never-early check independent of the consumer's clock. */
typedef struct h_watch h_watch_t;
h_watch_t *h_watch_start(h_ctx_t *h);

/* Fill *out for every order in the store. logs: NULL-terminated file names in the test
 * dir scanned for cancellations (may be NULL); w: a watcher to stop and free (may be
 * NULL). */
void h_check_laws(h_ctx_t *h, const char *const *logs, h_watch_t *w, h_laws_t *out);
/* Print "matrix <row> orders=N lost=N doubled=N early=N max_lag_ms=N" and the details
 * to stdout. */
void h_print_matrix(const char *row, const h_laws_t *laws, const char *extra);
/* For tests (cmocka included before this header): every law holds. */
#define H_ASSERT_LAWS(l)                                                                 \
    do {                                                                                 \
        assert_int_equal((l).lost, 0);                                                   \
        assert_int_equal((l).wrong, 0);                                                  \
        assert_int_equal((l).early, 0);                                                  \
        assert_int_equal((l).doubled, 0);                                                \
        assert_int_equal((l).no_event, 0);                                               \
        assert_int_equal((l).holds_wrong, 0);                                            \
    } while (0)

/* Distinct order ids among the order.cancelled events drained from a tap queue (every
 * message is consumed); *total receives the number of messages. */
size_t h_tap_event_orders(amqp_connection_state_t conn, const char *queue, size_t *total);

/* Sum of the ready messages in the topology's holding queues (one per class), the 28
 * ladder rungs and the expired queue. */
int64_t h_topology_depth(h_ctx_t *h, amqp_connection_state_t conn);

/* Resident set size of a process in kB (VmRSS), -1 when unreadable. */
long h_rss_kb(pid_t pid);
/* A kB field of /proc/PID/status (e.g. "VmHWM", the peak RSS), -1 when unreadable. */
long h_status_kb(pid_t pid, const char *field);

/* Run `$LAPSE_NODE_SCRIPT <cmd> $LAPSE_TEST_NODE`, output appended to <dir>/node.log;
 * returns the exit code. */
int h_node(h_ctx_t *h, const char *cmd);
/* The same for node name (a cluster test's nodes). */
int h_node_named(h_ctx_t *h, const char *cmd, const char *name);

/* The management API ($LAPSE_TEST_MGMT_URL, guest/guest) through the curl command:
 * method on path with a JSON body from body_file or body (both may be NULL). Returns the
 * HTTP status (-1 when curl did not run); the response body goes to <dir>/http.out. */
int h_http(h_ctx_t *h, const char *method, const char *path, const char *body_file,
           const char *body);

/* Wall clock, ms since the epoch. */
int64_t h_now_ms(void);

#endif

/* SPDX-License-Identifier: MIT
 * lapse consume as a systemd service: the notifications it sends to NOTIFY_SOCKET (a
 * datagram socket this test owns, as the service manager would), and its logs as a
 * service writes them (JSON, the level filter, the journal's priority prefix). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <lapse/message.h>

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_MSGS 512

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The service manager's end: a bound AF_UNIX datagram socket, and what came in. */
typedef struct notify_sock {
    int fd;
    char path[PATH_MAX];
    size_t n;
    char *msg[MAX_MSGS];
    int64_t at[MAX_MSGS]; /* mono ms of arrival */
} notify_sock_t;

static void notify_open(notify_sock_t *s, h_ctx_t *h) {
    memset(s, 0, sizeof *s);
    /* sun_path is short (108 bytes): the test dir may be deeper. */
    snprintf(s->path, sizeof s->path, "/tmp/lapse-notify-%d.sock", (int)getpid());
    unlink(s->path);
    s->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(s->fd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    assert_true(strlen(s->path) < sizeof sa.sun_path);
    strcpy(sa.sun_path, s->path);
    assert_int_equal(bind(s->fd, (struct sockaddr *)&sa, sizeof sa), 0);
    (void)h;
}

static void notify_close(notify_sock_t *s) {
    for (size_t i = 0; i < s->n; i++) {
        free(s->msg[i]);
    }
    close(s->fd);
    unlink(s->path);
}

/* Receive until a message holds the line want (or timeout_ms passes); every message is
 * kept. Returns the index of that message, or -1. */
static long notify_wait(notify_sock_t *s, const char *want, int timeout_ms) {
    int64_t until = mono_ms() + timeout_ms;
    for (;;) {
        int64_t left = until - mono_ms();
        if (left <= 0) {
            return -1;
        }
        struct pollfd p = {.fd = s->fd, .events = POLLIN};
        int r = poll(&p, 1, (int)left);
        if (r <= 0) {
            continue;
        }
        char buf[4096];
        ssize_t got = recv(s->fd, buf, sizeof buf - 1, 0);
        assert_true(got >= 0);
        buf[got] = '\0';
        assert_true(s->n < MAX_MSGS);
        size_t i = s->n++;
        s->msg[i] = strdup(buf);
        s->at[i] = mono_ms();
        /* A message is lines of VAR=value. */
        for (char *line = buf; line != NULL;) {
            char *nl = strchr(line, '\n');
            if (nl) {
                *nl = '\0';
            }
            if (want != NULL && strcmp(line, want) == 0) {
                return (long)i;
            }
            line = nl ? nl + 1 : NULL;
        }
    }
}

static bool has_line(const char *msg, const char *want) {
    size_t len = strlen(want);
    for (const char *p = msg; p != NULL;
         p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, want, len) == 0 && (p[len] == '\n' || p[len] == '\0')) {
            return true;
        }
    }
    return false;
}

static size_t count_msgs(const notify_sock_t *s, const char *want) {
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++) {
        n += has_line(s->msg[i], want);
    }
    return n;
}

/* `lapse <globals> consume` with NOTIFY_SOCKET, and WATCHDOG_USEC (when usec is not NULL)
 * with WATCHDOG_PID set to the pid of the consumer itself (own_pid) or of its parent;
 * stderr into <dir>/<log>. Forked here: only the child knows its pid before exec. */
static pid_t spawn_notified(h_ctx_t *h, const notify_sock_t *s, const char *log,
                            const char *usec, bool own_pid) {
    char err_path[PATH_MAX + 64];
    snprintf(err_path, sizeof err_path, "%s/%s", h->dir, log);
    pid_t parent = getpid();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(err_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        int null = open("/dev/null", O_RDWR);
        if (fd < 0 || null < 0 || dup2(fd, 2) < 0 || dup2(null, 0) < 0 ||
            dup2(null, 1) < 0) {
            _exit(126);
        }
        char pid_text[32];
        snprintf(pid_text, sizeof pid_text, "%d", (int)(own_pid ? getpid() : parent));
        setenv("NOTIFY_SOCKET", s->path, 1);
        if (usec != NULL) {
            setenv("WATCHDOG_USEC", usec, 1);
            setenv("WATCHDOG_PID", pid_text, 1);
        }
        char *argv[] = {
            (char *)h->bin, (char *)"--amqp",   h->amqp,   (char *)"--store",
            h->store,       (char *)"--prefix", h->prefix, (char *)"--classes",
            h->classes,     (char *)"consume",  NULL};
        execv(h->bin, argv);
        _exit(127);
    }
    return pid;
}

/* Passive-declare the queue: how many consumers the broker has on it. */
static int64_t queue_consumers(amqp_connection_state_t conn, const char *queue) {
    amqp_queue_declare_ok_t *ok = amqp_queue_declare(conn, 1, amqp_cstring_bytes(queue),
                                                     1, 0, 0, 0, amqp_empty_table);
    assert_non_null(ok);
    return ok->consumer_count;
}

static void test_ready_after_subscribing_watchdog_stopping(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "notify", "2s", true);
    amqp_connection_state_t conn = h_amqp_open(&h);
    char expired[128];
    snprintf(expired, sizeof expired, "%s.expired", h.prefix);
    notify_sock_t s;
    notify_open(&s, &h);

    /* A 2 s watchdog: the consumer pings once a second (half of it). */
    int64_t t0 = mono_ms();
    pid_t consumer = spawn_notified(&h, &s, "consumer.log", "2000000", true);
    long ready = notify_wait(&s, "READY=1", h_ms(20000));
    int64_t ready_ms = mono_ms() - t0;
    assert_true(ready >= 0);
    /* At that moment the broker has the consumer on the expired queue, and the log said
     * so first. */
    int64_t consumers = queue_consumers(conn, expired);
    size_t consuming_lines = h_count_lines(&h, "consumer.log", "event=consuming");
    printf("READY=1 after %lld ms (message %ld: \"%s\"), consumers on %s: %lld\n",
           (long long)ready_ms, ready, s.msg[ready], expired, (long long)consumers);
    assert_int_equal(consumers, 1);
    assert_int_equal(consuming_lines, 1);
    char status[200];
    snprintf(status, sizeof status, "STATUS=consuming %s", expired);
    assert_true(has_line(s.msg[ready], status));
    /* Nothing said READY before. */
    assert_int_equal(count_msgs(&s, "READY=1"), 1);

    /* Some traffic while the watchdog runs: the pings go on while it works. */
    assert_int_equal(h_lapse(&h, NULL, 0, "publish", "w-1", "--timeout", "2s", NULL), 0);
    assert_int_equal(h_lapse(&h, NULL, 0, "publish", "w-2", "--timeout", "2s", NULL), 0);
    int64_t window_start = mono_ms();
    notify_wait(&s, NULL, 5000);
    int64_t pings = 0, max_gap = 0, last = window_start;
    for (size_t i = (size_t)ready; i < s.n; i++) {
        if (has_line(s.msg[i], "WATCHDOG=1")) {
            pings++;
            if (s.at[i] >= window_start) {
                max_gap = s.at[i] - last > max_gap ? s.at[i] - last : max_gap;
                last = s.at[i];
            }
        }
    }
    max_gap = mono_ms() - last > max_gap ? mono_ms() - last : max_gap;
    printf("WATCHDOG=1 pings in 5 s: %lld, longest gap %lld ms (watchdog 2000 ms)\n",
           (long long)pings, (long long)max_gap);
    assert_true(pings >= 3);
    assert_true(max_gap < 2000);
    assert_int_equal(h_wait_sql(&h, 2, h_ms(10000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     2);

    /* SIGTERM: STOPPING=1, then a clean exit. */
    assert_int_equal(kill(consumer, SIGTERM), 0);
    long stopping = notify_wait(&s, "STOPPING=1", h_ms(10000));
    assert_true(stopping >= 0);
    assert_int_equal(h_stop(consumer, 0, h_ms(10000)), 0);
    assert_int_equal(h_count_lines(&h, "consumer.log", "event=stopped"), 1);
    notify_wait(&s, NULL, 200); /* anything sent after STOPPING=1 */
    assert_int_equal(count_msgs(&s, "READY=1"), 1);
    assert_int_equal(count_msgs(&s, "STOPPING=1"), 1);

    /* WATCHDOG_PID names another process: the watchdog is not this one's, no pings
     * (READY=1 still comes). */
    for (size_t i = 0; i < s.n; i++) {
        free(s.msg[i]);
    }
    s.n = 0;
    consumer = spawn_notified(&h, &s, "consumer2.log", "2000000", false);
    assert_true(notify_wait(&s, "READY=1", h_ms(20000)) >= 0);
    notify_wait(&s, NULL, 2500);
    assert_int_equal(count_msgs(&s, "WATCHDOG=1"), 0);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    notify_wait(&s, NULL, 200); /* what it sent before it exited is queued */
    assert_int_equal(count_msgs(&s, "STOPPING=1"), 1);

    notify_close(&s);
    h_amqp_close(conn);
    h_teardown(&h);
}

/* Publish n orders "<tag>-<i>" with a 2 s window and wait until all are cancelled. */
static void run_orders(h_ctx_t *h, const char *tag, int n) {
    char file[64];
    snprintf(file, sizeof file, "%s.jsonl", tag);
    FILE *f = fopen(h_path(h, file), "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"order_id\":\"%s-%d\",\"timeout\":\"2s\"}\n", tag, i);
    }
    fclose(f);
    assert_int_equal(h_lapse(h, NULL, 0, "publish", "--batch", h_path(h, file), NULL), 0);
    assert_int_equal(
        h_wait_sql(h, n, h_ms(20000),
                   "SELECT count(*) FROM orders WHERE status='cancelled' AND "
                   "order_id LIKE '%q-%%'",
                   tag),
        n);
}

static void test_json_lines_and_level_filter(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "logfmt", "2s", true);
    enum { N = 20 };

    /* --log-format json: every line of the consumer's stderr is one JSON object. */
    const char *const json_args[] = {"--log-format", "json", NULL};
    pid_t consumer = h_spawn_consumer(&h, "json.log", json_args);
    run_orders(&h, "j", N);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    FILE *f = fopen(h_path(&h, "json.log"), "r");
    assert_non_null(f);
    char line[8192];
    int lines = 0, decisions = 0, consuming = 0, stopped = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        lines++;
        json_error_t jerr;
        json_t *obj = json_loads(line, 0, &jerr);
        if (obj == NULL || !json_is_object(obj)) {
            fail_msg("line %d is not a JSON object (%s): %s", lines, jerr.text, line);
        }
        const char *ts = json_string_value(json_object_get(obj, "ts"));
        const char *level = json_string_value(json_object_get(obj, "level"));
        const char *event = json_string_value(json_object_get(obj, "event"));
        assert_non_null(ts);
        assert_non_null(level);
        assert_non_null(event);
        int64_t ms = 0;
        assert_int_equal(strlen(ts), 24); /* 2026-11-30T07:06:30.941Z */
        assert_int_equal(lapse_time_parse_rfc3339(ts, &ms), LAPSE_OK);
        assert_true(llabs(ms - h_now_ms()) < 600000);
        if (strcmp(event, "decision") == 0) {
            decisions++;
            assert_string_equal(level, "info");
            assert_string_equal(json_string_value(json_object_get(obj, "decision")),
                                "cancelled");
            const char *id = json_string_value(json_object_get(obj, "order_id"));
            assert_non_null(id);
            assert_true(strncmp(id, "j-", 2) == 0);
            assert_non_null(json_string_value(json_object_get(obj, "lag_ms")));
        }
        consuming += strcmp(event, "consuming") == 0;
        stopped += strcmp(event, "stopped") == 0;
        json_decref(obj);
    }
    fclose(f);
    printf("json.log: %d lines, %d decisions\n", lines, decisions);
    assert_int_equal(decisions, N);
    assert_int_equal(consuming, 1);
    assert_int_equal(stopped, 1);

    /* LAPSE_LOG_LEVEL=warning: the same work, no line per decision, nothing at info;
     * the orders are still cancelled. Readiness is read from the broker instead. */
    amqp_connection_state_t conn = h_amqp_open(&h);
    char expired[128];
    snprintf(expired, sizeof expired, "%s.expired", h.prefix);
    const char *const args[] = {"consume", NULL};
    const char *const env[] = {"LAPSE_LOG_LEVEL=warning", NULL};
    consumer = h_spawn_env(&h, "warning.log", args, env);
    for (int t = 0; t < h_ms(10000) / 20 && queue_consumers(conn, expired) == 0; t++) {
        usleep(20000);
    }
    assert_int_equal(queue_consumers(conn, expired), 1);
    run_orders(&h, "w", N);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    size_t any = h_count_lines(&h, "warning.log", "");
    printf("warning.log: %zu lines\n", any);
    assert_int_equal(h_count_lines(&h, "warning.log", "decision="), 0);
    assert_int_equal(h_count_lines(&h, "warning.log", "level=info"), 0);
    assert_int_equal(h_count_lines(&h, "warning.log", "event=consuming"), 0);

    /* JOURNAL_STREAM naming the consumer's stderr: each line starts with its priority
     * (<6> for info); the same variable naming another file changes nothing. */
    char journal_log[PATH_MAX + 64];
    snprintf(journal_log, sizeof journal_log, "%s", h_path(&h, "journal.log"));
    int fd = open(journal_log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    close(fd);
    char stream[96];
    snprintf(stream, sizeof stream, "JOURNAL_STREAM=%llu:%llu",
             (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
    const char *const jenv[] = {stream, NULL};
    consumer = h_spawn_env(&h, "journal.log", args, jenv);
    run_orders(&h, "p", 3);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    consumer = h_spawn_env(&h, "other.log", args, jenv);
    run_orders(&h, "o", 3);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    size_t journal_lines = h_count_lines(&h, "journal.log", "");
    size_t info = h_count_lines(&h, "journal.log", "level=info");
    printf("journal.log: %zu lines, %zu at info\n", journal_lines, info);
    f = fopen(journal_log, "r");
    assert_non_null(f);
    size_t prefixed_info = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        assert_int_equal(line[0], '<');
        prefixed_info += strncmp(line, "<6>", 3) == 0 && strstr(line, " level=info ");
    }
    fclose(f);
    assert_true(info >= 5); /* consuming, 3 decisions, stopped */
    assert_int_equal(prefixed_info, info);
    assert_int_equal(h_count_lines(&h, "other.log", "<6>"), 0);
    assert_true(h_count_lines(&h, "other.log", "decision=cancelled") == 3);

    h_amqp_close(conn);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ready_after_subscribing_watchdog_stopping),
        cmocka_unit_test(test_json_lines_and_level_filter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

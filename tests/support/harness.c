/* SPDX-License-Identifier: MIT
 * Integration-test harness: processes, the store (SQLite or PostgreSQL) and the broker,
 * for real. */
#include "harness.h"

#include <lapse/store.h>

#include "consumer_int.h"

#include <amqp_tcp_socket.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "harness: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int h_ms(int ms) {
    const char *m = getenv("LAPSE_TEST_TIMEOUT_MULTIPLIER");
    int mult = m ? atoi(m) : 1;
    return ms * (mult > 0 ? mult : 1);
}

/* ---- the lapse processes a test started ---------------------------------------------
 * A failing assertion jumps past the test's own h_stop calls and its teardown: the
 * processes it started would run on (a consumer for the rest of the ctest run, taking
 * CPU from every later test). Every spawned pid is kept until it is reaped by h_stop;
 * the next h_setup and the program's exit kill and reap what is left. Only a pid that
 * waitpid still calls a running child of ours is killed, so a pid reaped elsewhere and
 * reused is never touched. */
#define LIVE_MAX 256
static pid_t live[LIVE_MAX];
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;

static void live_add(pid_t pid) {
    pthread_mutex_lock(&live_lock);
    for (size_t i = 0; i < LIVE_MAX; i++) {
        if (live[i] == 0) {
            live[i] = pid;
            break;
        }
    }
    pthread_mutex_unlock(&live_lock);
}

static void live_remove(pid_t pid) {
    pthread_mutex_lock(&live_lock);
    for (size_t i = 0; i < LIVE_MAX; i++) {
        if (live[i] == pid) {
            live[i] = 0;
        }
    }
    pthread_mutex_unlock(&live_lock);
}

static void live_kill_all(void) {
    size_t killed = 0;
    pthread_mutex_lock(&live_lock);
    for (size_t i = 0; i < LIVE_MAX; i++) {
        pid_t pid = live[i];
        live[i] = 0;
        if (pid > 0 && waitpid(pid, NULL, WNOHANG) == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            killed++;
        }
    }
    pthread_mutex_unlock(&live_lock);
    if (killed > 0) {
        fprintf(stderr,
                "harness: killed %zu lapse process(es) an earlier test left running\n",
                killed);
    }
}

void h_setup(h_ctx_t *h, const char *name, const char *classes, bool declare) {
    static bool at_exit;
    if (!at_exit) {
        at_exit = atexit(live_kill_all) == 0;
    }
    live_kill_all();
    memset(h, 0, sizeof *h);
    const char *url = getenv("LAPSE_TEST_AMQP_URL");
    h->bin = getenv("LAPSE_BIN");
    if (!url || !h->bin) {
        die("LAPSE_TEST_AMQP_URL and LAPSE_BIN must be set (run through ctest)");
    }
    snprintf(h->name, sizeof h->name, "%s", name);
    snprintf(h->amqp, sizeof h->amqp, "%s", url);
    snprintf(h->classes, sizeof h->classes, "%s", classes);
    snprintf(h->prefix, sizeof h->prefix, "t-%s-%d", name, (int)getpid());
    snprintf(h->tap, sizeof h->tap, "%s.tap", h->prefix);
    snprintf(h->dir, sizeof h->dir, "/tmp/lapse-it-%s-XXXXXX", name);
    if (!mkdtemp(h->dir)) {
        die("mkdtemp: %s", strerror(errno));
    }
    if (sf_create(&h->sf, name, h->dir, "lapse.db") != 0) {
        die("cannot create the test's %s store", sf_backend_name(sf_backend()));
    }
    h->pg = h->sf.backend == SF_PG;
    snprintf(h->db_path, sizeof h->db_path, "%s", h->sf.path);
    snprintf(h->store, sizeof h->store, "%s", h->sf.uri);
    fprintf(stderr, "harness: test %s in %s, prefix %s, store %s\n", name, h->dir,
            h->prefix, h->store);
    if (declare) {
        int code = h_lapse(h, NULL, 0, "topology", "declare", NULL);
        if (code != 0) {
            die("topology declare exited %d (see %s/cli.log)", code, h->dir);
        }
    }
}

/* The vhost of h->amqp ("/" for %2f), into buf. */
static void url_vhost(const h_ctx_t *h, char *buf, size_t cap) {
    char url[512];
    snprintf(url, sizeof url, "%s", h->amqp);
    struct amqp_connection_info info;
    buf[0] = '\0';
    if (amqp_parse_url(url, &info) == AMQP_STATUS_OK) {
        snprintf(buf, cap, "%s", info.vhost);
    }
    if (strcmp(buf, "%2f") == 0 || strcmp(buf, "%2F") == 0) {
        snprintf(buf, cap, "/");
    }
}

/* A connection to h->amqp on channel 1, or NULL. */
static amqp_connection_state_t try_open(h_ctx_t *h) {
    char url[512], vhost[256];
    snprintf(url, sizeof url, "%s", h->amqp);
    url_vhost(h, vhost, sizeof vhost);
    struct amqp_connection_info info;
    if (amqp_parse_url(url, &info) != AMQP_STATUS_OK) {
        return NULL;
    }
    amqp_connection_state_t conn = amqp_new_connection();
    amqp_socket_t *socket = amqp_tcp_socket_new(conn);
    if (!socket || amqp_socket_open(socket, info.host, info.port) != AMQP_STATUS_OK ||
        amqp_login(conn, vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, info.user,
                   info.password)
                .reply_type != AMQP_RESPONSE_NORMAL) {
        amqp_destroy_connection(conn);
        return NULL;
    }
    amqp_channel_open(conn, 1);
    if (amqp_get_rpc_reply(conn).reply_type != AMQP_RESPONSE_NORMAL) {
        amqp_destroy_connection(conn);
        return NULL;
    }
    return conn;
}

/* Best effort: delete the queues named <prefix>.* in the test's vhost. Over a whole run
 * the node would otherwise keep a thousand queues, and the fault tests restart it: a
 * restart recovers every queue, slowly once they outnumber the node's file handles. */
static void delete_queues(h_ctx_t *h) {
    if (!getenv("LAPSE_TEST_MGMT_URL") || h->prefix[0] == '\0') {
        return;
    }
    char vhost[256], path[512];
    url_vhost(h, vhost, sizeof vhost);
    snprintf(path, sizeof path, "/api/queues/%s?columns=name",
             strcmp(vhost, "/") == 0 ? "%2f" : vhost);
    if (h_http(h, "GET", path, NULL, NULL) != 200) {
        return;
    }
    json_t *list = json_load_file(h_path(h, "http.out"), 0, NULL);
    amqp_connection_state_t conn = list ? try_open(h) : NULL;
    size_t len = strlen(h->prefix);
    size_t i;
    json_t *q;
    json_array_foreach(conn ? list : NULL, i, q) {
        const char *name = json_string_value(json_object_get(q, "name"));
        if (name && strncmp(name, h->prefix, len) == 0 && name[len] == '.') {
            amqp_queue_delete(conn, 1, amqp_cstring_bytes(name), 0, 0);
            if (amqp_get_rpc_reply(conn).reply_type != AMQP_RESPONSE_NORMAL) {
                break; /* the channel is gone; the rest stays */
            }
        }
    }
    if (conn) {
        h_amqp_close(conn);
    }
    json_decref(list);
}

void h_teardown(h_ctx_t *h) {
    sf_close(h->db);
    h->db = NULL;
    if (getenv("LAPSE_TEST_KEEP")) {
        if (h->pg) {
            fprintf(stderr, "harness: kept database %s\n", h->sf.db);
        }
        return;
    }
    delete_queues(h);
    if (h->pg) {
        sf_drop(&h->sf);
    }
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", h->dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "harness: could not remove %s\n", h->dir);
    }
}

const char *h_path(h_ctx_t *h, const char *file) {
    static char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", h->dir, file);
    return path;
}

/* argv: lapse [--amqp URL --store URI --prefix P --classes C] <args...> */
static char **build_argv(h_ctx_t *h, bool globals, const char *const *args,
                         size_t n_args) {
    char **argv = calloc(n_args + 10, sizeof *argv);
    size_t i = 0;
    argv[i++] = (char *)h->bin;
    if (globals) {
        argv[i++] = (char *)"--amqp";
        argv[i++] = h->amqp;
        argv[i++] = (char *)"--store";
        argv[i++] = h->store;
        argv[i++] = (char *)"--prefix";
        argv[i++] = h->prefix;
        argv[i++] = (char *)"--classes";
        argv[i++] = h->classes;
    }
    for (size_t k = 0; k < n_args; k++) {
        argv[i++] = (char *)args[k];
    }
    argv[i] = NULL;
    return argv;
}

static pid_t spawn_env(h_ctx_t *h, bool globals, const char *const *args, size_t n_args,
                       int in_fd, int out_fd, const char *err_file, char **envp) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (in_fd >= 0) {
        posix_spawn_file_actions_adddup2(&fa, in_fd, 0);
    } else {
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    }
    if (out_fd >= 0) {
        posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    } else {
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    }
    char err_path[PATH_MAX + 64];
    snprintf(err_path, sizeof err_path, "%s/%s", h->dir, err_file);
    posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_APPEND,
                                     0644);
    char **argv = build_argv(h, globals, args, n_args);
    pid_t pid;
    int rc = posix_spawn(&pid, h->bin, &fa, NULL, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    free(argv);
    if (rc != 0) {
        die("spawn %s: %s", h->bin, strerror(rc));
    }
    live_add(pid);
    return pid;
}

static pid_t spawn(h_ctx_t *h, bool globals, const char *const *args, size_t n_args,
                   int in_fd, int out_fd, const char *err_file) {
    return spawn_env(h, globals, args, n_args, in_fd, out_fd, err_file, environ);
}

/* Run lapse to completion, stdout into out, stderr appended to cli.log. */
static int run_capture(h_ctx_t *h, bool globals, const char *const *args, size_t n,
                       char *out, size_t cap) {
    char tmpl[PATH_MAX + 32];
    snprintf(tmpl, sizeof tmpl, "%s/out.XXXXXX", h->dir);
    int fd = mkstemp(tmpl);
    if (fd < 0) {
        die("mkstemp: %s", strerror(errno));
    }
    pid_t pid = spawn(h, globals, args, n, -1, fd, "cli.log");
    int code = h_stop(pid, 0, h_ms(120000));
    if (out && cap > 0) {
        lseek(fd, 0, SEEK_SET);
        ssize_t got = read(fd, out, cap - 1);
        out[got > 0 ? got : 0] = '\0';
    }
    close(fd);
    unlink(tmpl);
    return code;
}

/* The NULL-terminated variadic arguments after cap, at most 63. */
#define COLLECT_ARGS(args, n, cap)                                                       \
    do {                                                                                 \
        va_list ap;                                                                      \
        va_start(ap, cap);                                                               \
        for (const char *a; (a = va_arg(ap, const char *)) != NULL && n < 63;) {         \
            args[n++] = a;                                                               \
        }                                                                                \
        va_end(ap);                                                                      \
    } while (0)

int h_lapse(h_ctx_t *h, char *out, size_t cap, ...) {
    const char *args[64];
    size_t n = 0;
    COLLECT_ARGS(args, n, cap);
    return run_capture(h, true, args, n, out, cap);
}

int h_run(h_ctx_t *h, char *out, size_t cap, ...) {
    const char *args[64];
    size_t n = 0;
    COLLECT_ARGS(args, n, cap);
    return run_capture(h, false, args, n, out, cap);
}

pid_t h_spawn_consumer(h_ctx_t *h, const char *log, const char *const *extra) {
    const char *args[16] = {"consume"};
    size_t n = 1;
    for (size_t i = 0; extra && extra[i] && n < 15; i++) {
        args[n++] = extra[i];
    }
    return spawn(h, true, args, n, -1, -1, log);
}

pid_t h_spawn(h_ctx_t *h, const char *log, const char *const *args) {
    size_t n = 0;
    while (args[n]) {
        n++;
    }
    return spawn(h, true, args, n, -1, -1, log);
}

pid_t h_spawn_stdin(h_ctx_t *h, const char *log, const char *const *args, int *stdin_fd) {
    size_t n = 0;
    while (args[n]) {
        n++;
    }
    int fds[2];
    if (pipe(fds) != 0) {
        die("pipe: %s", strerror(errno));
    }
    /* Neither end leaks into later children (a curl, another lapse): the child's stdin
     * would otherwise stay open after the test closes its end. dup2 onto 0 clears the
     * flag for the child's copy. */
    fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    fcntl(fds[1], F_SETFD, FD_CLOEXEC);
    pid_t pid = spawn(h, true, args, n, fds[0], -1, log);
    close(fds[0]);
    *stdin_fd = fds[1];
    return pid;
}

pid_t h_spawn_env(h_ctx_t *h, const char *log, const char *const *args,
                  const char *const *env) {
    size_t n = 0;
    while (args[n]) {
        n++;
    }
    size_t n_env = 0;
    while (env[n_env]) {
        n_env++;
    }
    size_t n_environ = 0;
    while (environ[n_environ]) {
        n_environ++;
    }
    /* The test's environment, but the variables env sets, then env. */
    char **envp = calloc(n_environ + n_env + 2, sizeof *envp);
    size_t k = 0;
    bool preload = false;
    for (size_t j = 0; j < n_env; j++) {
        preload |= strncmp(env[j], "LD_PRELOAD=", 11) == 0;
    }
    static char asan[1024];
    if (preload) {
        const char *old = getenv("ASAN_OPTIONS");
        snprintf(asan, sizeof asan, "ASAN_OPTIONS=%s%sverify_asan_link_order=0",
                 old ? old : "", old && old[0] ? ":" : "");
    }
    for (size_t i = 0; i < n_environ; i++) {
        bool replaced = false;
        for (size_t j = 0; j < n_env && !replaced; j++) {
            size_t len = strcspn(env[j], "=");
            replaced = strncmp(environ[i], env[j], len) == 0 && environ[i][len] == '=';
        }
        if (preload && strncmp(environ[i], "ASAN_OPTIONS=", 13) == 0) {
            replaced = true;
        }
        if (!replaced) {
            envp[k++] = environ[i];
        }
    }
    if (preload) {
        envp[k++] = asan;
    }
    for (size_t j = 0; j < n_env; j++) {
        envp[k++] = (char *)env[j];
    }
    envp[k] = NULL;
    pid_t pid = spawn_env(h, true, args, n, -1, -1, log, envp);
    free(envp);
    return pid;
}

bool h_faketime_available(void) {
    /* Preloaded into a sanitized lapse (which links libpq and what it pulls in), the
     * library stops in its own initialisation ("Unexpected recursive calls to
     * clock_gettime()") and the process never gets going; the normal build runs these
     * tests in full. The multiplier is how the tests know the build is sanitized. */
    const char *m = getenv("LAPSE_TEST_TIMEOUT_MULTIPLIER");
    if (m != NULL && atoi(m) > 1) {
        printf("libfaketime left out: it hangs at start in the sanitized build\n");
        fflush(stdout);
        return false;
    }
    return access(H_LIBFAKETIME, R_OK) == 0;
}

bool h_alive(pid_t pid) {
    int status;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
        live_remove(pid);
    }
    return r == 0;
}

int h_stop(pid_t pid, int sig, int timeout_ms) {
    if (sig) {
        kill(pid, sig);
    }
    int64_t until = now_ms() + timeout_ms;
    int status;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            live_remove(pid);
            break;
        }
        if (now_ms() > until) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            live_remove(pid);
            return -1;
        }
        usleep(10000);
    }
    if (WIFEXITED(status)) {
        return WEXITSTATUS(status);
    }
    return 128 + WTERMSIG(status);
}

size_t h_pay_in_time(h_ctx_t *h, int n, bool (*pick)(int)) {
    lapse_status_t rc;
    lapse_store_t *store = lapse_store_open(h->store, &rc, NULL);
    if (!store) {
        die("open %s: %s", h->store, lapse_strerror(rc));
    }
    size_t paid = 0;
    for (int i = 0; i < n; i++) {
        if (pick(i)) {
            char id[32];
            snprintf(id, sizeof id, "ord-%d", i);
            paid += lapse_store_pay(store, id, lapse_clock_now_ms(), NULL) == LAPSE_OK;
        }
    }
    lapse_store_close(store);
    return paid;
}

static sf_conn_t *db_of(h_ctx_t *h) {
    if (!h->db) {
        char err[1024];
        h->db = sf_connect(&h->sf, true, err, sizeof err);
        if (!h->db) {
            die("%s", err);
        }
    }
    return h->db;
}

static int64_t sql_int_v(h_ctx_t *h, const char *fmt, va_list ap) {
    char *sql = sqlite3_vmprintf(fmt, ap);
    char err[2048];
    int64_t v = -1;
    if (sf_query_int(db_of(h), sql, &v, err, sizeof err) != 0) {
        die("%s", err);
    }
    sqlite3_free(sql);
    return v;
}

int64_t h_sql_int(h_ctx_t *h, const char *sql_fmt, ...) {
    va_list ap;
    va_start(ap, sql_fmt);
    int64_t v = sql_int_v(h, sql_fmt, ap);
    va_end(ap);
    return v;
}

int h_claim_wait_ms(const h_ctx_t *h) {
    return h->pg ? LAPSE_STORE_EVENT_CLAIM_MS + CONSUMER_BACKLOG_EVERY_MS : 0;
}

bool h_store_exists(h_ctx_t *h) {
    return sf_exists(&h->sf);
}

void h_sql_exec(h_ctx_t *h, const char *sql_fmt, ...) {
    va_list ap;
    va_start(ap, sql_fmt);
    char *sql = sqlite3_vmprintf(sql_fmt, ap);
    va_end(ap);
    char err[2048];
    sf_conn_t *c = sf_connect(&h->sf, false, err, sizeof err);
    if (!c || sf_exec(c, sql, err, sizeof err) != 0) {
        die("%s", err);
    }
    sf_close(c);
    sqlite3_free(sql);
}

/* A wait that ran out says so in the test's output, whether or not the caller asserts
 * its result: a check that waits out its whole timeout every time shows up here. */
static void ran_out(const char *what, const char *on, int64_t got, int64_t want,
                    int timeout_ms) {
    fprintf(stderr, "harness: wait ran out after %d ms: %s got %lld, want %lld: %s\n",
            timeout_ms, what, (long long)got, (long long)want, on);
}

int64_t h_wait_sql(h_ctx_t *h, int64_t expect, int timeout_ms, const char *sql_fmt, ...) {
    int64_t until = now_ms() + timeout_ms;
    int64_t v;
    for (;;) {
        va_list ap;
        va_start(ap, sql_fmt);
        v = sql_int_v(h, sql_fmt, ap);
        va_end(ap);
        if (v == expect) {
            return v;
        }
        if (now_ms() > until) {
            ran_out("sql", sql_fmt, v, expect, timeout_ms);
            return v;
        }
        usleep(50000);
    }
}

int64_t h_wait_outbox_empty(h_ctx_t *h, int timeout_ms) {
    return h_wait_sql(h, 0, timeout_ms, sf_sql_unpublished(h->sf.backend));
}

size_t h_count_lines(h_ctx_t *h, const char *file, const char *needle) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", h->dir, file);
    FILE *f = fopen(path, "r");
    if (!f) {
        return 0;
    }
    char *line = NULL;
    size_t cap = 0;
    size_t n = 0;
    while (getline(&line, &cap, f) >= 0) {
        n += strstr(line, needle) != NULL;
    }
    free(line);
    fclose(f);
    return n;
}

size_t h_wait_lines(h_ctx_t *h, const char *file, const char *needle, size_t want,
                    int timeout_ms) {
    int64_t until = now_ms() + timeout_ms;
    for (;;) {
        size_t n = h_count_lines(h, file, needle);
        if (n >= want) {
            return n;
        }
        if (now_ms() > until) {
            ran_out("lines", needle, (int64_t)n, (int64_t)want, timeout_ms);
            return n;
        }
        usleep(20000);
    }
}

static void check_reply(amqp_connection_state_t conn, const char *what) {
    amqp_rpc_reply_t r = amqp_get_rpc_reply(conn);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
        die("%s failed (reply type %d)", what, (int)r.reply_type);
    }
}

amqp_connection_state_t h_amqp_open(h_ctx_t *h) {
    char url[512];
    snprintf(url, sizeof url, "%s", h->amqp);
    struct amqp_connection_info info;
    if (amqp_parse_url(url, &info) != AMQP_STATUS_OK) {
        die("bad url %s", h->amqp);
    }
    char vhost[256];
    snprintf(vhost, sizeof vhost, "%s", info.vhost);
    if (strcmp(vhost, "%2f") == 0 || strcmp(vhost, "%2F") == 0) {
        strcpy(vhost, "/");
    }
    amqp_connection_state_t conn = amqp_new_connection();
    amqp_socket_t *socket = amqp_tcp_socket_new(conn);
    if (amqp_socket_open(socket, info.host, info.port) != AMQP_STATUS_OK) {
        die("cannot connect to %s:%d", info.host, info.port);
    }
    amqp_rpc_reply_t r = amqp_login(conn, vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN,
                                    info.user, info.password);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
        die("login failed");
    }
    amqp_channel_open(conn, 1);
    check_reply(conn, "channel.open");
    return conn;
}

void h_amqp_close(amqp_connection_state_t conn) {
    amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
    amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(conn);
}

void h_tap(h_ctx_t *h, amqp_connection_state_t conn, const char *suffix,
           const char *exchange, const char *routing_key) {
    char queue[256];
    snprintf(queue, sizeof queue, "%s.%s", h->prefix, suffix);
    amqp_queue_declare(conn, 1, amqp_cstring_bytes(queue), 0, 1, 0, 0, amqp_empty_table);
    check_reply(conn, "tap declare");
    amqp_queue_bind(conn, 1, amqp_cstring_bytes(queue), amqp_cstring_bytes(exchange),
                    amqp_cstring_bytes(routing_key), amqp_empty_table);
    check_reply(conn, "tap bind");
}

const char *h_tap_events(h_ctx_t *h, amqp_connection_state_t conn) {
    char events_x[128];
    snprintf(events_x, sizeof events_x, "%s.events", h->prefix);
    h_tap(h, conn, "tap", events_x, "#");
    return h->tap;
}

static void header_str(const amqp_basic_properties_t *p, const char *key, char *buf,
                       size_t cap) {
    buf[0] = '\0';
    if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG)) {
        return;
    }
    for (int i = 0; i < p->headers.num_entries; i++) {
        amqp_table_entry_t *e = &p->headers.entries[i];
        if (e->key.len == strlen(key) && memcmp(e->key.bytes, key, e->key.len) == 0 &&
            (e->value.kind == AMQP_FIELD_KIND_UTF8 ||
             e->value.kind == AMQP_FIELD_KIND_BYTES)) {
            size_t n =
                e->value.value.bytes.len < cap - 1 ? e->value.value.bytes.len : cap - 1;
            memcpy(buf, e->value.value.bytes.bytes, n);
            buf[n] = '\0';
        }
    }
}

static int64_t header_i64(const amqp_basic_properties_t *p, const char *key) {
    if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG)) {
        return -1;
    }
    for (int i = 0; i < p->headers.num_entries; i++) {
        amqp_table_entry_t *e = &p->headers.entries[i];
        if (e->key.len == strlen(key) && memcmp(e->key.bytes, key, e->key.len) == 0) {
            switch (e->value.kind) {
                case AMQP_FIELD_KIND_I64:
                    return e->value.value.i64;
                case AMQP_FIELD_KIND_U64:
                    return (int64_t)e->value.value.u64;
                case AMQP_FIELD_KIND_I32:
                    return e->value.value.i32;
                case AMQP_FIELD_KIND_U32:
                    return e->value.value.u32;
                default:
                    return -1;
            }
        }
    }
    return -1;
}

static void bytes_str(amqp_bytes_t b, char *buf, size_t cap) {
    size_t n = b.len < cap - 1 ? b.len : cap - 1;
    if (n > 0) {
        memcpy(buf, b.bytes, n);
    }
    buf[n] = '\0';
}

size_t h_drain(amqp_connection_state_t conn, const char *queue, int idle_ms, h_msg_cb cb,
               void *opaque) {
    size_t n = 0;
    int64_t idle_until = now_ms() + idle_ms;
    while (now_ms() <= idle_until) {
        amqp_rpc_reply_t r = amqp_basic_get(conn, 1, amqp_cstring_bytes(queue), 1);
        if (r.reply_type != AMQP_RESPONSE_NORMAL) {
            die("basic.get %s failed", queue);
        }
        if (r.reply.id == AMQP_BASIC_GET_EMPTY_METHOD) {
            usleep(50000);
            continue;
        }
        amqp_basic_get_ok_t *ok = r.reply.decoded;
        amqp_message_t msg;
        if (amqp_read_message(conn, 1, &msg, 0).reply_type != AMQP_RESPONSE_NORMAL) {
            die("read message from %s", queue);
        }
        h_msg_t m = {.len = msg.body.len, .redelivered = ok->redelivered};
        m.body = malloc(msg.body.len + 1);
        if (msg.body.len > 0) { /* an empty body has bytes == NULL */
            memcpy(m.body, msg.body.bytes, msg.body.len);
        }
        m.body[msg.body.len] = '\0';
        if (msg.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) {
            size_t l = msg.properties.message_id.len;
            l = l < sizeof m.message_id - 1 ? l : sizeof m.message_id - 1;
            memcpy(m.message_id, msg.properties.message_id.bytes, l);
            m.message_id[l] = '\0';
        }
        header_str(&msg.properties, "x-lapse-reason", m.reason, sizeof m.reason);
        header_str(&msg.properties, "x-lapse-deadline", m.deadline, sizeof m.deadline);
        m.deadline_ms = header_i64(&msg.properties, "x-lapse-deadline-ms");
        const amqp_basic_properties_t *p = &msg.properties;
        if (p->_flags & AMQP_BASIC_TYPE_FLAG) {
            bytes_str(p->type, m.type, sizeof m.type);
        }
        if (p->_flags & AMQP_BASIC_APP_ID_FLAG) {
            bytes_str(p->app_id, m.app_id, sizeof m.app_id);
        }
        if (p->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG) {
            bytes_str(p->content_type, m.content_type, sizeof m.content_type);
        }
        if (p->_flags & AMQP_BASIC_DELIVERY_MODE_FLAG) {
            m.delivery_mode = p->delivery_mode;
        }
        if (cb) {
            cb(opaque, &m);
        }
        free(m.body);
        amqp_destroy_message(&msg);
        n++;
        idle_until = now_ms() + idle_ms;
    }
    amqp_maybe_release_buffers(conn);
    return n;
}

void h_publish_raw(amqp_connection_state_t conn, const char *exchange,
                   const char *routing_key, const void *body, size_t len,
                   const char *message_id) {
    amqp_basic_properties_t props;
    memset(&props, 0, sizeof props);
    props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG;
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    if (message_id) {
        props._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
        props.message_id = amqp_cstring_bytes(message_id);
    }
    amqp_bytes_t b = {.len = len, .bytes = (void *)body};
    if (amqp_basic_publish(conn, 1, amqp_cstring_bytes(exchange),
                           amqp_cstring_bytes(routing_key), 0, 0, &props, b) != 0) {
        die("publish to %s failed", exchange);
    }
}

int64_t h_queue_depth(amqp_connection_state_t conn, const char *queue) {
    amqp_queue_declare_ok_t *ok = amqp_queue_declare(conn, 1, amqp_cstring_bytes(queue),
                                                     1, 0, 0, 0, amqp_empty_table);
    check_reply(conn, "passive declare");
    return ok->message_count;
}

int64_t h_wait_depth(amqp_connection_state_t conn, const char *queue, int64_t want,
                     int timeout_ms) {
    int64_t until = now_ms() + timeout_ms;
    int64_t depth = h_queue_depth(conn, queue);
    while (depth != want && now_ms() < until) {
        usleep(50 * 1000);
        depth = h_queue_depth(conn, queue);
    }
    if (depth != want) {
        ran_out("depth", queue, depth, want, timeout_ms);
    }
    return depth;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

void h_sort(int64_t *v, size_t n) {
    qsort(v, n, sizeof *v, cmp_i64);
}

int64_t h_percentile(const int64_t *sorted, size_t n, double p) {
    if (n == 0) {
        return -1;
    }
    size_t idx = (size_t)((p / 100.0) * (double)(n - 1) + 0.5);
    return sorted[idx < n ? idx : n - 1];
}

int64_t h_now_ms(void) {
    return now_ms();
}

struct h_watch {
    pthread_t thread;
    sf_store_t store;
    volatile int stop;
    int64_t early;
    int64_t polls;
};

typedef struct watch_rows {
    int64_t deadlines[64];
    char ids[64][64];
    int n;
} watch_rows_t;

static void watch_row(void *opaque, int n_cols, const char *const *values) {
    watch_rows_t *r = opaque;
    if (r->n < 64 && n_cols == 2 && values[0] && values[1]) {
        snprintf(r->ids[r->n], sizeof r->ids[r->n], "%s", values[0]);
        r->deadlines[r->n++] = strtoll(values[1], NULL, 10);
    }
}

/* A cancellation read back at time t was committed at or before t; an order whose
 * deadline is still ahead of t was therefore cancelled early. Rows with a deadline
 * between the query's start and end are ambiguous by at most the query's duration and
 * are left alone. */
static void *watch_main(void *arg) {
    h_watch_t *w = arg;
    sf_conn_t *db = NULL;
    bool ready = false;
    char err[1024];
    while (!w->stop) {
        if (!db) {
            /* A SQLite store file appears with the first lapse command that opens it. */
            db = sf_connect(&w->store, true, err, sizeof err);
            if (!db) {
                usleep(5000);
                continue;
            }
        }
        /* Asked first, so that PostgreSQL's log does not fill with missing tables. */
        if (!ready && !(ready = sf_table_exists(db, "orders"))) {
            usleep(5000);
            continue;
        }
        int64_t before = now_ms();
        char sql[256];
        snprintf(sql, sizeof sql,
                 "SELECT order_id, deadline_ms FROM orders WHERE status = 'cancelled'"
                 " AND deadline_ms > %lld",
                 (long long)before);
        watch_rows_t rows;
        rows.n = 0;
        if (sf_query_rows(db, sql, watch_row, &rows, err, sizeof err) < 0) {
            fprintf(stderr, "watch: %s\n", err);
            usleep(5000);
            continue;
        }
        int64_t after = now_ms();
        for (int i = 0; i < rows.n; i++) {
            if (rows.deadlines[i] > after) {
                fprintf(stderr, "watch: %s seen cancelled %lld ms before its deadline\n",
                        rows.ids[i], (long long)(rows.deadlines[i] - after));
                w->early++;
            }
        }
        w->polls++;
        usleep(5000);
    }
    sf_close(db);
    return NULL;
}

h_watch_t *h_watch_start(h_ctx_t *h) {
    h_watch_t *w = calloc(1, sizeof *w);
    w->store = h->sf;
    if (pthread_create(&w->thread, NULL, watch_main, w) != 0) {
        die("pthread_create");
    }
    return w;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Orders named more than once as cancelled across the logs. */
static int64_t doubled_in_logs(h_ctx_t *h, const char *const *logs) {
    char **ids = NULL;
    size_t n = 0, cap = 0;
    for (size_t k = 0; logs && logs[k]; k++) {
        FILE *f = fopen(h_path(h, logs[k]), "r");
        if (!f) {
            continue;
        }
        char *line = NULL;
        size_t lcap = 0;
        while (getline(&line, &lcap, f) >= 0) {
            if (!strstr(line, "decision=cancelled ") &&
                !strstr(line, "event=sweep_cancel ")) {
                continue;
            }
            const char *p = strstr(line, "order_id=");
            if (!p) {
                continue;
            }
            p += strlen("order_id=");
            size_t len = strcspn(p, " \n");
            if (n == cap) {
                cap = cap ? 2 * cap : 1024;
                ids = realloc(ids, cap * sizeof *ids);
            }
            ids[n++] = strndup(p, len);
        }
        free(line);
        fclose(f);
    }
    qsort(ids, n, sizeof *ids, cmp_str);
    int64_t doubled = 0;
    for (size_t i = 1; i < n; i++) {
        if (strcmp(ids[i], ids[i - 1]) == 0 &&
            (i < 2 || strcmp(ids[i - 1], ids[i - 2]) != 0)) {
            fprintf(stderr, "laws: %s cancelled more than once in the logs\n", ids[i]);
            doubled++;
        }
    }
    for (size_t i = 0; i < n; i++) {
        free(ids[i]);
    }
    free(ids);
    return doubled;
}

void h_check_laws(h_ctx_t *h, const char *const *logs, h_watch_t *w, h_laws_t *out) {
    memset(out, 0, sizeof *out);
    int64_t watched_early = 0;
    if (w) {
        w->stop = 1;
        pthread_join(w->thread, NULL);
        watched_early = w->early;
        out->watch_polls = w->polls;
        free(w);
    }
    int64_t now = now_ms();
    out->orders = h_sql_int(h, "SELECT count(*) FROM orders");
    out->paid = h_sql_int(h, "SELECT count(*) FROM orders WHERE status='paid'");
    out->cancelled = h_sql_int(h, "SELECT count(*) FROM orders WHERE status='cancelled'");
    out->pending = h_sql_int(h, "SELECT count(*) FROM orders WHERE status='pending'");
    out->lost = h_sql_int(
        h, "SELECT count(*) FROM orders WHERE status='pending' AND deadline_ms <= %lld",
        (long long)now);
    out->wrong = h_sql_int(h, "SELECT count(*) FROM orders o WHERE status='paid' AND"
                              " (cancelled_at_ms IS NOT NULL OR paid_at_ms >= deadline_ms"
                              " OR EXISTS (SELECT 1 FROM events e"
                              " WHERE e.order_id=o.order_id))");
    out->early =
        watched_early + h_sql_int(h, "SELECT count(*) FROM orders WHERE "
                                     "status='cancelled' AND (cancelled_at_ms IS "
                                     "NULL OR cancelled_at_ms < deadline_ms)");
    out->doubled =
        h_sql_int(h, "SELECT count(*) FROM (SELECT order_id FROM events GROUP BY order_id"
                     " HAVING count(*) > 1) AS d");
    int64_t in_logs = doubled_in_logs(h, logs);
    out->doubled = in_logs > out->doubled ? in_logs : out->doubled;
    out->no_event =
        h_sql_int(h, "SELECT count(*) FROM orders o WHERE status='cancelled'"
                     " AND (SELECT count(*) FROM events e"
                     " WHERE e.order_id=o.order_id) != 1") +
        h_sql_int(h, "SELECT count(*) FROM events WHERE order_id NOT IN"
                     " (SELECT order_id FROM orders WHERE status='cancelled')");
    out->holds_wrong = h_sql_int(h, "SELECT count(*) FROM holds h JOIN orders o USING"
                                    " (order_id) WHERE (h.released_at_ms IS NOT NULL) !="
                                    " (o.status = 'cancelled') OR (o.status = 'cancelled'"
                                    " AND h.released_at_ms != o.cancelled_at_ms)");
    out->unpublished = h_sql_int(h, sf_sql_unpublished(h->sf.backend));
    out->max_lag_ms = out->cancelled
                          ? h_sql_int(h, "SELECT max(cancelled_at_ms - deadline_ms) FROM "
                                         "orders WHERE status='cancelled'")
                          : -1;
}

void h_print_matrix(const char *row, const h_laws_t *l, const char *extra) {
    char line[512];
    snprintf(line, sizeof line,
             "matrix %s orders=%lld lost=%lld doubled=%lld early=%lld max_lag_ms=%lld"
             " | paid=%lld cancelled=%lld pending=%lld wrong=%lld no_event=%lld"
             " holds_wrong=%lld unpublished=%lld watch_polls=%lld%s%s",
             row, (long long)l->orders, (long long)l->lost, (long long)l->doubled,
             (long long)l->early, (long long)l->max_lag_ms, (long long)l->paid,
             (long long)l->cancelled, (long long)l->pending, (long long)l->wrong,
             (long long)l->no_event, (long long)l->holds_wrong, (long long)l->unpublished,
             (long long)l->watch_polls, extra ? " " : "", extra ? extra : "");
    printf("%s\n", line);
    fflush(stdout);
}

typedef struct tap_ids {
    char **ids;
    size_t n, cap;
} tap_ids_t;

static void collect_event(void *opaque, const h_msg_t *m) {
    tap_ids_t *t = opaque;
    const char *pfx = "order.cancelled:";
    if (strncmp(m->message_id, pfx, strlen(pfx)) != 0) {
        return;
    }
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 1024;
        t->ids = realloc(t->ids, t->cap * sizeof *t->ids);
    }
    t->ids[t->n++] = strdup(m->message_id + strlen(pfx));
}

size_t h_tap_event_orders(amqp_connection_state_t conn, const char *queue,
                          size_t *total) {
    tap_ids_t t = {0};
    *total = h_drain(conn, queue, 500, collect_event, &t);
    qsort(t.ids, t.n, sizeof *t.ids, cmp_str);
    size_t distinct = 0;
    for (size_t i = 0; i < t.n; i++) {
        distinct += i == 0 || strcmp(t.ids[i], t.ids[i - 1]) != 0;
    }
    for (size_t i = 0; i < t.n; i++) {
        free(t.ids[i]);
    }
    free(t.ids);
    return distinct;
}

int64_t h_topology_depth(h_ctx_t *h, amqp_connection_state_t conn) {
    char q[256];
    int64_t total = 0;
    char classes[128];
    snprintf(classes, sizeof classes, "%s", h->classes);
    char *save = NULL;
    for (char *c = strtok_r(classes, ",", &save); c; c = strtok_r(NULL, ",", &save)) {
        snprintf(q, sizeof q, "%s.hold.%s", h->prefix, c);
        total += h_queue_depth(conn, q);
    }
    for (int k = 0; k < 28; k++) {
        snprintf(q, sizeof q, "%s.delay.%02d", h->prefix, k);
        total += h_queue_depth(conn, q);
    }
    snprintf(q, sizeof q, "%s.expired", h->prefix);
    return total + h_queue_depth(conn, q);
}

long h_status_kb(pid_t pid, const char *field) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) {
        return -1;
    }
    char line[256];
    size_t n = strlen(field);
    long kb = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, field, n) == 0 && line[n] == ':' &&
            sscanf(line + n + 1, " %ld kB", &kb) == 1) {
            break;
        }
    }
    fclose(f);
    return kb;
}

long h_rss_kb(pid_t pid) {
    return h_status_kb(pid, "VmRSS");
}

int h_group_ensure_node(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "ensure-node", "2s", false);
    int rc = 0;
    if (h_node(&h, "status") != 0) {
        fprintf(stderr, "the test node is down: restarting it\n");
        rc = h_node(&h, "restart") == 0 ? 0 : -1;
    }
    h_teardown(&h);
    return rc;
}

int h_node(h_ctx_t *h, const char *cmd) {
    const char *node = getenv("LAPSE_TEST_NODE");
    if (!node) {
        die("LAPSE_TEST_NODE must be set (run through ctest)");
    }
    return h_node_named(h, cmd, node);
}

int h_node_named(h_ctx_t *h, const char *cmd, const char *node) {
    const char *script = getenv("LAPSE_NODE_SCRIPT");
    if (!script) {
        die("LAPSE_NODE_SCRIPT must be set (run through ctest)");
    }
    char line[PATH_MAX * 2 + 64];
    snprintf(line, sizeof line, "'%s' %s '%s' >>'%s/node.log' 2>&1", script, cmd, node,
             h->dir);
    int st = system(line);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int h_http(h_ctx_t *h, const char *method, const char *path, const char *body_file,
           const char *body) {
    const char *base = getenv("LAPSE_TEST_MGMT_URL");
    if (!base) {
        die("LAPSE_TEST_MGMT_URL must be set (run through ctest)");
    }
    char url[1024], data[PATH_MAX + 8], resp[PATH_MAX + 160], code_path[PATH_MAX + 160];
    snprintf(url, sizeof url, "%s%s", base, path);
    /* First: body_file may be h_path's static buffer, which the next lines reuse. */
    snprintf(data, sizeof data, "@%s", body_file ? body_file : "");
    snprintf(resp, sizeof resp, "%s", h_path(h, "http.out"));
    snprintf(code_path, sizeof code_path, "%s", h_path(h, "http.code"));
    const char *argv[24];
    size_t n = 0;
    argv[n++] = "curl";
    argv[n++] = "-sS";
    argv[n++] = "--max-time";
    argv[n++] = "30";
    argv[n++] = "-u";
    argv[n++] = "guest:guest";
    argv[n++] = "-o";
    argv[n++] = resp;
    argv[n++] = "-w";
    argv[n++] = "%{http_code}";
    argv[n++] = "-X";
    argv[n++] = method;
    if (body_file || body) {
        argv[n++] = "-H";
        argv[n++] = "content-type: application/json";
        argv[n++] = "--data-binary";
        argv[n++] = body_file ? data : body;
    }
    argv[n++] = url;
    argv[n] = NULL;

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, code_path, O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_addopen(&fa, 2, h_path(h, "curl.log"),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    pid_t pid;
    int rc = posix_spawnp(&pid, "curl", &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        fprintf(stderr, "spawn curl: %s\n", strerror(rc));
        return -1;
    }
    if (h_stop(pid, 0, h_ms(60000)) != 0) {
        return -1;
    }
    int status = -1;
    FILE *f = fopen(code_path, "r");
    if (f) {
        if (fscanf(f, "%d", &status) != 1) {
            status = -1;
        }
        fclose(f);
    }
    fprintf(stderr, "http %s %s -> %d\n", method, path, status);
    return status;
}

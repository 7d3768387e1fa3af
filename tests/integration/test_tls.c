/* SPDX-License-Identifier: MIT
 * Issue 13: amqps:// and the password file. tests/support/tls-proxy makes a CA and
 * certificates with openssl and puts stunnel's TLS listeners in front of the test
 * broker: a good certificate connects and the whole pipeline runs through it; a
 * certificate from a CA lapse does not trust, or for another host name, is refused with
 * one line naming the reason and exit 1 (a consumer included, which must not retry
 * forever); a listener that requires a client certificate refuses lapse without one and
 * takes it with one. A password given in a file works, and no password ever shows in
 * any output. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct tls_env {
    h_ctx_t h;
    char plain[512]; /* the test broker's own amqp:// URL */
    char pki[PATH_MAX + 16];
    int base; /* the good listener; +1 wrong host name; +2 client certificate required */
    pid_t stunnel;
} tls_env_t;

/* The environment of the test that runs, so that a failed one is cleaned up too. */
static tls_env_t *live;

static int env_int(const char *name, int def) {
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? atoi(v) : def;
}

static bool port_open(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    if (fd >= 0) {
        close(fd);
    }
    return ok;
}

/* The AMQP port of the test broker's URL (amqp://u:p@127.0.0.1:PORT/%2f). */
static int url_port(const char *url) {
    const char *at = strrchr(url, '@');
    const char *colon = at != NULL ? strchr(at, ':') : NULL;
    assert_non_null(colon);
    return atoi(colon + 1);
}

static void start(tls_env_t *t, const char *name) {
    memset(t, 0, sizeof *t);
    h_setup(&t->h, name, "2s", true);
    live = t;
    snprintf(t->plain, sizeof t->plain, "%s", t->h.amqp);
    t->base = env_int("LAPSE_TEST_TLS_PORT", 5676);
    snprintf(t->pki, sizeof t->pki, "%s/pki", t->h.dir);
    const char *src = getenv("LAPSE_SOURCE_DIR");
    assert_non_null(src);
    char proxy[PATH_MAX], cmd[3 * PATH_MAX];
    snprintf(proxy, sizeof proxy, "%s/tests/support/tls-proxy", src);
    snprintf(cmd, sizeof cmd, "'%s' setup '%s' %d %d", proxy, t->pki, url_port(t->plain),
             t->base);
    assert_int_equal(system(cmd), 0);
    for (int p = t->base; p <= t->base + 2; p++) {
        if (port_open(p)) {
            fail_msg("TLS test port %d is taken (LAPSE_TEST_TLS_PORT)", p);
        }
    }
    char *argv[] = {proxy, (char *)"run", t->pki, NULL};
    int out = open(h_path(&t->h, "stunnel.out"), O_WRONLY | O_CREAT | O_APPEND, 0600);
    assert_true(out >= 0);
    t->stunnel = fork();
    assert_true(t->stunnel >= 0);
    if (t->stunnel == 0) {
        /* stunnel (tls-proxy execs it) goes with the test, however the test ends. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        dup2(out, 1);
        dup2(out, 2);
        execv(proxy, argv);
        _exit(127);
    }
    close(out);
    for (int i = 0; i < 100 && !port_open(t->base + 2); i++) {
        usleep(100000);
    }
    assert_true(port_open(t->base) && port_open(t->base + 1) && port_open(t->base + 2));
    unsetenv("LAPSE_TLS_CA");
    unsetenv("LAPSE_TLS_CERT");
    unsetenv("LAPSE_TLS_KEY");
    unsetenv("LAPSE_AMQP_PASSWORD_FILE");
}

static void stop(tls_env_t *t) {
    if (t->stunnel <= 0) {
        return;
    }
    h_stop(t->stunnel, SIGTERM, 5000);
    t->stunnel = 0;
    /* The harness deletes the test's queues over the plain URL. */
    snprintf(t->h.amqp, sizeof t->h.amqp, "%s", t->plain);
    unsetenv("LAPSE_TLS_CA");
    unsetenv("LAPSE_TLS_CERT");
    unsetenv("LAPSE_TLS_KEY");
    unsetenv("LAPSE_AMQP_PASSWORD_FILE");
    h_teardown(&t->h);
    live = NULL;
}

/* After each test, passed or failed: no stunnel left listening on the test ports. */
static int teardown(void **state) {
    (void)state;
    if (live != NULL) {
        stop(live);
    }
    return 0;
}

/* Point every later lapse command of the test at amqps://guest:guest@HOST:PORT. */
static void use_tls(tls_env_t *t, const char *host, int port) {
    snprintf(t->h.amqp, sizeof t->h.amqp, "amqps://guest:guest@%s:%d/%%2f", host, port);
}

static const char *pki(tls_env_t *t, const char *file) {
    static char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", t->pki, file);
    return path;
}

/* The whole of <dir>/<file> (new, NUL-terminated; "" when missing). */
static char *slurp(h_ctx_t *h, const char *file) {
    FILE *f = fopen(h_path(h, file), "rb");
    char *text = calloc(1, 1 << 20);
    assert_non_null(text);
    if (f != NULL) {
        size_t n = fread(text, 1, (1 << 20) - 1, f);
        text[n] = '\0';
        fclose(f);
    }
    return text;
}

/* Run `lapse publish ID` expecting it to fail: exit 1, and the stderr it added to
 * cli.log is one line that holds want. With may_retry, that line may follow lines that
 * each announce a retry: see test_client_certificate_is_sent_when_given. */
static void assert_refused_as(tls_env_t *t, const char *id, const char *want,
                              bool may_retry) {
    char *before = slurp(&t->h, "cli.log");
    size_t skip = strlen(before);
    free(before);
    int code = h_lapse(&t->h, NULL, 0, "publish", id, "--timeout", "2s", NULL);
    char *all = slurp(&t->h, "cli.log");
    const char *said = all + skip;
    printf("%s -> exit %d: %s", t->h.amqp, code, said);
    assert_int_equal(code, 1);
    while (may_retry && strstr(said, "; retrying in ") != NULL &&
           strstr(said, "; retrying in ") < strchr(said, '\n')) {
        said = strchr(said, '\n') + 1;
    }
    if (strstr(said, want) == NULL) {
        fail_msg("expected \"%s\" in: %s", want, said);
    }
    assert_non_null(strstr(said, "ERR_BROKER_TLS"));
    /* One line. */
    assert_int_equal(strchr(said, '\n') - said + 1, (long)strlen(said));
    free(all);
}

static void assert_refused(tls_env_t *t, const char *id, const char *want) {
    assert_refused_as(t, id, want, false);
}

static void test_good_certificate_runs_the_pipeline(void **state) {
    (void)state;
    static tls_env_t t; /* static: the teardown reaches it after a failure */
    start(&t, "tls-good");
    h_ctx_t *h = &t.h;
    setenv("LAPSE_TLS_CA", pki(&t, "ca.pem"), 1);
    use_tls(&t, "localhost", t.base);
    pid_t consumer = h_spawn_consumer(h, "consumer.log", NULL);
    for (int i = 0; i < 6; i++) {
        char id[32];
        snprintf(id, sizeof id, "ord-%d", i);
        assert_int_equal(h_lapse(h, NULL, 0, "publish", id, "--timeout", "2s", NULL), 0);
    }
    assert_int_equal(h_lapse(h, NULL, 0, "pay", "ord-0", NULL), 0);
    assert_int_equal(h_lapse(h, NULL, 0, "pay", "ord-1", NULL), 0);
    assert_int_equal(h_wait_sql(h, 4, h_ms(30000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     4);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    assert_int_equal(h_sql_int(h, "SELECT count(*) FROM orders WHERE status='paid'"), 2);
    assert_int_equal(h_count_lines(h, "consumer.log", "decision=cancelled"), 4);
    /* The same listener by IP address: the certificate names 127.0.0.1 too. */
    use_tls(&t, "127.0.0.1", t.base);
    char out[8192];
    assert_int_equal(h_lapse(h, out, sizeof out, "status", NULL), 0);
    assert_non_null(strstr(out, "cancelled=4"));
    /* Through the TLS proxy, so the broker saw connections from stunnel. */
    char *log = slurp(h, "pki/stunnel.log");
    assert_non_null(strstr(log, "Service [good] accepted connection"));
    free(log);
    stop(&t);
}

static void test_untrusted_ca_and_wrong_host_are_refused(void **state) {
    (void)state;
    static tls_env_t t; /* static: the teardown reaches it after a failure */
    start(&t, "tls-refused");
    h_ctx_t *h = &t.h;
    /* Verified by default: the system's CAs do not know the test CA. */
    use_tls(&t, "localhost", t.base);
    assert_refused(&t, "ord-sys", "certificate verify failed for localhost");
    assert_refused(&t, "ord-sys", "unable to get local issuer certificate");
    /* A CA that signed nothing the listener shows. */
    setenv("LAPSE_TLS_CA", pki(&t, "other-ca.pem"), 1);
    assert_refused(&t, "ord-other", "unable to get local issuer certificate");
    /* The right CA, but a certificate for wrong.example. */
    setenv("LAPSE_TLS_CA", pki(&t, "ca.pem"), 1);
    use_tls(&t, "localhost", t.base + 1);
    assert_refused(&t, "ord-host", "hostname mismatch");
    use_tls(&t, "127.0.0.1", t.base + 1);
    assert_refused(&t, "ord-ip", "IP address mismatch");
    /* Nothing was recorded for orders that could not be scheduled... */
    assert_int_equal(h_sql_int(h, "SELECT count(*) FROM orders WHERE scheduled = 1"), 0);

    /* ...and a consumer that cannot verify the broker stops with exit 1 and one error
     * line, instead of retrying forever. */
    setenv("LAPSE_TLS_CA", pki(&t, "other-ca.pem"), 1);
    use_tls(&t, "localhost", t.base);
    pid_t consumer = h_spawn_consumer(h, "consumer.log", NULL);
    int code = h_stop(consumer, 0, h_ms(20000));
    char *log = slurp(h, "consumer.log");
    printf("consumer exit %d:\n%s", code, log);
    assert_int_equal(code, 1);
    assert_non_null(strstr(log, "unable to get local issuer certificate"));
    assert_null(strstr(log, "event=reconnect"));
    free(log);
    stop(&t);
}

static void test_client_certificate_is_sent_when_given(void **state) {
    (void)state;
    static tls_env_t t; /* static: the teardown reaches it after a failure */
    start(&t, "tls-client");
    h_ctx_t *h = &t.h;
    setenv("LAPSE_TLS_CA", pki(&t, "ca.pem"), 1);
    use_tls(&t, "localhost", t.base + 2);
    /* Under TLS 1.3 the broker refuses a missing client certificate after the
     * handshake, with an alert and a close. When the close overtakes the alert (the
     * proxy resets the connection that the client already wrote its AMQP header to),
     * the client sees only "a SSL error occurred" at login: a reason it cannot tell
     * from a broker going away, so it retries, and the next try reads the alert. The
     * final line must name the reason either way. */
    assert_refused_as(&t, "ord-nocert", "refused this client: certificate required",
                      true);
    setenv("LAPSE_TLS_CERT", pki(&t, "client.pem"), 1);
    setenv("LAPSE_TLS_KEY", pki(&t, "client.key"), 1);
    assert_int_equal(h_lapse(h, NULL, 0, "publish", "ord-cert", "--timeout", "2s", NULL),
                     0);
    assert_int_equal(
        h_sql_int(h, "SELECT count(*) FROM orders WHERE order_id='ord-cert' AND "
                     "scheduled = 1"),
        1);
    /* A certificate and a key that do not belong together: one line, before any
     * connection. */
    setenv("LAPSE_TLS_KEY", pki(&t, "server.key"), 1);
    assert_refused(&t, "ord-mismatch", "key values mismatch");
    /* TLS files with a plain URL: a usage error, not a silent plain connection. */
    snprintf(h->amqp, sizeof h->amqp, "%s", t.plain);
    assert_int_equal(h_lapse(h, NULL, 0, "publish", "ord-plain", "--timeout", "2s", NULL),
                     2);
    assert_int_equal(h_count_lines(h, "cli.log", "need an amqps:// URL"), 1);
    stop(&t);
}

/* Every output of the runs: no password anywhere. */
static void assert_nowhere(h_ctx_t *h, const char *secret, const char *const *files) {
    for (size_t i = 0; files[i] != NULL; i++) {
        char *text = slurp(h, files[i]);
        if (strstr(text, secret) != NULL) {
            fail_msg("the password shows in %s:\n%s", files[i], text);
        }
        free(text);
    }
}

static void append_out(h_ctx_t *h, const char *out) {
    FILE *f = fopen(h_path(h, "stdout.log"), "a");
    assert_non_null(f);
    fputs(out, f);
    fclose(f);
}

static void test_password_file_and_no_password_shown(void **state) {
    (void)state;
    static tls_env_t t; /* static: the teardown reaches it after a failure */
    start(&t, "tls-secret");
    h_ctx_t *h = &t.h;
    char user[64], secret[64], path[128], body[256];
    snprintf(user, sizeof user, "lapse-secret-%d", (int)getpid());
    snprintf(secret, sizeof secret, "Zq8-secret-%d-pw", (int)getpid());
    snprintf(path, sizeof path, "/api/users/%s", user);
    snprintf(body, sizeof body, "{\"password\":\"%s\",\"tags\":\"\"}", secret);
    int st = h_http(h, "PUT", path, NULL, body);
    assert_true(st == 201 || st == 204);
    snprintf(path, sizeof path, "/api/permissions/%%2F/%s", user);
    st = h_http(h, "PUT", path, NULL,
                "{\"configure\":\".*\",\"write\":\".*\",\"read\":\".*\"}");
    assert_true(st == 201 || st == 204);

    /* The password in a file, the URL without one (over TLS, as in production). */
    char file[PATH_MAX + 32];
    snprintf(file, sizeof file, "%s/amqp-password", h->dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fprintf(f, "%s\n", secret);
    fclose(f);
    chmod(file, 0600);
    setenv("LAPSE_TLS_CA", pki(&t, "ca.pem"), 1);
    snprintf(h->amqp, sizeof h->amqp, "amqps://%s@localhost:%d/%%2f", user, t.base);
    /* Without the file the login is refused (final, exit 1)... */
    assert_int_equal(h_lapse(h, NULL, 0, "publish", "ord-0", "--timeout", "2s", NULL), 1);
    assert_int_equal(h_count_lines(h, "cli.log", "ERR_BROKER_LOGIN"), 1);
    /* ...with it, everything works. */
    setenv("LAPSE_AMQP_PASSWORD_FILE", file, 1);
    pid_t consumer = h_spawn_consumer(h, "consumer.log", NULL);
    char out[16384];
    for (int i = 0; i < 3; i++) {
        char id[32];
        snprintf(id, sizeof id, "ord-%d", i);
        assert_int_equal(
            h_lapse(h, out, sizeof out, "publish", id, "--timeout", "2s", NULL), 0);
        append_out(h, out);
    }
    assert_int_equal(h_wait_sql(h, 3, h_ms(30000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     3);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    assert_int_equal(h_lapse(h, out, sizeof out, "status", NULL), 0);
    append_out(h, out);
    assert_int_equal(h_lapse(h, out, sizeof out, "status", "--json", NULL), 0);
    append_out(h, out);
    assert_int_equal(h_lapse(h, out, sizeof out, "config", NULL), 0);
    append_out(h, out);
    assert_non_null(strstr(out, "--amqp-password-file"));
    assert_non_null(strstr(out, file));
    assert_int_equal(h_lapse(h, out, sizeof out, "config", "--json", NULL), 0);
    append_out(h, out);

    /* An unreadable file: one line naming the file, exit 1, and the consumer stops
     * (exit 1) instead of retrying. */
    char missing[PATH_MAX + 32];
    snprintf(missing, sizeof missing, "%s/no-such-password", h->dir);
    setenv("LAPSE_AMQP_PASSWORD_FILE", missing, 1);
    assert_int_equal(h_lapse(h, NULL, 0, "publish", "ord-9", "--timeout", "2s", NULL), 1);
    assert_int_equal(h_count_lines(h, "cli.log", "no-such-password: No such file"), 1);
    consumer = h_spawn_consumer(h, "consumer-missing.log", NULL);
    assert_int_equal(h_stop(consumer, 0, h_ms(20000)), 1);
    assert_true(h_count_lines(h, "consumer-missing.log", "no-such-password") >= 1);
    assert_int_equal(h_count_lines(h, "consumer-missing.log", "event=reconnect"), 0);
    unsetenv("LAPSE_AMQP_PASSWORD_FILE");

    /* The password in the URL instead: shown nowhere either, not in `config`, not in
     * a failed login, not in the consumer's log. */
    snprintf(h->amqp, sizeof h->amqp, "amqps://%s:%s@localhost:%d/%%2f", user, secret,
             t.base);
    assert_int_equal(h_lapse(h, out, sizeof out, "config", NULL), 0);
    append_out(h, out);
    assert_non_null(strstr(out, ":***@localhost"));
    assert_int_equal(h_lapse(h, out, sizeof out, "config", "--json", NULL), 0);
    append_out(h, out);
    assert_int_equal(h_lapse(h, out, sizeof out, "status", NULL), 0);
    append_out(h, out);
    consumer = h_spawn_consumer(h, "consumer-url.log", NULL);
    usleep((useconds_t)h_ms(1500) * 1000);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    /* A broker that refuses the URL's vhost: the error names the URL's parts only. */
    snprintf(h->amqp, sizeof h->amqp, "amqps://%s:%s@localhost:%d/nope", user, secret,
             t.base);
    assert_int_equal(h_lapse(h, NULL, 0, "publish", "ord-8", "--timeout", "2s", NULL), 1);
    /* A bad URL: a usage error that does not repeat it. */
    snprintf(h->amqp, sizeof h->amqp, "amqps://%s:%s@localhost:99999/%%2f", user, secret);
    assert_int_equal(h_lapse(h, NULL, 0, "status", NULL), 2);

    assert_nowhere(h, secret,
                   (const char *const[]){"cli.log", "stdout.log", "consumer.log",
                                         "consumer-missing.log", "consumer-url.log",
                                         NULL});
    /* The files were written: the check above read something. */
    char *said = slurp(h, "stdout.log");
    assert_non_null(strstr(said, user));
    free(said);
    h_http(h, "DELETE", path, NULL, NULL);
    snprintf(path, sizeof path, "/api/users/%s", user);
    h_http(h, "DELETE", path, NULL, NULL);
    stop(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_good_certificate_runs_the_pipeline, teardown),
        cmocka_unit_test_teardown(test_untrusted_ca_and_wrong_host_are_refused, teardown),
        cmocka_unit_test_teardown(test_client_certificate_is_sent_when_given, teardown),
        cmocka_unit_test_teardown(test_password_file_and_no_password_shown, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

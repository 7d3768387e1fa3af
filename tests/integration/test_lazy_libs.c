/* SPDX-License-Identifier: MIT
 * Libraries loaded on first use (docs/design.md): a consumer maps libpq only on a
 * PostgreSQL store, libsqlite3 only on a SQLite one, libmicrohttpd only with
 * --metrics-listen and libsystemd only under a NOTIFY_SOCKET, and it cancels as ever
 * without them; each of the four that cannot be loaded is one clear error line and exit
 * 1 from the command that needs it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ORDERS 3

/* Whether the process has a file mapped whose name contains lib_name. */
static bool maps_library(pid_t pid, const char *lib_name) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[1024];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        found = strstr(line, lib_name) != NULL;
    }
    fclose(f);
    return found;
}

static void publish_orders(h_ctx_t *h, const char *tag) {
    for (int i = 0; i < ORDERS; i++) {
        char id[64];
        snprintf(id, sizeof id, "ord-%s-%d", tag, i);
        assert_int_equal(h_lapse(h, NULL, 0, "publish", id, "--timeout", "2s", NULL), 0);
    }
}

static void test_consumer_maps_only_what_it_uses(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "lazylibs", "2s", true);

    /* Plain: the store's library and nothing optional. */
    pid_t plain = h_spawn_consumer(&h, "plain.log", NULL);
    assert_int_equal(h_wait_lines(&h, "plain.log", "event=consuming", 1, h_ms(15000)), 1);
    publish_orders(&h, "plain");
    assert_int_equal(h_wait_sql(&h, ORDERS, h_ms(20000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     ORDERS);
    printf("plain consumer: libpq %d, libmicrohttpd %d, libsystemd %d (store %s)\n",
           maps_library(plain, "/libpq.so"), maps_library(plain, "/libmicrohttpd.so"),
           maps_library(plain, "/libsystemd.so"), h.pg ? "postgresql" : "sqlite");
    printf("plain consumer: libsqlite3 %d, libm %d\n",
           maps_library(plain, "/libsqlite3.so"), maps_library(plain, "/libm.so"));
    assert_int_equal(maps_library(plain, "/libpq.so"), h.pg);
    /* Each store's library only: a PostgreSQL consumer has no SQLite, nor its libm. */
    assert_int_equal(maps_library(plain, "/libsqlite3.so"), !h.pg);
    if (h.pg) {
        assert_false(maps_library(plain, "/libm.so"));
    }
    assert_false(maps_library(plain, "/libmicrohttpd.so"));
    assert_false(maps_library(plain, "/libsystemd.so"));
    if (!h.pg) {
        /* GnuTLS comes with libmicrohttpd, and with libpq's LDAP on PostgreSQL. */
        assert_false(maps_library(plain, "/libgnutls.so"));
    }
    assert_int_equal(h_stop(plain, SIGTERM, h_ms(15000)), 0);

    /* --metrics-listen: libmicrohttpd, loaded when the server starts, and it serves. */
    pid_t served = h_spawn_consumer(
        &h, "served.log", (const char *[]){"--metrics-listen", "127.0.0.1:0", NULL});
    assert_int_equal(
        h_wait_lines(&h, "served.log", "event=metrics_listening", 1, h_ms(15000)), 1);
    assert_int_equal(h_wait_lines(&h, "served.log", "event=consuming", 1, h_ms(15000)),
                     1);
    publish_orders(&h, "served");
    assert_int_equal(h_wait_sql(&h, 2 * ORDERS, h_ms(20000),
                                "SELECT count(*) FROM orders WHERE status='cancelled'"),
                     2 * ORDERS);
    assert_true(maps_library(served, "/libmicrohttpd.so"));
    assert_false(maps_library(served, "/libsystemd.so"));
    assert_int_equal(maps_library(served, "/libpq.so"), h.pg);
    assert_int_equal(h_stop(served, SIGTERM, h_ms(15000)), 0);

    /* Every order once: none cancelled twice, none left. */
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders"), 2 * ORDERS);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM events"), 2 * ORDERS);
    h_teardown(&h);
}

/* dir/soname: an empty file by a library's SONAME, which the loader takes for it when dir
 * comes first in LD_LIBRARY_PATH, and which is no library. */
static void plant_broken(const char *dir, const char *soname, char *lib, size_t cap) {
    snprintf(lib, cap, "%s/%s", dir, soname);
    FILE *f = fopen(lib, "w");
    assert_non_null(f);
    fclose(f);
}

/* `lapse args...` (h_run: exactly as given) with LD_LIBRARY_PATH=dir and, when not NULL,
 * NOTIFY_SOCKET=notify; its exit code. */
static int run_broken(h_ctx_t *h, const char *dir, const char *notify,
                      const char *const *args) {
    assert_int_equal(setenv("LD_LIBRARY_PATH", dir, 1), 0);
    if (notify != NULL) {
        assert_int_equal(setenv("NOTIFY_SOCKET", notify, 1), 0);
    }
    int code =
        h_run(h, NULL, 0, args[0], args[1], args[2], args[3], args[4], args[5], NULL);
    unsetenv("LD_LIBRARY_PATH");
    unsetenv("NOTIFY_SOCKET");
    return code;
}

static void test_unloadable_library_is_one_clear_error(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "badlibs", "2s", true);
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/badlib", h.dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    char pq[sizeof dir + 64], sd[sizeof dir + 64], mhd[sizeof dir + 64];
    plant_broken(dir, LAPSE_LIBPQ_SONAME, pq, sizeof pq);
    plant_broken(dir, LAPSE_LIBSYSTEMD_SONAME, sd, sizeof sd);
    plant_broken(dir, LAPSE_LIBMICROHTTPD_SONAME, mhd, sizeof mhd);
    char store[sizeof h.dir + 64];
    snprintf(store, sizeof store, "sqlite:%s/never.db", h.dir);
    char notify[sizeof h.dir + 64];
    snprintf(notify, sizeof notify, "%s/notify.sock", h.dir);

    /* Each feature that needs a library, with that library broken: exit 1 and one line
     * naming the SONAME, Debian's package and the loader's reason. */
    struct {
        const char *args[6];
        const char *notify;
        const char *prefix, *soname, *package, *path;
    } cases[] = {
        {{"pending", "--store", "postgresql://127.0.0.1:1/none"},
         NULL,
         "lapse: open store: ",
         LAPSE_LIBPQ_SONAME,
         "libpq5",
         pq},
        {{"consume", "--store", store, "--amqp", h.amqp},
         notify,
         "lapse: NOTIFY_SOCKET is set, but ",
         LAPSE_LIBSYSTEMD_SONAME,
         "libsystemd0",
         sd},
        {{"consume", "--store", store, "--metrics-listen", "127.0.0.1:0"},
         NULL,
         "lapse: metrics: ",
         LAPSE_LIBMICROHTTPD_SONAME,
         "libmicrohttpd12",
         mhd},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(run_broken(&h, dir, cases[i].notify, cases[i].args), 1);
        char needle[sizeof dir + 256];
        snprintf(needle, sizeof needle,
                 "%scannot load %s (Debian package %s): %s: file too short",
                 cases[i].prefix, cases[i].soname, cases[i].package, cases[i].path);
        printf("%s %s: %zu line(s) \"%s\"\n", cases[i].args[0], cases[i].soname,
               h_count_lines(&h, "cli.log", needle), needle);
        assert_int_equal(h_count_lines(&h, "cli.log", needle), 1);
    }
    /* Refused before anything was opened: no store was created. */
    char never[sizeof h.dir + 64];
    snprintf(never, sizeof never, "%s/never.db", h.dir);
    struct stat st;
    assert_int_not_equal(stat(never, &st), 0);
    int code;

    /* A broken libsqlite3: a SQLite store is refused in the same words, before its file
     * is created; a PostgreSQL one is not concerned. */
    char dir_sq[PATH_MAX + 16], sq[sizeof dir_sq + 64];
    snprintf(dir_sq, sizeof dir_sq, "%s/badsqlite", h.dir);
    assert_int_equal(mkdir(dir_sq, 0700), 0);
    plant_broken(dir_sq, LAPSE_LIBSQLITE3_SONAME, sq, sizeof sq);
    code = run_broken(
        &h, dir_sq, NULL,
        (const char *const[]){"publish", "ord-x", "--store", store, "--amqp", h.amqp});
    assert_int_equal(code, 1);
    char needle_sq[sizeof sq + 256];
    snprintf(needle_sq, sizeof needle_sq,
             "lapse: open store: cannot load %s (Debian package libsqlite3-0): %s: file "
             "too short",
             LAPSE_LIBSQLITE3_SONAME, sq);
    printf("publish %s: %zu line(s) \"%s\"\n", LAPSE_LIBSQLITE3_SONAME,
           h_count_lines(&h, "cli.log", needle_sq), needle_sq);
    assert_int_equal(h_count_lines(&h, "cli.log", needle_sq), 1);
    assert_int_not_equal(stat(never, &st), 0);

    /* A SQLite store needs none of them: the same broken path is no obstacle. */
    assert_int_equal(setenv("LD_LIBRARY_PATH", dir, 1), 0);
    code = h_lapse(&h, NULL, 0, "publish", "ord-sqlite", "--timeout", "2s", NULL);
    unsetenv("LD_LIBRARY_PATH");
    assert_int_equal(code, h.pg ? 1 : 0);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_consumer_maps_only_what_it_uses),
        cmocka_unit_test(test_unloadable_library_is_one_clear_error),
    };
    return cmocka_run_group_tests(tests, NULL, h_group_ensure_node);
}

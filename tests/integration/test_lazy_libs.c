/* SPDX-License-Identifier: MIT
 * Libraries loaded on first use (docs/design.md): a consumer maps libpq only on a
 * PostgreSQL store, libmicrohttpd only with --metrics-listen and libsystemd only under a
 * NOTIFY_SOCKET, and it cancels as ever without them; a libpq that cannot be loaded is
 * one clear error line and exit 1. */
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
    assert_int_equal(maps_library(plain, "/libpq.so"), h.pg);
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

static void test_unloadable_libpq_is_one_clear_error(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "badlibpq", "2s", true);
    /* A file by libpq's SONAME that is no library, first in the loader's search path. */
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/badlib", h.dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    char lib[sizeof dir + 64];
    snprintf(lib, sizeof lib, "%s/%s", dir, LAPSE_LIBPQ_SONAME);
    FILE *f = fopen(lib, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(setenv("LD_LIBRARY_PATH", dir, 1), 0);
    int code =
        h_run(&h, NULL, 0, "pending", "--store", "postgresql://127.0.0.1:1/none", NULL);
    unsetenv("LD_LIBRARY_PATH");
    assert_int_equal(code, 1);
    char needle[sizeof lib + 128];
    snprintf(
        needle, sizeof needle,
        "lapse: open store: cannot load %s (Debian package libpq5): %s: file too short",
        LAPSE_LIBPQ_SONAME, lib);
    assert_int_equal(h_count_lines(&h, "cli.log", needle), 1);
    /* A SQLite store never needs it: the same broken path is no obstacle. */
    assert_int_equal(setenv("LD_LIBRARY_PATH", dir, 1), 0);
    code = h_lapse(&h, NULL, 0, "publish", "ord-sqlite", "--timeout", "2s", NULL);
    unsetenv("LD_LIBRARY_PATH");
    assert_int_equal(code, h.pg ? 1 : 0);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_consumer_maps_only_what_it_uses),
        cmocka_unit_test(test_unloadable_libpq_is_one_clear_error),
    };
    return cmocka_run_group_tests(tests, NULL, h_group_ensure_node);
}

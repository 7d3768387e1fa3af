/* SPDX-License-Identifier: MIT
 * The installed library (issue 13): `cmake --install` of this build into a scratch
 * prefix gives the binary, the man page, liblapse.so.0 (only lapse_ symbols exported)
 * and liblapse.a, the headers, lapse.pc and the CMake package, none of whose usage
 * requirements carries the build's warnings, sanitizers or defines. A tiny program
 * (tests/install/main.c) built against it four ways (pkg-config shared and --static, the
 * CMake package's lapse::lapse and lapse::lapse_static) publishes an order each through
 * the public API; the installed binary then finds each pending and the holding queue
 * holds the four messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <lapse/lapse.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define OUT_CAP (256 * 1024)

typedef struct {
    h_ctx_t h;
    char prefix[PATH_MAX];   /* the install prefix */
    char libdir[PATH_MAX];   /* <prefix>/<CMAKE_INSTALL_LIBDIR> */
    char san[256];           /* -fsanitize=... of this build, or "" */
    char log[PATH_MAX + 16]; /* every command's stderr */
    const char *cc, *cmake, *build, *src;
    char *out;
} ctx_t;

static const char *env_or_die(const char *name) {
    const char *v = getenv(name);
    if (!v) {
        fail_msg("%s is not set (run through ctest)", name);
    }
    return v;
}

/* Run a shell command made from fmt; its stdout into c->out (NUL-terminated), its stderr
 * appended to c->log. Returns the exit code (-1 when it did not exit). */
__attribute__((format(printf, 2, 3))) static int sh(ctx_t *c, const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    assert_true(n > 0 && (size_t)n < sizeof cmd - 64);
    char full[8400];
    n = snprintf(full, sizeof full, "( %s ) 2>>'%s'", cmd, c->log);
    assert_true(n > 0 && (size_t)n < sizeof full);
    FILE *p = popen(full, "r");
    assert_non_null(p);
    size_t len = fread(c->out, 1, OUT_CAP - 1, p);
    c->out[len] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The same, failing the test with the command and the log's tail unless it exits 0. */
__attribute__((format(printf, 3, 4))) static void sh_ok(ctx_t *c, const char *what,
                                                        const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = sh(c, "%s", cmd);
    if (rc != 0) {
        char tail[PATH_MAX + 32];
        if (snprintf(tail, sizeof tail, "tail -n 40 '%s' >&2", c->log) <
            (int)sizeof tail) {
            (void)!system(tail);
        }
        fail_msg("%s failed (exit %d): %s", what, rc, cmd);
    }
}

static bool exists(const char *dir, const char *file) {
    char path[PATH_MAX * 2];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    struct stat st;
    return lstat(path, &st) == 0;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fail_msg("cannot read %s", path);
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)len + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)len, f), (size_t)len);
    text[len] = '\0';
    fclose(f);
    return text;
}

/* None of the build's own usage requirements in an installed file. */
static void assert_clean_interface(ctx_t *c, const char *path) {
    char *text = slurp(path);
    static const char *const leaks[] = {
        "-W",         "_POSIX_C_SOURCE", "_DEFAULT_SOURCE",
        "-fsanitize", "lapse_warnings",  "lapse_objects"};
    for (size_t i = 0; i < sizeof leaks / sizeof leaks[0]; i++) {
        if (strstr(text, leaks[i])) {
            fail_msg("%s carries %s", path, leaks[i]);
        }
    }
    /* Nor a path of this checkout or build: the package is relocatable. */
    if (strstr(text, c->build) || strstr(text, c->src)) {
        fail_msg("%s names the build or source directory", path);
    }
    free(text);
}

/* Every function a public header declares LAPSE_API, by name, into names (one per
 * line, each followed by '\n'). */
static void api_functions(ctx_t *c, char *names, size_t cap) {
    names[0] = '\0';
    assert_int_equal(sh(c, "ls '%s'/include/lapse/*.h", c->prefix), 0);
    char *list = strdup(c->out);
    assert_non_null(list);
    size_t used = 0;
    for (char *path = strtok(list, "\n"); path; path = strtok(NULL, "\n")) {
        char *text = slurp(path);
        for (char *p = strstr(text, "LAPSE_API"); p; p = strstr(p + 1, "LAPSE_API")) {
            if (p > text && p[-1] != '\n') {
                continue; /* the #define, or a mention in a comment */
            }
            char *paren = strchr(p, '(');
            assert_non_null(paren);
            char *end = paren;
            while (end > p && end[-1] == ' ') {
                end--;
            }
            char *start = end;
            while (start > p &&
                   (start[-1] == '_' || (start[-1] >= 'a' && start[-1] <= 'z') ||
                    (start[-1] >= '0' && start[-1] <= '9'))) {
                start--;
            }
            int n =
                snprintf(names + used, cap - used, "%.*s\n", (int)(end - start), start);
            assert_true(n > 0 && (size_t)n < cap - used);
            used += (size_t)n;
        }
        free(text);
    }
    free(list);
}

static void check_installed_files(ctx_t *c) {
    static const char *const files[] = {"bin/lapse",
                                        "include/lapse/lapse.h",
                                        "include/lapse/version.h",
                                        "include/lapse/publisher.h",
                                        "include/lapse/consumer.h",
                                        "share/man/man1/lapse.1",
                                        "share/doc/lapse/LICENSE"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        if (!exists(c->prefix, files[i])) {
            fail_msg("cmake --install did not install %s", files[i]);
        }
    }
    static const char *const libs[] = {"liblapse.so",
                                       "liblapse.so.0",
                                       "liblapse.so.0.1.0",
                                       "liblapse.a",
                                       "pkgconfig/lapse.pc",
                                       "cmake/lapse/lapse-config.cmake",
                                       "cmake/lapse/lapse-config-version.cmake",
                                       "cmake/lapse/lapse-targets.cmake"};
    for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
        if (!exists(c->libdir, libs[i])) {
            fail_msg("cmake --install did not install %s/%s", c->libdir, libs[i]);
        }
    }
    /* The header's version is the project's; the installed binary and man page agree. */
    sh_ok(c, "lapse --version", "'%s/bin/lapse' --version", c->prefix);
    char want[64];
    snprintf(want, sizeof want, "lapse %s\n", LAPSE_VERSION);
    assert_string_equal(c->out, want);
    sh_ok(c, "the man page", "cmp '%s/share/man/man1/lapse.1' '%s/docs/lapse.1'",
          c->prefix, c->src);

    /* Usage requirements stay private. */
    char path[PATH_MAX * 2];
    snprintf(path, sizeof path, "%s/pkgconfig/lapse.pc", c->libdir);
    assert_clean_interface(c, path);
    sh_ok(c, "the exported targets", "ls '%s'/cmake/lapse/lapse-targets*.cmake",
          c->libdir);
    char *list = strdup(c->out);
    for (char *f = strtok(list, "\n"); f; f = strtok(NULL, "\n")) {
        assert_clean_interface(c, f);
    }
    free(list);

    /* The SONAME, and the dynamic symbols: every LAPSE_API function, nothing else. */
    sh_ok(c, "readelf", "readelf -d '%s/liblapse.so'", c->libdir);
    assert_non_null(strstr(c->out, "Library soname: [liblapse.so.0]"));
    sh_ok(
        c, "nm -D",
        "nm -D --defined-only '%s/liblapse.so' | awk '$2 ~ /^[TDBRVW]$/ { print $3 }' | "
        "sort",
        c->libdir);
    char *exported = strdup(c->out);
    assert_non_null(exported);
    size_t n_exported = 0;
    for (char *p = exported; *p; p += strcspn(p, "\n") + 1) {
        size_t len = strcspn(p, "\n");
        /* Sanitizer builds add their runtime's bookkeeping symbols (__asan_*, __odr_*).
         */
        bool runtime = c->san[0] && strncmp(p, "__", 2) == 0;
        if (!runtime && (strncmp(p, "lapse_", 6) != 0 || strncmp(p, "lapse__", 7) == 0)) {
            fail_msg("liblapse.so exports %.*s", (int)len, p);
        }
        n_exported += !runtime;
    }
    char *api = malloc(OUT_CAP);
    assert_non_null(api);
    api_functions(c, api, OUT_CAP);
    size_t n_api = 0;
    for (char *p = api; *p; p += strcspn(p, "\n") + 1) {
        char line[128];
        snprintf(line, sizeof line, "%.*s\n", (int)strcspn(p, "\n"), p);
        char at_start[130];
        snprintf(at_start, sizeof at_start, "\n%s", line);
        if (strncmp(exported, line, strlen(line)) != 0 && !strstr(exported, at_start)) {
            fail_msg("liblapse.so does not export %.*s", (int)strcspn(p, "\n"), p);
        }
        n_api++;
    }
    printf("liblapse.so exports %zu symbols for %zu LAPSE_API functions\n", n_exported,
           n_api);
    assert_non_null(strstr(api, "lapse_version\n"));
    assert_int_equal(n_exported, n_api);
    /* An internal function is there, and hidden. */
    sh_ok(c, "nm", "nm '%s/liblapse.so' | grep -c ' t lapse__'", c->libdir);
    assert_true(atoi(c->out) > 0);
    free(api);
    free(exported);
}

/* The program through pkg-config: shared, then with liblapse.a itself (the -llapse of
 * pkg-config would take the .so beside it). The static link takes lapse.pc's own
 * Libs.private (--static, --maximum-traverse-depth=2: pkgconf 1.8 counts lapse.pc itself
 * as 2) and the --libs of its Requires.private: `pkg-config --static --libs lapse` would
 * go on into the dependencies' own private libraries, for a fully static link, and Debian
 * 12's libpq.pc names libpgcommon and libpgport, which no -dev package has as libraries
 * to link. */
static void build_with_pkg_config(ctx_t *c) {
    char pkgconf[PATH_MAX + 64];
    snprintf(pkgconf, sizeof pkgconf, "PKG_CONFIG_PATH='%s/pkgconfig' pkg-config",
             c->libdir);
    sh_ok(c, "pkg-config --modversion", "%s --modversion lapse", pkgconf);
    assert_string_equal(c->out, LAPSE_VERSION "\n");
    sh_ok(c, "the pkg-config build",
          "%s -std=c11 -Wall -Wextra -Wpedantic -Werror %s -o '%s/po-pc' "
          "'%s/tests/install/main.c' $(%s --cflags --libs lapse) "
          "-Wl,-rpath,\"$(%s --variable=libdir lapse)\"",
          c->cc, c->san, c->h.dir, c->src, pkgconf, pkgconf);
    sh_ok(c, "the pkg-config --static build",
          "%s -std=c11 -Wall -Wextra -Wpedantic -Werror %s -o '%s/po-pc-static' "
          "'%s/tests/install/main.c' $(%s --cflags lapse) "
          "$(%s --static --maximum-traverse-depth=2 --libs lapse | "
          "sed \"s|-llapse|%s/liblapse.a|\") "
          "$(%s --libs $(%s --print-requires-private lapse))",
          c->cc, c->san, c->h.dir, c->src, pkgconf, pkgconf, c->libdir, pkgconf, pkgconf);
    sh_ok(c, "readelf", "readelf -d '%s/po-pc'", c->h.dir);
    assert_non_null(strstr(c->out, "[liblapse.so.0]"));
    sh_ok(c, "readelf", "readelf -d '%s/po-pc-static'", c->h.dir);
    assert_null(strstr(c->out, "liblapse"));
    assert_non_null(strstr(c->out, "[librabbitmq.so"));
}

/* The program through the CMake package (tests/install/CMakeLists.txt): the compile
 * lines carry none of the build's warnings or defines. */
static void build_with_cmake(ctx_t *c) {
    sh_ok(c, "the CMake package's configure",
          "'%s' -S '%s/tests/install' -B '%s/embed' -DCMAKE_PREFIX_PATH='%s' "
          "-DCMAKE_C_COMPILER='%s' -DCMAKE_C_FLAGS='%s' -DCMAKE_EXE_LINKER_FLAGS='%s' "
          "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON >&2",
          c->cmake, c->src, c->h.dir, c->prefix, c->cc, c->san, c->san);
    sh_ok(c, "the CMake package's build", "'%s' --build '%s/embed' >&2", c->cmake,
          c->h.dir);
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/embed/compile_commands.json", c->h.dir);
    char *commands = slurp(path);
    assert_non_null(strstr(commands, "main.c"));
    /* A flag, not the letters: the temporary directory's name may hold "-W" too. */
    assert_null(strstr(commands, " -W"));
    assert_null(strstr(commands, "_POSIX_C_SOURCE"));
    assert_null(strstr(commands, c->build));
    free(commands);
    sh_ok(c, "readelf", "readelf -d '%s/embed/publish-order'", c->h.dir);
    assert_non_null(strstr(c->out, "[liblapse.so.0]"));
    sh_ok(c, "readelf", "readelf -d '%s/embed/publish-order-static'", c->h.dir);
    assert_null(strstr(c->out, "liblapse"));
}

static void test_installed_library(void **state) {
    (void)state;
    ctx_t *c = calloc(1, sizeof *c);
    assert_non_null(c);
    c->out = malloc(OUT_CAP);
    assert_non_null(c->out);
    h_setup(&c->h, "install", "30m", true);
    c->cc = env_or_die("LAPSE_TEST_CC");
    c->cmake = env_or_die("LAPSE_TEST_CMAKE");
    c->build = env_or_die("LAPSE_BUILD_DIR");
    c->src = env_or_die("LAPSE_SOURCE_DIR");
    const char *san = env_or_die("LAPSE_TEST_SANITIZE");
    if (san[0]) {
        snprintf(c->san, sizeof c->san, "-fsanitize=%s", san);
    }
    assert_true(snprintf(c->prefix, sizeof c->prefix, "%s/prefix", c->h.dir) <
                (int)sizeof c->prefix);
    assert_true(snprintf(c->libdir, sizeof c->libdir, "%s/%s", c->prefix,
                         env_or_die("LAPSE_INSTALL_LIBDIR")) < (int)sizeof c->libdir);
    snprintf(c->log, sizeof c->log, "%s/install.log", c->h.dir);

    sh_ok(c, "cmake --install", "'%s' --install '%s' --prefix '%s' >&2", c->cmake,
          c->build, c->prefix);
    check_installed_files(c);
    build_with_pkg_config(c);
    build_with_cmake(c);

    static const char *const programs[] = {"po-pc", "po-pc-static", "embed/publish-order",
                                           "embed/publish-order-static"};
    static const char *const orders[] = {"embed-pc", "embed-pc-static", "embed-cmake",
                                         "embed-cmake-static"};
    enum { N = sizeof programs / sizeof programs[0] };
    for (size_t i = 0; i < N; i++) {
        sh_ok(c, programs[i],
              "LAPSE_AMQP_URL='%s' LAPSE_STORE='%s' LAPSE_PREFIX='%s' LAPSE_CLASSES='%s' "
              "'%s/%s' '%s'",
              c->h.amqp, c->h.store, c->h.prefix, c->h.classes, c->h.dir, programs[i],
              orders[i]);
        char want[128];
        snprintf(want, sizeof want, "lapse %s\n%s published\n", LAPSE_VERSION, orders[i]);
        assert_string_equal(c->out, want);
    }
    /* Each order pending in the store, as the installed binary reads it... */
    for (size_t i = 0; i < N; i++) {
        sh_ok(c, "lapse status",
              "'%s/bin/lapse' --store '%s' --prefix '%s' status '%s' --json", c->prefix,
              c->h.store, c->h.prefix, orders[i]);
        char want[128];
        snprintf(want, sizeof want, "{\"order_id\":\"%s\",\"status\":\"pending\",",
                 orders[i]);
        if (strncmp(c->out, want, strlen(want)) != 0) {
            fail_msg("lapse status %s: %s", orders[i], c->out);
        }
    }
    /* ...and its expiry message waiting in the 30m class's holding queue. */
    amqp_connection_state_t conn = h_amqp_open(&c->h);
    char queue[160];
    snprintf(queue, sizeof queue, "%s.hold.30m", c->h.prefix);
    assert_int_equal(h_queue_depth(conn, queue), N);
    h_amqp_close(conn);

    h_teardown(&c->h);
    free(c->out);
    free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_installed_library),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

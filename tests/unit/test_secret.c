/* SPDX-License-Identifier: MIT
 * The broker password: the URL's, or a password file's content (issue 13). */
#include "secret_int.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Table-driven: a file's bytes and the password they hold, or why they hold none. */
static void test_file_text_is_one_line(void **state) {
    (void)state;
    static const struct {
        const char *text;
        size_t len;
        const char *password; /* NULL: refused */
    } cases[] = {
        {"s3cret", 6, "s3cret"},
        {"s3cret\n", 7, "s3cret"},
        {"s3cret\r\n", 8, "s3cret"},
        {" spaced out ", 12, " spaced out "},
        {"p%41ss:@/", 9, "p%41ss:@/"}, /* taken literally, never percent-decoded */
        {"", 0, NULL},
        {"\n", 1, NULL},
        {"\r\n", 2, NULL},
        {"two\nlines\n", 10, NULL},
        {"s3cret\n\n", 8, NULL},
        {"nul\0byte", 8, NULL},
        {"cr\rinside", 9, NULL},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char out[LAPSE__PASSWORD_MAX];
        const char *why = NULL;
        bool ok =
            lapse__secret_from_text(cases[i].text, cases[i].len, out, sizeof out, &why);
        if (cases[i].password != NULL) {
            if (!ok) {
                fail_msg("case %zu refused: %s", i, why);
            }
            assert_string_equal(out, cases[i].password);
        } else {
            assert_false(ok);
            assert_non_null(why);
        }
    }
    char longest[LAPSE__PASSWORD_MAX + 1];
    memset(longest, 'x', sizeof longest);
    char out[LAPSE__PASSWORD_MAX];
    const char *why = NULL;
    assert_true(
        lapse__secret_from_text(longest, LAPSE__PASSWORD_MAX - 1, out, sizeof out, &why));
    assert_int_equal(strlen(out), LAPSE__PASSWORD_MAX - 1);
    assert_false(
        lapse__secret_from_text(longest, LAPSE__PASSWORD_MAX, out, sizeof out, &why));
    assert_non_null(strstr(why, "longer"));
}

static void write_file(const char *path, const char *text, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* The file replaces the URL's password; errors name the file and never its content. */
static void test_password_file_replaces_the_urls(void **state) {
    (void)state;
    char dir[] = "/tmp/lapse-secret-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/amqp-password", dir);

    lapse_config_t *cfg = lapse_config_new();
    assert_non_null(cfg);
    assert_int_equal(lapse_config_set(cfg, "amqp_url", "amqp://app:from-url@h/%2f", NULL),
                     LAPSE_OK);
    char pw[LAPSE__PASSWORD_MAX];
    lapse_error_t err;
    assert_int_equal(lapse__secret_password(cfg, pw, sizeof pw, &err), LAPSE_OK);
    assert_string_equal(pw, "from-url");

    write_file(path, "from-file\n", 10);
    assert_int_equal(lapse_config_set(cfg, "amqp_password_file", path, NULL), LAPSE_OK);
    assert_string_equal(lapse_config_get(cfg, "amqp_password_file"), path);
    assert_int_equal(lapse__secret_password(cfg, pw, sizeof pw, &err), LAPSE_OK);
    assert_string_equal(pw, "from-file");
    /* Read at each connect: a rotated secret is used by the next connection. */
    write_file(path, "rotated", 7);
    assert_int_equal(lapse__secret_password(cfg, pw, sizeof pw, &err), LAPSE_OK);
    assert_string_equal(pw, "rotated");

    write_file(path, "two\nlines-hunter2\n", 18);
    assert_int_equal(lapse__secret_password(cfg, pw, sizeof pw, &err), LAPSE_ERR_IO);
    assert_non_null(strstr(err.text, path));
    assert_null(strstr(err.text, "hunter2"));

    write_file(path, "", 0);
    assert_int_equal(lapse__secret_password(cfg, pw, sizeof pw, &err), LAPSE_ERR_IO);
    assert_non_null(strstr(err.text, "empty"));

    unlink(path);
    assert_int_equal(lapse__secret_password(cfg, pw, sizeof pw, &err), LAPSE_ERR_IO);
    assert_non_null(strstr(err.text, "No such file"));
    assert_non_null(strstr(err.text, path));
    /* A directory cannot be read as a file. */
    assert_int_equal(lapse_config_set(cfg, "amqp_password_file", dir, NULL), LAPSE_OK);
    assert_int_equal(lapse__secret_password(cfg, pw, sizeof pw, &err), LAPSE_ERR_IO);
    assert_non_null(strstr(err.text, dir));

    lapse__secret_wipe(pw, sizeof pw);
    for (size_t i = 0; i < sizeof pw; i++) {
        assert_int_equal(pw[i], 0);
    }
    lapse_config_free(cfg);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_text_is_one_line),
        cmocka_unit_test(test_password_file_replaces_the_urls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

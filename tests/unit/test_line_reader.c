/* SPDX-License-Identifier: MIT
 * The batch line reader: lines, a last line without '\n', and over-long lines read past
 * and reported with bounded memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "cli/line_reader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A file holding text, open for reading at its start. */
static int file_with(const char *parts[], size_t n) {
    FILE *f = tmpfile();
    assert_non_null(f);
    for (size_t i = 0; i < n; i++) {
        fputs(parts[i], f);
    }
    fflush(f);
    int fd = dup(fileno(f));
    fclose(f);
    assert_true(fd >= 0);
    lseek(fd, 0, SEEK_SET);
    return fd;
}

static char *repeat(char c, size_t n) {
    char *s = malloc(n + 1);
    assert_non_null(s);
    memset(s, c, n);
    s[n] = '\0';
    return s;
}

static void test_lines_and_last_line(void **state) {
    (void)state;
    const char *parts[] = {"one\n", "two\r\n", "\n", "last"};
    int fd = file_with(parts, 4);
    line_reader_t r;
    line_reader_init(&r, fd);
    char *line;
    assert_int_equal(line_reader_next(&r, &line, -1), 3);
    assert_string_equal(line, "one");
    assert_int_equal(line_reader_next(&r, &line, -1), 3);
    assert_string_equal(line, "two");
    assert_int_equal(line_reader_next(&r, &line, -1), 0);
    assert_int_equal(line_reader_next(&r, &line, -1), 4);
    assert_string_equal(line, "last");
    assert_int_equal(line_reader_next(&r, &line, -1), LINE_READER_END);
    line_reader_free(&r);
    close(fd);
}

/* A 1 MiB line between two good ones: reported once with its length, the next line is
 * read whole, and the buffer never held the long line. */
static void test_long_line_is_skipped_with_bounded_memory(void **state) {
    (void)state;
    char *big = repeat('x', 1 << 20);
    const char *parts[] = {"{\"order_id\":\"a\"}\n", big, "\n", "{\"order_id\":\"b\"}\n"};
    int fd = file_with(parts, 4);
    line_reader_t r;
    line_reader_init(&r, fd);
    char *line;
    assert_int_equal(line_reader_next(&r, &line, -1), 16);
    assert_int_equal(line_reader_next(&r, &line, -1), LINE_READER_TOO_LONG);
    assert_int_equal(r.skipped, 1 << 20);
    assert_true(r.cap <= LINE_READER_MAX + 4 * 65536);
    assert_int_equal(line_reader_next(&r, &line, -1), 16);
    assert_string_equal(line, "{\"order_id\":\"b\"}");
    assert_int_equal(line_reader_next(&r, &line, -1), LINE_READER_END);
    line_reader_free(&r);
    close(fd);
    free(big);
}

/* Just over the limit is too long; exactly the limit is a line. Also as the last line
 * without a newline. */
static void test_limit_edges(void **state) {
    (void)state;
    char *at = repeat('a', LINE_READER_MAX);
    char *over = repeat('b', LINE_READER_MAX + 1);
    const char *parts[] = {at, "\n", over, "\n", over};
    int fd = file_with(parts, 5);
    line_reader_t r;
    line_reader_init(&r, fd);
    char *line;
    assert_int_equal(line_reader_next(&r, &line, -1), LINE_READER_MAX);
    assert_int_equal(line_reader_next(&r, &line, -1), LINE_READER_TOO_LONG);
    assert_int_equal(r.skipped, LINE_READER_MAX + 1);
    assert_int_equal(line_reader_next(&r, &line, -1), LINE_READER_TOO_LONG);
    assert_int_equal(r.skipped, LINE_READER_MAX + 1);
    assert_int_equal(line_reader_next(&r, &line, -1), LINE_READER_END);
    line_reader_free(&r);
    close(fd);
    free(at);
    free(over);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lines_and_last_line),
        cmocka_unit_test(test_long_line_is_skipped_with_bounded_memory),
        cmocka_unit_test(test_limit_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

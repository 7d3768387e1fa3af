/* SPDX-License-Identifier: MIT
 * The executable's log sink: the text line, the JSON line parsed back field by field,
 * the journal's priority prefix and how stderr is recognised as the journal; bursts. */
#define _GNU_SOURCE /* F_SETPIPE_SZ */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "cli/log_sink.h"

#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* 2026-11-30T07:06:30.941Z */
#define TS_MS INT64_C(1796022390941)

/* Parse one JSON line: exactly one newline, at its end, and nothing else around it. */
static json_t *parse_line(const char *out) {
    size_t len = strlen(out);
    assert_true(len > 1);
    assert_int_equal(out[len - 1], '\n');
    assert_null(memchr(out, '\n', len - 1));
    json_error_t jerr;
    json_t *obj = json_loadb(out, len - 1, 0, &jerr);
    if (obj == NULL) {
        fail_msg("not JSON (%s): %s", jerr.text, out);
    }
    assert_true(json_is_object(obj));
    return obj;
}

static const char *field(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_string(v)) {
        fail_msg("field %s missing or not a string", key);
    }
    return json_string_value(v);
}

static void test_text_line(void **state) {
    (void)state;
    cli_log_t log = {0};
    char *out =
        cli_log_format(&log, TS_MS, LAPSE_LOG_INFO,
                       "event=decision order_id=ord-7 decision=cancelled lag_ms=24");
    assert_string_equal(out, "2026-11-30T07:06:30.941Z level=info event=decision "
                             "order_id=ord-7 decision=cancelled lag_ms=24\n");
    free(out);
    out = cli_log_format(NULL, TS_MS, LAPSE_LOG_WARN, "event=x");
    assert_string_equal(out, "2026-11-30T07:06:30.941Z level=warn event=x\n");
    free(out);
}

static void test_json_fields_in_order(void **state) {
    (void)state;
    cli_log_t log = {.json = true};
    char *out = cli_log_format(
        &log, TS_MS, LAPSE_LOG_WARN,
        "event=reconnect status=ERR_BROKER_CLOSED reason=\"connection reset by peer\" "
        "attempt=3 delay_ms=800");
    json_t *obj = parse_line(out);
    assert_string_equal(field(obj, "ts"), "2026-11-30T07:06:30.941Z");
    assert_string_equal(field(obj, "level"), "warn");
    assert_string_equal(field(obj, "event"), "reconnect");
    assert_string_equal(field(obj, "status"), "ERR_BROKER_CLOSED");
    assert_string_equal(field(obj, "reason"), "connection reset by peer");
    assert_string_equal(field(obj, "attempt"), "3");
    assert_string_equal(field(obj, "delay_ms"), "800");
    assert_int_equal(json_object_size(obj), 7);
    /* ts, level, then the line's own order. */
    assert_true(strncmp(out, "{\"ts\":", 6) == 0);
    assert_true(strstr(out, "\"level\"") < strstr(out, "\"event\""));
    assert_true(strstr(out, "\"status\"") < strstr(out, "\"delay_ms\""));
    json_decref(obj);
    free(out);
}

/* Quotes, backslashes, line breaks, control bytes and bytes that are not UTF-8 all come
 * out as valid JSON that reads back as the text (or \xHH for a non-UTF-8 byte). */
static void test_json_escaping(void **state) {
    (void)state;
    cli_log_t log = {.json = true};
    char *out =
        cli_log_format(&log, TS_MS, LAPSE_LOG_ERROR,
                       "event=forward_failed reason=\"he said \"no\" a\\b\nc\td\x01"
                       "e\x1b[2J\" note=\"caf\xc3\xa9 \xff\xfe end\" bare=x\"y");
    json_t *obj = parse_line(out);
    assert_string_equal(field(obj, "reason"), "he said \"no\" a\\b\nc\td\x01"
                                              "e\x1b[2J");
    assert_string_equal(field(obj, "note"), "caf\xc3\xa9 \\xff\\xfe end");
    assert_string_equal(field(obj, "bare"), "x\"y");
    assert_string_equal(field(obj, "level"), "error");
    /* Escaped on the wire, not raw. */
    assert_non_null(strstr(out, "\\n"));
    assert_non_null(strstr(out, "\\u0001"));
    assert_null(strchr(out, '\x1b'));
    json_decref(obj);
    free(out);
}

/* Words without '=' go to "msg"; a line's own ts or level does not replace the sink's;
 * an unterminated quote runs to the end of the line. */
static void test_json_odd_lines(void **state) {
    (void)state;
    cli_log_t log = {.json = true};
    char *out =
        cli_log_format(&log, TS_MS, LAPSE_LOG_DEBUG,
                       "hello  event=x ts=1 level=high world =odd tail=\"open end");
    json_t *obj = parse_line(out);
    assert_string_equal(field(obj, "msg"), "hello world =odd");
    assert_string_equal(field(obj, "ts"), "2026-11-30T07:06:30.941Z");
    assert_string_equal(field(obj, "level"), "debug");
    assert_string_equal(field(obj, "line_ts"), "1");
    assert_string_equal(field(obj, "line_level"), "high");
    assert_string_equal(field(obj, "tail"), "open end");
    json_decref(obj);
    free(out);

    out = cli_log_format(&log, TS_MS, LAPSE_LOG_INFO, "");
    obj = parse_line(out);
    assert_int_equal(json_object_size(obj), 2);
    json_decref(obj);
    free(out);
}

static void test_passwords_redacted(void **state) {
    (void)state;
    const char *line = "event=x url=amqp://app:s3cret@mq:5672/%2f";
    for (int json = 0; json <= 1; json++) {
        cli_log_t log = {.json = json};
        char *out = cli_log_format(&log, TS_MS, LAPSE_LOG_INFO, line);
        assert_null(strstr(out, "s3cret"));
        assert_non_null(strstr(out, "amqp://app:***@mq:5672/%2f"));
        free(out);
    }
}

static void test_journal_prefix(void **state) {
    (void)state;
    static const struct {
        lapse_log_level_t level;
        const char *prefix;
    } cases[] = {{LAPSE_LOG_ERROR, "<3>"},
                 {LAPSE_LOG_WARN, "<4>"},
                 {LAPSE_LOG_INFO, "<6>"},
                 {LAPSE_LOG_DEBUG, "<7>"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_log_t text = {.journal = true};
        char *out = cli_log_format(&text, TS_MS, cases[i].level, "event=x");
        assert_true(strncmp(out, cases[i].prefix, 3) == 0);
        assert_true(strncmp(out + 3, "2026-11-30T07:06:30.941Z level=", 31) == 0);
        free(out);
        cli_log_t json = {.json = true, .journal = true};
        out = cli_log_format(&json, TS_MS, cases[i].level, "event=x");
        assert_true(strncmp(out, cases[i].prefix, 3) == 0);
        json_t *obj = parse_line(out + 3); /* what journald keeps after the prefix */
        assert_string_equal(field(obj, "event"), "x");
        json_decref(obj);
        free(out);
    }
    cli_log_t plain = {0};
    char *out = cli_log_format(&plain, TS_MS, LAPSE_LOG_ERROR, "event=x");
    assert_int_not_equal(out[0], '<');
    free(out);
}

/* JOURNAL_STREAM counts only when it names the very file on the descriptor. */
static void test_journal_stream_matches_fd(void **state) {
    (void)state;
    char path[] = "/tmp/lapse-test-journal-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    char other[] = "/tmp/lapse-test-journal-XXXXXX";
    int fd2 = mkstemp(other);
    assert_true(fd2 >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    char value[64];
    snprintf(value, sizeof value, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    assert_true(cli_log_is_journal(value, fd));
    assert_false(cli_log_is_journal(value, fd2));
    char trailing[80];
    snprintf(trailing, sizeof trailing, "%s:1", value);
    assert_false(cli_log_is_journal(trailing, fd));
    assert_false(cli_log_is_journal("", fd));
    assert_false(cli_log_is_journal("8:x", fd));
    assert_false(cli_log_is_journal(NULL, fd));
    assert_false(cli_log_is_journal(value, 987)); /* not open */
    close(fd);
    close(fd2);
    unlink(path);
    unlink(other);
}

/* The executable's own error lines: unchanged in text, "<3>" before them under
 * journald, one JSON object (level error) in json mode. */
static void test_error_lines_follow_the_sink(void **state) {
    (void)state;
    const char *text = "lapse: metrics: cannot listen on 127.0.0.1:9464: \"in use\"";
    cli_log_t plain = {0}, journal = {.journal = true}, json = {.json = true};
    char *out = cli_log_format_error(&plain, 0, text);
    assert_non_null(out);
    assert_string_equal(out,
                        "lapse: metrics: cannot listen on 127.0.0.1:9464: \"in use\"\n");
    free(out);
    out = cli_log_format_error(&journal, 0, text);
    assert_non_null(out);
    assert_int_equal(strncmp(out, "<3>lapse: metrics:", 18), 0);
    free(out);
    out = cli_log_format_error(&json, 1764547200000, text);
    assert_non_null(out);
    json_t *obj = json_loads(out, 0, NULL);
    assert_non_null(obj);
    assert_string_equal(json_string_value(json_object_get(obj, "level")), "error");
    assert_string_equal(json_string_value(json_object_get(obj, "event")), "error");
    assert_string_equal(json_string_value(json_object_get(obj, "msg")), text);
    assert_string_equal(json_string_value(json_object_get(obj, "ts")),
                        "2025-12-01T00:00:00.000Z");
    json_decref(obj);
    free(out);
}

/* What the sink wrote to stderr (a pipe here) since the last call; new string. */
static char *drain(int fd) {
    size_t cap = 1 << 20, n = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    ssize_t got;
    while ((got = read(fd, text + n, cap - 1 - n)) > 0) {
        n += (size_t)got;
    }
    text[n] = '\0';
    return text;
}

static size_t count_lines(const char *text) {
    size_t n = 0;
    for (const char *p = strchr(text, '\n'); p != NULL; p = strchr(p + 1, '\n')) {
        n++;
    }
    return n;
}

/* A burst's lines are held until it ends, then written in order; a burst larger than
 * one write goes out in whole lines; a line outside a burst goes out at once. */
static void test_burst_lines_are_held_and_written_whole(void **state) {
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    assert_int_equal(fcntl(fds[0], F_SETFL, O_NONBLOCK), 0);
    assert_int_equal(fcntl(fds[1], F_SETPIPE_SZ, 1 << 20) > 0, 1);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    assert_int_equal(dup2(fds[1], STDERR_FILENO), STDERR_FILENO);
    cli_log_t log = {0};
    char *seen[5];

    cli_log_sink(&log, LAPSE_LOG_INFO, "event=before");
    seen[0] = drain(fds[0]);
    cli_log_burst(&log, true);
    cli_log_sink(&log, LAPSE_LOG_INFO, "event=decision order_id=a decision=cancelled");
    cli_log_sink(&log, LAPSE_LOG_INFO, "event=decision order_id=b decision=noop_paid");
    seen[1] = drain(fds[0]);
    cli_log_burst(&log, false);
    seen[2] = drain(fds[0]);
    /* 200 lines of about 100 bytes: more than one write can hold. */
    cli_log_burst(&log, true);
    for (int i = 0; i < 200; i++) {
        char line[128];
        snprintf(line, sizeof line, "event=decision order_id=ord-%03d decision=cancelled",
                 i);
        cli_log_sink(&log, LAPSE_LOG_INFO, line);
    }
    seen[3] = drain(fds[0]);
    cli_log_burst(&log, false);
    seen[4] = drain(fds[0]);

    assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
    close(saved);
    close(fds[0]);
    close(fds[1]);

    assert_non_null(strstr(seen[0], "level=info event=before\n"));
    assert_string_equal(seen[1], ""); /* held */
    assert_int_equal(count_lines(seen[2]), 2);
    assert_true(strstr(seen[2], "order_id=a ") < strstr(seen[2], "order_id=b "));
    /* Part of the big burst went out before its end, in whole lines. */
    size_t early = count_lines(seen[3]);
    assert_true(early > 0 && early < 200);
    assert_int_equal(seen[3][strlen(seen[3]) - 1], '\n');
    assert_true(strlen(seen[3]) <= 200 * 128);
    assert_int_equal(early + count_lines(seen[4]), 200);
    char *all = malloc(strlen(seen[3]) + strlen(seen[4]) + 1);
    assert_non_null(all);
    strcpy(all, seen[3]);
    strcat(all, seen[4]);
    const char *at = all;
    for (int i = 0; i < 200; i++) {
        char id[32];
        snprintf(id, sizeof id, "order_id=ord-%03d ", i);
        const char *next = strstr(at, id);
        assert_non_null(next); /* every line, in order */
        at = next;
    }
    free(all);
    for (int i = 0; i < 5; i++) {
        free(seen[i]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_line),
        cmocka_unit_test(test_json_fields_in_order),
        cmocka_unit_test(test_json_escaping),
        cmocka_unit_test(test_json_odd_lines),
        cmocka_unit_test(test_passwords_redacted),
        cmocka_unit_test(test_journal_prefix),
        cmocka_unit_test(test_journal_stream_matches_fd),
        cmocka_unit_test(test_error_lines_follow_the_sink),
        cmocka_unit_test(test_burst_lines_are_held_and_written_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

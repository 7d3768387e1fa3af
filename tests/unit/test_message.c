/* SPDX-License-Identifier: MIT
 * Expiry message codec: data-driven valid/invalid bodies, round trips and edge sizes. */
#include "message_int.h"

#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define DESIGN_BODY                                                                      \
    "{\"v\":1,\"order_id\":\"ord-1001\",\"deadline\":\"2026-11-30T06:30:00.000Z\","      \
    "\"created_at\":\"2026-11-30T06:00:00.000Z\"}"
#define DESIGN_DEADLINE_MS INT64_C(1796020200000)
#define DESIGN_CREATED_MS  INT64_C(1796018400000)

static const char *data_dir(void) {
    const char *dir = getenv("LAPSE_TEST_DATA");
    return dir != NULL && dir[0] != '\0' ? dir : "tests/unit/data";
}

/* Whole file into a malloc'd buffer (binary-safe); NULL if it cannot be read. */
static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    size_t cap = 1 << 16;
    char *buf = malloc(cap + 1);
    size_t n = buf != NULL ? fread(buf, 1, cap, f) : 0;
    bool failed = buf == NULL || ferror(f) || n == cap;
    fclose(f);
    if (failed) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted case names (file names without ".json") in data_dir()/sub. */
static size_t list_cases(const char *sub, char ***out) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", data_dir(), sub);
    DIR *dir = opendir(path);
    if (dir == NULL) {
        fail_msg("cannot open %s (set LAPSE_TEST_DATA)", path);
    }
    char **names = NULL;
    size_t n = 0;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        size_t len = strlen(entry->d_name);
        if (len <= 5 || strcmp(entry->d_name + len - 5, ".json") != 0) {
            continue;
        }
        names = realloc(names, (n + 1) * sizeof *names);
        assert_non_null(names);
        names[n] = strndup(entry->d_name, len - 5);
        assert_non_null(names[n]);
        n++;
    }
    closedir(dir);
    if (n > 0) {
        qsort(names, n, sizeof *names, compare_names);
    }
    *out = names;
    return n;
}

static void free_cases(char **names, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(names[i]);
    }
    free(names);
}

/* Read data_dir()/sub/name.ext. */
static char *read_case(const char *sub, const char *name, const char *ext, size_t *len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s%s", data_dir(), sub, name, ext);
    char *text = read_file(path, len);
    if (text == NULL) {
        fail_msg("cannot read %s", path);
    }
    return text;
}

static void test_valid_bodies_decode(void **state) {
    (void)state;
    char **names;
    size_t n = list_cases("valid", &names);
    assert_true(n > 0);
    int failures = 0;
    for (size_t i = 0; i < n; i++) {
        size_t body_len, expect_len;
        char *body = read_case("valid", names[i], ".json", &body_len);
        char *expect = read_case("valid", names[i], ".expect", &expect_len);
        char want_id[LAPSE_ORDER_ID_MAX + 2];
        long long want_deadline, want_created;
        if (sscanf(expect, "%129s %lld %lld", want_id, &want_deadline, &want_created) !=
            3) {
            fail_msg("valid/%s.expect: want \"ORDER_ID DEADLINE_MS CREATED_MS\"",
                     names[i]);
        }
        lapse_expiry_msg_t msg;
        lapse_error_t err;
        lapse_status_t rc = lapse_expiry_msg_decode(body, body_len, &msg, &err);
        if (rc != LAPSE_OK) {
            print_error("valid/%s: %s (%s)\n", names[i], lapse_status_name(rc), err.text);
            failures++;
        } else if (strcmp(msg.order_id, want_id) != 0 ||
                   msg.deadline_ms != want_deadline ||
                   msg.created_at_ms != want_created || msg.version != 1 ||
                   err.code != LAPSE_OK || err.text[0] != '\0') {
            print_error("valid/%s: got %s %lld %lld\n", names[i], msg.order_id,
                        (long long)msg.deadline_ms, (long long)msg.created_at_ms);
            failures++;
        }
        free(body);
        free(expect);
    }
    free_cases(names, n);
    assert_int_equal(failures, 0);
}

static void test_invalid_bodies_are_refused_with_reason(void **state) {
    (void)state;
    char **names;
    size_t n = list_cases("invalid", &names);
    assert_true(n > 0);
    int failures = 0;
    for (size_t i = 0; i < n; i++) {
        size_t body_len, expect_len;
        char *body = read_case("invalid", names[i], ".json", &body_len);
        char *expect = read_case("invalid", names[i], ".expect", &expect_len);
        /* Line 1: status name; optional line 2: a substring of the reason text. */
        char *want_text = strchr(expect, '\n');
        if (want_text != NULL) {
            *want_text++ = '\0';
            want_text[strcspn(want_text, "\n")] = '\0';
        }
        lapse_expiry_msg_t msg;
        memset(&msg, 0x5A, sizeof msg);
        lapse_expiry_msg_t untouched = msg;
        lapse_error_t err;
        lapse_status_t rc = lapse_expiry_msg_decode(body, body_len, &msg, &err);
        if (strcmp(lapse_status_name(rc), expect) != 0 || err.code != rc ||
            err.text[0] == '\0' ||
            (want_text != NULL && want_text[0] != '\0' &&
             strstr(err.text, want_text) == NULL)) {
            print_error("invalid/%s: got %s \"%s\", want %s \"%s\"\n", names[i],
                        lapse_status_name(rc), err.text, expect,
                        want_text != NULL ? want_text : "");
            failures++;
        } else if (memcmp(&msg, &untouched, sizeof msg) != 0) {
            print_error("invalid/%s: output written on failure\n", names[i]);
            failures++;
        }
        /* The reason is optional: the same verdict without an error struct. */
        if (lapse_expiry_msg_decode(body, body_len, &msg, NULL) != rc) {
            print_error("invalid/%s: verdict differs without err\n", names[i]);
            failures++;
        }
        free(body);
        free(expect);
    }
    free_cases(names, n);
    assert_int_equal(failures, 0);
}

/* A valid message padded with an unknown field to exactly `size` bytes. */
static char *padded_body(size_t size) {
    const char *head =
        "{\"v\":1,\"order_id\":\"ord-1\",\"deadline\":\"2026-11-30T06:30:00Z\","
        "\"created_at\":\"2026-11-30T06:00:00Z\",\"pad\":\"";
    size_t head_len = strlen(head);
    assert_true(size > head_len + 2);
    char *body = malloc(size);
    assert_non_null(body);
    memcpy(body, head, head_len);
    memset(body + head_len, 'x', size - head_len - 2);
    memcpy(body + size - 2, "\"}", 2);
    return body;
}

static void test_decode_refuses_body_over_limit(void **state) {
    (void)state;
    lapse_expiry_msg_t msg;
    lapse_error_t err;

    char *body = padded_body(LAPSE_MSG_MAX_BODY);
    assert_int_equal(lapse_expiry_msg_decode(body, LAPSE_MSG_MAX_BODY, &msg, &err),
                     LAPSE_OK);
    assert_string_equal(msg.order_id, "ord-1");
    free(body);

    body = padded_body(LAPSE_MSG_MAX_BODY + 1);
    assert_int_equal(lapse_expiry_msg_decode(body, LAPSE_MSG_MAX_BODY + 1, &msg, &err),
                     LAPSE_ERR_MSG_TOO_LARGE);
    assert_int_equal(err.code, LAPSE_ERR_MSG_TOO_LARGE);
    assert_non_null(strstr(err.text, "4097 bytes"));
    free(body);

    /* Refused on length alone: not even valid UTF-8 is looked at. */
    size_t huge = 1 << 20;
    body = malloc(huge);
    assert_non_null(body);
    memset(body, 0xFF, huge);
    assert_int_equal(lapse_expiry_msg_decode(body, huge, &msg, &err),
                     LAPSE_ERR_MSG_TOO_LARGE);
    free(body);
}

static void test_decode_needs_no_nul_terminator(void **state) {
    (void)state;
    /* The body is a slice of a larger buffer, as an AMQP frame would give it. */
    char buf[] = DESIGN_BODY "garbage that is not part of the body";
    lapse_expiry_msg_t msg;
    assert_int_equal(lapse_expiry_msg_decode(buf, strlen(DESIGN_BODY), &msg, NULL),
                     LAPSE_OK);
    assert_int_equal(msg.deadline_ms, DESIGN_DEADLINE_MS);
}

static void test_decode_rejects_bad_arguments(void **state) {
    (void)state;
    lapse_expiry_msg_t msg;
    lapse_error_t err;
    assert_int_equal(lapse_expiry_msg_decode(NULL, 10, &msg, &err), LAPSE_ERR_INVALID);
    assert_int_equal(
        lapse_expiry_msg_decode(DESIGN_BODY, strlen(DESIGN_BODY), NULL, &err),
        LAPSE_ERR_INVALID);
    assert_int_equal(lapse_expiry_msg_decode(NULL, 0, &msg, &err), LAPSE_ERR_MSG_JSON);
}

static void test_encode_matches_design(void **state) {
    (void)state;
    lapse_expiry_msg_t msg = {.version = 1,
                              .order_id = "ord-1001",
                              .deadline_ms = DESIGN_DEADLINE_MS,
                              .created_at_ms = DESIGN_CREATED_MS};
    char buf[LAPSE_MSG_MAX_BODY];
    size_t len = 99;
    assert_int_equal(lapse_expiry_msg_encode(&msg, buf, sizeof buf, &len), LAPSE_OK);
    assert_string_equal(buf, DESIGN_BODY);
    assert_int_equal(len, strlen(DESIGN_BODY));
}

static void test_encode_decode_round_trip(void **state) {
    (void)state;
    static const struct {
        const char *id;
        int64_t deadline_ms, created_at_ms;
    } cases[] = {
        {"ord-1001", DESIGN_DEADLINE_MS, DESIGN_CREATED_MS},
        {"a", 0, 0},
        {"A.b_c:d-9", INT64_C(253402300799999), 1},
        {"x", INT64_C(1709251199999), INT64_C(1709251199001)},
        {"0123456789012345678901234567890123456789012345678901234567890123"
         "0123456789012345678901234567890123456789012345678901234567890123",
         1234, 5678},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lapse_expiry_msg_t in = {.version = 1,
                                 .deadline_ms = cases[i].deadline_ms,
                                 .created_at_ms = cases[i].created_at_ms};
        snprintf(in.order_id, sizeof in.order_id, "%s", cases[i].id);
        char buf[512];
        size_t len;
        assert_int_equal(lapse_expiry_msg_encode(&in, buf, sizeof buf, &len), LAPSE_OK);
        lapse_expiry_msg_t out;
        lapse_error_t err;
        assert_int_equal(lapse_expiry_msg_decode(buf, len, &out, &err), LAPSE_OK);
        assert_string_equal(out.order_id, in.order_id);
        assert_int_equal(out.deadline_ms, in.deadline_ms);
        assert_int_equal(out.created_at_ms, in.created_at_ms);
        assert_int_equal(out.version, 1);
    }
}

static void test_encode_refuses_small_buffer(void **state) {
    (void)state;
    lapse_expiry_msg_t msg = {.version = 1,
                              .order_id = "ord-1001",
                              .deadline_ms = DESIGN_DEADLINE_MS,
                              .created_at_ms = DESIGN_CREATED_MS};
    size_t need = strlen(DESIGN_BODY) + 1;
    char buf[256];
    for (size_t cap = 0; cap < need; cap++) {
        memset(buf, '#', sizeof buf);
        size_t len = 99;
        assert_int_equal(lapse_expiry_msg_encode(&msg, buf, cap, &len),
                         LAPSE_ERR_INVALID);
        assert_int_equal(len, 0);
        if (cap > 0) {
            assert_int_equal(buf[0], '\0');
        } else {
            assert_int_equal(buf[0], '#'); /* cap 0: not one byte written */
        }
    }
    assert_int_equal(lapse_expiry_msg_encode(&msg, buf, need, NULL), LAPSE_OK);
    assert_string_equal(buf, DESIGN_BODY);
}

static void test_encode_refuses_invalid_values(void **state) {
    (void)state;
    char buf[512];
    lapse_expiry_msg_t msg = {.version = 1,
                              .order_id = "ord 1001",
                              .deadline_ms = DESIGN_DEADLINE_MS,
                              .created_at_ms = DESIGN_CREATED_MS};
    assert_int_equal(lapse_expiry_msg_encode(&msg, buf, sizeof buf, NULL),
                     LAPSE_ERR_MSG_ORDER_ID);
    msg.order_id[0] = '\0';
    assert_int_equal(lapse_expiry_msg_encode(&msg, buf, sizeof buf, NULL),
                     LAPSE_ERR_MSG_ORDER_ID);
    /* 129 id bytes and no terminator inside the array. */
    memset(msg.order_id, 'a', sizeof msg.order_id);
    assert_int_equal(lapse_expiry_msg_encode(&msg, buf, sizeof buf, NULL),
                     LAPSE_ERR_MSG_ORDER_ID);
    /* A quote would break the hand-built JSON if it got through. */
    snprintf(msg.order_id, sizeof msg.order_id, "a\"b");
    assert_int_equal(lapse_expiry_msg_encode(&msg, buf, sizeof buf, NULL),
                     LAPSE_ERR_MSG_ORDER_ID);

    snprintf(msg.order_id, sizeof msg.order_id, "ord-1");
    msg.deadline_ms = -1;
    assert_int_equal(lapse_expiry_msg_encode(&msg, buf, sizeof buf, NULL),
                     LAPSE_ERR_MSG_TIME);
    msg.deadline_ms = INT64_C(253402300800000);
    assert_int_equal(lapse_expiry_msg_encode(&msg, buf, sizeof buf, NULL),
                     LAPSE_ERR_MSG_TIME);
    msg.deadline_ms = DESIGN_DEADLINE_MS;
    msg.created_at_ms = INT64_MIN;
    assert_int_equal(lapse_expiry_msg_encode(&msg, buf, sizeof buf, NULL),
                     LAPSE_ERR_MSG_TIME);

    assert_int_equal(lapse_expiry_msg_encode(NULL, buf, sizeof buf, NULL),
                     LAPSE_ERR_INVALID);
    msg.created_at_ms = DESIGN_CREATED_MS;
    assert_int_equal(lapse_expiry_msg_encode(&msg, NULL, 0, NULL), LAPSE_ERR_INVALID);
}

static void test_order_id_validity(void **state) {
    (void)state;
    char id129[130];
    memset(id129, 'a', 129);
    id129[129] = '\0';
    assert_true(lapse_order_id_is_valid(id129, 128));
    assert_false(lapse_order_id_is_valid(id129, 129));
    assert_true(lapse_order_id_is_valid("a", 1));
    assert_false(lapse_order_id_is_valid("", 0));
    assert_false(lapse_order_id_is_valid(NULL, 3));
    assert_true(lapse_order_id_is_valid("AZaz09._:-", 10));
    static const char *const bad[] = {"a b", "a/b",      "a\"b", "a\\b", "a+b",
                                      "a@b", "\xc3\xa9", "a\tb", "a,b",  "a\x7f"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_false(lapse_order_id_is_valid(bad[i], strlen(bad[i])));
    }
    /* The length is what counts, not a terminator: an embedded NUL is a bad byte. */
    assert_false(lapse_order_id_is_valid("ab\0c", 4));
    assert_true(lapse_order_id_is_valid("ab\0c", 2));
}

/* Canonical bodies and random mutations of them (bytes changed, dropped, doubled,
 * inserted): the decoder, fast path included, gives exactly what its JSON path gives:
 * verdict, reason and message. */
static void test_fast_path_agrees_with_json_path(void **state) {
    (void)state;
    srand(20261201);
    static const char alphabet[] =
        "{}[]\":,\\ 0123456789.-_:TZtrufalsenv\x01\x7f\xc3\xa9";
    size_t fast_accepted = 0;
    for (int i = 0; i < 200000; i++) {
        lapse_expiry_msg_t m = {.version = 1,
                                .deadline_ms = (int64_t)rand() * 1000 + rand() % 1000,
                                .created_at_ms = (int64_t)rand() * 997};
        snprintf(m.order_id, sizeof m.order_id, "ord-%d.%x:%c", rand(), rand(),
                 "aZ_-"[rand() % 4]);
        char body[LAPSE_MSG_MAX_BODY + 64];
        size_t len = 0;
        assert_int_equal(lapse_expiry_msg_encode(&m, body, sizeof body, &len), LAPSE_OK);
        int edits = i % 4 == 0 ? 0 : 1 + rand() % 3;
        for (int e = 0; e < edits && len > 1; e++) {
            size_t at = (size_t)rand() % len;
            char c = alphabet[rand() % (sizeof alphabet - 1)];
            switch (rand() % 4) {
                case 0:
                    body[at] = c;
                    break;
                case 1:
                    memmove(body + at, body + at + 1, len - at - 1);
                    len--;
                    break;
                case 2:
                    memmove(body + at + 1, body + at, len - at);
                    len++;
                    break;
                default:
                    memmove(body + at + 1, body + at, len - at);
                    body[at] = c;
                    len++;
                    break;
            }
        }
        lapse_expiry_msg_t fast, slow;
        memset(&fast, 0x5A, sizeof fast);
        memset(&slow, 0x5A, sizeof slow);
        lapse_error_t fast_err, slow_err;
        lapse_status_t rc = lapse_expiry_msg_decode(body, len, &fast, &fast_err);
        assert_int_equal(lapse__expiry_msg_decode_json(body, len, &slow, &slow_err), rc);
        assert_int_equal(fast_err.code, slow_err.code);
        assert_string_equal(fast_err.text, slow_err.text);
        assert_memory_equal(&fast, &slow, sizeof fast);
        if (edits == 0) {
            assert_int_equal(rc, LAPSE_OK);
            fast_accepted++;
        }
    }
    assert_int_equal(fast_accepted, 50000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_bodies_decode),
        cmocka_unit_test(test_invalid_bodies_are_refused_with_reason),
        cmocka_unit_test(test_decode_refuses_body_over_limit),
        cmocka_unit_test(test_decode_needs_no_nul_terminator),
        cmocka_unit_test(test_decode_rejects_bad_arguments),
        cmocka_unit_test(test_encode_matches_design),
        cmocka_unit_test(test_encode_decode_round_trip),
        cmocka_unit_test(test_encode_refuses_small_buffer),
        cmocka_unit_test(test_encode_refuses_invalid_values),
        cmocka_unit_test(test_order_id_validity),
        cmocka_unit_test(test_fast_path_agrees_with_json_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

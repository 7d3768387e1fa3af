/* SPDX-License-Identifier: MIT
 * Parked messages: `parked list` shows them without removing or reordering them,
 * `parked replay ORDER_ID` cancels an order that exists by now (once, never early),
 * `parked replay --all` parks unknown orders again and loses nothing; a parked copy
 * keeps every property and header the delivery came with, and its body. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <lapse/message.h>
#include <lapse/store.h>

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Unknown orders ghost-000 .. ghost-149: more than one replay round. */
#define N_GHOSTS 150
/* ghosts, late-1, ghost-dl (dead-lettered by the broker), a non-JSON body and a body
 * without deadline (neither with a message_id) */
#define N_CONSUMER_PARKED (N_GHOSTS + 4)
#define N_PARKED          (N_CONSUMER_PARKED + 1) /* and retry-1, parked after 10 attempts */
#define OUT_CAP           (256 * 1024)
#define PAST              "2020-01-01T00:00:00.000Z"

static char out[OUT_CAP];

typedef struct seq {
    char ids[N_PARKED * 2][LAPSE_ORDER_ID_MAX + 1];
    size_t n;
} seq_t;

static void publish_expiry(h_ctx_t *h, amqp_connection_state_t conn, const char *exchange,
                           const char *routing_key, const char *order_id,
                           int64_t deadline_ms) {
    lapse_expiry_msg_t msg = {
        .version = 1, .deadline_ms = deadline_ms, .created_at_ms = lapse_clock_now_ms()};
    snprintf(msg.order_id, sizeof msg.order_id, "%s", order_id);
    char body[512];
    size_t len;
    assert_int_equal(lapse_expiry_msg_encode(&msg, body, sizeof body, &len), LAPSE_OK);
    char x[128];
    snprintf(x, sizeof x, "%s.%s", h->prefix, exchange);
    h_publish_raw(conn, x, routing_key, body, len, order_id);
}

/* What the retry path parks after the last failed attempt: reason, time and count. */
static void publish_parked_retry(h_ctx_t *h, amqp_connection_state_t conn) {
    const char *body = "{\"v\":1,\"order_id\":\"retry-1\",\"deadline\":\"" PAST
                       "\",\"created_at\":\"" PAST "\"}";
    amqp_table_entry_t e[3];
    e[0].key = amqp_cstring_bytes("x-lapse-reason");
    e[0].value.kind = AMQP_FIELD_KIND_UTF8;
    e[0].value.value.bytes = amqp_cstring_bytes("ERR_STORE_BUSY: database is locked");
    e[1].key = amqp_cstring_bytes("x-lapse-parked-at-ms");
    e[1].value.kind = AMQP_FIELD_KIND_I64;
    e[1].value.value.i64 = lapse_clock_now_ms();
    e[2].key = amqp_cstring_bytes("x-lapse-attempts");
    e[2].value.kind = AMQP_FIELD_KIND_I32;
    e[2].value.value.i32 = 10;
    amqp_basic_properties_t props;
    memset(&props, 0, sizeof props);
    props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG |
                   AMQP_BASIC_HEADERS_FLAG;
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    props.message_id = amqp_cstring_bytes("retry-1");
    props.headers = (amqp_table_t){.num_entries = 3, .entries = e};
    char x[128];
    snprintf(x, sizeof x, "%s.parked", h->prefix);
    assert_int_equal(amqp_basic_publish(conn, 1, amqp_cstring_bytes(x),
                                        amqp_cstring_bytes(""), 0, 0, &props,
                                        amqp_cstring_bytes(body)),
                     0);
}

static int64_t parked_depth(h_ctx_t *h, amqp_connection_state_t conn) {
    char q[128];
    snprintf(q, sizeof q, "%s.parked", h->prefix);
    return h_queue_depth(conn, q);
}

/* `parked list --json [--limit N]`, parsed; the caller frees it. */
static json_t *list_json(h_ctx_t *h, const char *limit) {
    int code = limit ? h_lapse(h, out, sizeof out, "parked", "list", "--json", "--limit",
                               limit, NULL)
                     : h_lapse(h, out, sizeof out, "parked", "list", "--json", NULL);
    assert_int_equal(code, 0);
    json_error_t jerr;
    json_t *root = json_loads(out, 0, &jerr);
    if (!root) {
        fail_msg("parked list --json printed invalid JSON (%s): %.200s", jerr.text, out);
    }
    return root;
}

static void ids_of(json_t *root, seq_t *seq) {
    seq->n = 0;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(root, "messages"), i, m) {
        assert_true(seq->n < sizeof seq->ids / sizeof seq->ids[0]);
        snprintf(seq->ids[seq->n++], sizeof seq->ids[0], "%s",
                 json_string_value(json_object_get(m, "order_id")));
    }
}

static json_t *find(json_t *root, const char *order_id) {
    size_t i;
    json_t *m;
    json_t *found = NULL;
    json_array_foreach(json_object_get(root, "messages"), i, m) {
        if (strcmp(json_string_value(json_object_get(m, "order_id")), order_id) == 0) {
            assert_null(found); /* one each */
            found = m;
        }
    }
    if (!found) {
        fail_msg("order %s is not listed", order_id);
    }
    return found;
}

static void assert_seq_equal(const seq_t *a, const seq_t *b) {
    assert_int_equal(a->n, b->n);
    for (size_t i = 0; i < a->n; i++) {
        if (strcmp(a->ids[i], b->ids[i]) != 0) {
            fail_msg("position %zu: %s vs %s", i, a->ids[i], b->ids[i]);
        }
    }
}

/* The drained queue's order, named as `parked list` names messages. */
static void on_drained(void *opaque, const h_msg_t *m) {
    seq_t *seq = opaque;
    char *id = seq->ids[seq->n++];
    lapse_expiry_msg_t msg;
    const char *key = "\"order_id\":\"";
    const char *at = strstr(m->body, key);
    if (m->message_id[0]) {
        snprintf(id, LAPSE_ORDER_ID_MAX + 1, "%.128s", m->message_id);
    } else if (lapse_expiry_msg_decode(m->body, m->len, &msg, NULL) == LAPSE_OK) {
        snprintf(id, LAPSE_ORDER_ID_MAX + 1, "%s", msg.order_id);
    } else if (at) {
        at += strlen(key);
        snprintf(id, LAPSE_ORDER_ID_MAX + 1, "%.*s", (int)strcspn(at, "\""), at);
    } else {
        snprintf(id, LAPSE_ORDER_ID_MAX + 1, "-");
    }
}

static size_t log_size(h_ctx_t *h) {
    struct stat st;
    return stat(h_path(h, "cli.log"), &st) == 0 ? (size_t)st.st_size : 0;
}

/* Exit code, nothing on stdout, and exactly one stderr line mentioning fragment. */
static void expect_fail(h_ctx_t *h, int want, const char *fragment, const char *a0,
                        const char *a1, const char *a2, const char *a3) {
    size_t mark = log_size(h);
    int code = h_lapse(h, out, sizeof out, "parked", a0, a1, a2, a3, NULL);
    FILE *f = fopen(h_path(h, "cli.log"), "r");
    assert_non_null(f);
    fseek(f, (long)mark, SEEK_SET);
    char err[4096];
    size_t n = fread(err, 1, sizeof err - 1, f);
    err[n] = '\0';
    fclose(f);
    fprintf(stderr, "parked %s %s -> %d: %s", a0 ? a0 : "", a1 ? a1 : "", code, err);
    assert_int_equal(code, want);
    assert_string_equal(out, "");
    assert_non_null(strstr(err, fragment));
    assert_true(n > 0 && strchr(err, '\n') == err + n - 1);
}

static void test_list_and_replay_parked_messages(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "parked", "2s", true);
    pid_t consumer = h_spawn_consumer(&h, "consumer.log", NULL);
    h_wait_lines(&h, "consumer.log", "event=consuming", 1, h_ms(10000));
    amqp_connection_state_t conn = h_amqp_open(&h);
    int64_t t0 = lapse_clock_now_ms();

    /* Park: unknown orders straight into the expired exchange, one through a holding
     * queue (so it carries x-death), two bodies the decoder refuses, and one message as
     * the retry path leaves it after ten failed attempts. */
    char id[32];
    for (int i = 0; i < N_GHOSTS; i++) {
        snprintf(id, sizeof id, "ghost-%03d", i);
        publish_expiry(&h, conn, "expired", "order.expired", id, t0 - 1000);
    }
    publish_expiry(&h, conn, "expired", "order.expired", "late-1", t0 - 1000);
    publish_expiry(&h, conn, "hold", "2s", "ghost-dl", t0 + 2000);
    char x[128];
    snprintf(x, sizeof x, "%s.expired", h.prefix);
    h_publish_raw(conn, x, "order.expired", "this is not json", 16, NULL);
    const char *nodl = "{\"v\":1,\"order_id\":\"nodl-1\",\"created_at\":\"" PAST "\"}";
    h_publish_raw(conn, x, "order.expired", nodl, strlen(nodl), NULL);
    publish_parked_retry(&h, conn);
    h_wait_lines(&h, "consumer.log", "decision=parked", N_CONSUMER_PARKED, h_ms(20000));
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=parked"),
                     N_CONSUMER_PARKED);
    /* The consumer logs decision=parked before its park is confirmed, and retry-1 went
     * out unconfirmed: the last may still be on its way (a fresh-machine run read 154).
     */
    char parked_q[128];
    snprintf(parked_q, sizeof parked_q, "%s.parked", h.prefix);
    assert_int_equal(h_wait_depth(conn, parked_q, N_PARKED, h_ms(10000)), N_PARKED);
    int64_t t1 = lapse_clock_now_ms();

    /* List: every message with its order id, reason, attempts and time. */
    json_t *root = list_json(&h, NULL);
    assert_int_equal(json_integer_value(json_object_get(root, "listed")), N_PARKED);
    assert_int_equal(json_integer_value(json_object_get(root, "more")), 0);
    assert_int_equal(json_array_size(json_object_get(root, "messages")), N_PARKED);
    for (int i = 0; i < N_GHOSTS; i++) {
        snprintf(id, sizeof id, "ghost-%03d", i);
        json_t *m = find(root, id);
        char reason[64];
        snprintf(reason, sizeof reason, "unknown order: %s", id);
        assert_string_equal(json_string_value(json_object_get(m, "reason")), reason);
        assert_string_equal(json_string_value(json_object_get(m, "message_id")), id);
        assert_int_equal(json_integer_value(json_object_get(m, "attempts")), 1);
        json_int_t at = json_integer_value(json_object_get(m, "parked_at_ms"));
        assert_true(at >= t0 && at <= t1);
    }
    assert_string_equal(
        json_string_value(json_object_get(find(root, "ghost-dl"), "reason")),
        "unknown order: ghost-dl");
    json_t *m = find(root, "-");
    assert_true(json_is_null(json_object_get(m, "message_id")));
    assert_int_equal(
        strncmp(json_string_value(json_object_get(m, "reason")), "ERR_MSG_JSON: ", 14),
        0);
    assert_int_equal(json_integer_value(json_object_get(m, "body_bytes")), 16);
    m = find(root, "nodl-1"); /* named by its body */
    assert_true(json_is_null(json_object_get(m, "message_id")));
    assert_int_equal(
        strncmp(json_string_value(json_object_get(m, "reason")), "ERR_MSG_FIELD: ", 15),
        0);
    m = find(root, "retry-1");
    assert_int_equal(json_integer_value(json_object_get(m, "attempts")), 10);
    assert_string_equal(json_string_value(json_object_get(m, "reason")),
                        "ERR_STORE_BUSY: database is locked");
    seq_t first, again;
    ids_of(root, &first);
    json_decref(root);

    /* Listing changes nothing: same messages, same order, all still there. */
    root = list_json(&h, NULL);
    ids_of(root, &again);
    json_decref(root);
    assert_seq_equal(&first, &again);
    assert_int_equal(parked_depth(&h, conn), N_PARKED);

    /* A limit lists the head of the queue and counts the rest. */
    root = list_json(&h, "10");
    assert_int_equal(json_integer_value(json_object_get(root, "listed")), 10);
    assert_int_equal(json_integer_value(json_object_get(root, "more")), N_PARKED - 10);
    ids_of(root, &again);
    json_decref(root);
    for (size_t i = 0; i < 10; i++) {
        assert_string_equal(again.ids[i], first.ids[i]);
    }
    assert_int_equal(
        h_lapse(&h, out, sizeof out, "parked", "list", "--limit", "10", NULL), 0);
    char want[128];
    snprintf(want, sizeof want, "10 parked messages listed, %d more not listed",
             N_PARKED - 10);
    assert_non_null(strstr(out, want));
    assert_int_equal(h_lapse(&h, out, sizeof out, "parked", "list", NULL), 0);
    snprintf(want, sizeof want, "%d parked messages", N_PARKED);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "unknown order: ghost-007"));
    assert_int_equal(parked_depth(&h, conn), N_PARKED);

    /* late-1 exists by now (recorded, its own message lost), due in three seconds:
     * replaying its parked message cancels it, once, not before the deadline. */
    lapse_status_t rc;
    lapse_store_t *store = lapse_store_open(h.store, &rc, NULL);
    assert_non_null(store);
    int64_t deadline = lapse_clock_now_ms() + 3000;
    lapse_new_order_t order = {
        .order_id = "late-1", .deadline_ms = deadline, .created_at_ms = t0};
    lapse_status_t result;
    assert_int_equal(lapse_store_insert_orders(store, &order, 1, &result, NULL),
                     LAPSE_OK);
    assert_int_equal(result, LAPSE_OK);
    const char *late_ids[] = {"late-1"};
    assert_int_equal(lapse_store_mark_scheduled(store, late_ids, 1, NULL), LAPSE_OK);
    lapse_store_close(store);
    assert_int_equal(h_lapse(&h, out, sizeof out, "parked", "replay", "late-1", NULL), 0);
    assert_non_null(strstr(out, "replayed 1 parked message"));
    assert_int_equal(parked_depth(&h, conn), N_PARKED - 1);
    /* The others stayed, in their order. */
    root = list_json(&h, NULL);
    ids_of(root, &again);
    json_decref(root);
    seq_t expect = first;
    expect.n = 0;
    for (size_t i = 0; i < first.n; i++) {
        if (strcmp(first.ids[i], "late-1") != 0) {
            memcpy(expect.ids[expect.n++], first.ids[i], sizeof first.ids[i]);
        }
    }
    assert_seq_equal(&expect, &again);
    assert_int_equal(h_wait_sql(&h, 1, h_ms(20000),
                                "SELECT count(*) FROM orders WHERE order_id='late-1' AND "
                                "status='cancelled'"),
                     1);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders WHERE order_id='late-1' "
                                   "AND cancelled_at_ms >= deadline_ms"),
                     1);
    assert_true(lapse_clock_now_ms() >= deadline);

    /* Errors: a missing id is 4, bad usage is 2, each one line on stderr. */
    expect_fail(&h, 4, "no parked message for order 'nobody'", "replay", "nobody", NULL,
                NULL);
    expect_fail(&h, 4, "no parked message for order 'late-1'", "replay", "late-1", NULL,
                NULL);
    expect_fail(&h, 2, "--all or one ORDER_ID", "replay", NULL, NULL, NULL);
    expect_fail(&h, 2, "--all or one ORDER_ID", "replay", "--all", "ghost-001", NULL);
    expect_fail(&h, 2, "--all or one ORDER_ID", "replay", "ghost-001", "ghost-002", NULL);
    expect_fail(&h, 2, "unknown option '--bogus'", "replay", "--bogus", NULL, NULL);
    expect_fail(&h, 2, "invalid order id", "replay", "bad id!", NULL, NULL);
    expect_fail(&h, 2, "--limit", "list", "--limit", "0", NULL);
    expect_fail(&h, 2, "--limit", "list", "--limit", "ten", NULL);
    expect_fail(&h, 2, "needs a value", "list", "--limit", NULL, NULL);
    expect_fail(&h, 2, "unexpected argument 'extra'", "list", "extra", NULL, NULL);
    expect_fail(&h, 2, "unknown option '--bogus'", "list", "--bogus", NULL, NULL);
    expect_fail(&h, 2, "unknown action 'frob'", "frob", NULL, NULL, NULL);
    expect_fail(&h, 2, "expected 'list' or 'replay'", NULL, NULL, NULL, NULL);
    const char *helps[][2] = {{"--help", NULL}, {"list", "--help"}, {"replay", "--help"}};
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(
            h_lapse(&h, out, sizeof out, "parked", helps[i][0], helps[i][1], NULL), 0);
        assert_int_equal(strncmp(out, "usage: lapse parked", 19), 0);
    }
    assert_int_equal(parked_depth(&h, conn), N_PARKED - 1);

    /* Replay everything: unknown orders (and bad bodies) are parked again, fresh, each
     * exactly once; nothing else is cancelled. */
    int64_t t2 = lapse_clock_now_ms();
    assert_int_equal(h_lapse(&h, out, sizeof out, "parked", "replay", "--all", NULL), 0);
    snprintf(want, sizeof want, "replayed %d parked messages", N_PARKED - 1);
    assert_non_null(strstr(out, want));
    /* Consumer-parked the first time, minus late-1, plus every replayed one. */
    size_t want_lines = N_CONSUMER_PARKED - 1 + N_PARKED - 1 + 1;
    h_wait_lines(&h, "consumer.log", "decision=parked", want_lines, h_ms(20000));
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=parked"), want_lines);
    /* As above: the last parks may still be on their way when their lines are logged
     * (a run on a loaded machine read 0 here, 1.5 s after the last line). */
    assert_int_equal(h_wait_depth(conn, parked_q, N_PARKED - 1, h_ms(10000)),
                     N_PARKED - 1);
    usleep(h_ms(1500)); /* nothing more arrives */
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=parked"), want_lines);
    assert_int_equal(parked_depth(&h, conn), N_PARKED - 1);
    char q[128];
    snprintf(q, sizeof q, "%s.expired", h.prefix);
    assert_int_equal(h_queue_depth(conn, q), 0);

    root = list_json(&h, NULL);
    assert_int_equal(json_integer_value(json_object_get(root, "listed")), N_PARKED - 1);
    for (int i = 0; i < N_GHOSTS; i++) {
        snprintf(id, sizeof id, "ghost-%03d", i);
        m = find(root, id);
        assert_true(json_integer_value(json_object_get(m, "parked_at_ms")) >= t2);
    }
    m = find(root, "retry-1"); /* the replay gave it a fresh start */
    assert_string_equal(json_string_value(json_object_get(m, "reason")),
                        "unknown order: retry-1");
    assert_int_equal(json_integer_value(json_object_get(m, "attempts")), 1);
    assert_true(json_integer_value(json_object_get(m, "parked_at_ms")) >= t2);
    assert_int_equal(
        strncmp(json_string_value(json_object_get(find(root, "-"), "reason")),
                "ERR_MSG_JSON: ", 14),
        0);
    find(root, "nodl-1");
    find(root, "ghost-dl");
    seq_t listed, drained = {.n = 0};
    ids_of(root, &listed);
    json_decref(root);

    /* The queue's real order is the listed one. */
    snprintf(q, sizeof q, "%s.parked", h.prefix);
    size_t n = h_drain(conn, q, h_ms(500), on_drained, &drained);
    assert_int_equal(n, N_PARKED - 1);
    assert_seq_equal(&listed, &drained);
    assert_int_equal(h_lapse(&h, out, sizeof out, "parked", "list", NULL), 0);
    assert_string_equal(out, "no parked messages\n");

    /* late-1 was cancelled once; nothing else was. */
    assert_int_equal(
        h_sql_int(&h, "SELECT count(*) FROM orders WHERE status='cancelled'"), 1);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM events"), 1);
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=cancelled"), 1);
    assert_int_equal(h_count_lines(&h, "consumer.log", "order_id=late-1 decision=parked"),
                     1);
    assert_int_equal(h_count_lines(&h, "consumer.log", "event=reconnect"), 0);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    h_amqp_close(conn);
    h_teardown(&h);
}

/* ---- the parked copy is the delivery as it came ---------------------------------- */

#define COPY_BIG 200000 /* more than frame_max (131072): a body of two frames */

static amqp_table_entry_t str_entry(const char *k, const char *v) {
    amqp_table_entry_t e = {.key = amqp_cstring_bytes(k)};
    e.value.kind = AMQP_FIELD_KIND_UTF8;
    e.value.value.bytes = amqp_cstring_bytes(v);
    return e;
}

static const amqp_field_value_t *header(const amqp_table_t *t, const char *key) {
    for (int i = 0; i < t->num_entries; i++) {
        if (t->entries[i].key.len == strlen(key) &&
            memcmp(t->entries[i].key.bytes, key, strlen(key)) == 0) {
            return &t->entries[i].value;
        }
    }
    fail_msg("no header %s", key);
    return NULL;
}

static void assert_bytes(amqp_bytes_t b, const char *want) {
    if (b.len != strlen(want) || memcmp(b.bytes, want, b.len) != 0) {
        fail_msg("'%.*s', not '%s'", (int)b.len, (const char *)b.bytes, want);
    }
}

/* Every property a shop might set, nested headers among them, and a TTL of its own. */
static void publish_rich(amqp_connection_state_t conn, const char *exchange,
                         const char *key, const char *message_id, const void *body,
                         size_t len) {
    amqp_table_entry_t meta[1] = {str_entry("region", "eu-west")};
    amqp_field_value_t tags[2];
    tags[0].kind = tags[1].kind = AMQP_FIELD_KIND_UTF8;
    tags[0].value.bytes = amqp_cstring_bytes("p");
    tags[1].value.bytes = amqp_cstring_bytes("q");
    amqp_table_entry_t e[4] = {str_entry("x-shop-tenant", "acme")};
    e[1].key = amqp_cstring_bytes("x-shop-n");
    e[1].value.kind = AMQP_FIELD_KIND_I64;
    e[1].value.value.i64 = 1234567890123;
    e[2].key = amqp_cstring_bytes("x-shop-meta");
    e[2].value.kind = AMQP_FIELD_KIND_TABLE;
    e[2].value.value.table = (amqp_table_t){.num_entries = 1, .entries = meta};
    e[3].key = amqp_cstring_bytes("x-shop-tags");
    e[3].value.kind = AMQP_FIELD_KIND_ARRAY;
    e[3].value.value.array = (amqp_array_t){.num_entries = 2, .entries = tags};
    amqp_basic_properties_t props;
    memset(&props, 0, sizeof props);
    props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_CONTENT_ENCODING_FLAG |
                   AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
                   AMQP_BASIC_PRIORITY_FLAG | AMQP_BASIC_CORRELATION_ID_FLAG |
                   AMQP_BASIC_REPLY_TO_FLAG | AMQP_BASIC_EXPIRATION_FLAG |
                   AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TIMESTAMP_FLAG |
                   AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_APP_ID_FLAG;
    props.content_type = amqp_cstring_bytes("application/json");
    props.content_encoding = amqp_cstring_bytes("identity");
    props.headers = (amqp_table_t){.num_entries = 4, .entries = e};
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    props.priority = 3;
    props.correlation_id = amqp_cstring_bytes("corr-7");
    props.reply_to = amqp_cstring_bytes("replies");
    props.expiration = amqp_cstring_bytes("600000");
    props.message_id = amqp_cstring_bytes(message_id);
    props.timestamp = 1234567;
    props.type = amqp_cstring_bytes("order.expire");
    props.app_id = amqp_cstring_bytes("shop");
    amqp_bytes_t b = {.len = len, .bytes = (void *)body};
    assert_int_equal(amqp_basic_publish(conn, 1, amqp_cstring_bytes(exchange),
                                        amqp_cstring_bytes(key), 0, 0, &props, b),
                     0);
}

/* A parked copy keeps every property and header it came with (the x-death the broker
 * added included) and its body, and only adds why; its own TTL is dropped. */
static void assert_kept(const h_ctx_t *h, const amqp_message_t *m, const char *reason) {
    const amqp_basic_properties_t *p = &m->properties;
    assert_true(p->_flags & AMQP_BASIC_HEADERS_FLAG);
    assert_false(p->_flags & AMQP_BASIC_EXPIRATION_FLAG);
    assert_bytes(p->content_type, "application/json");
    assert_bytes(p->content_encoding, "identity");
    assert_int_equal(p->delivery_mode, AMQP_DELIVERY_PERSISTENT);
    assert_int_equal(p->priority, 3);
    assert_bytes(p->correlation_id, "corr-7");
    assert_bytes(p->reply_to, "replies");
    assert_int_equal(p->timestamp, 1234567);
    assert_bytes(p->type, "order.expire");
    assert_bytes(p->app_id, "shop");
    assert_bytes(header(&p->headers, "x-shop-tenant")->value.bytes, "acme");
    assert_int_equal(header(&p->headers, "x-shop-n")->value.i64, 1234567890123);
    const amqp_table_t *meta = &header(&p->headers, "x-shop-meta")->value.table;
    assert_bytes(header(meta, "region")->value.bytes, "eu-west");
    const amqp_array_t *tags = &header(&p->headers, "x-shop-tags")->value.array;
    assert_int_equal(tags->num_entries, 2);
    assert_bytes(tags->entries[0].value.bytes, "p");
    assert_bytes(tags->entries[1].value.bytes, "q");
    const amqp_array_t *deaths = &header(&p->headers, "x-death")->value.array;
    assert_int_equal(deaths->num_entries, 1);
    const amqp_table_t *death = &deaths->entries[0].value.table;
    char queue[160];
    snprintf(queue, sizeof queue, "%s.hold.1s", h->prefix);
    assert_bytes(header(death, "queue")->value.bytes, queue);
    assert_bytes(header(death, "reason")->value.bytes, "expired");
    amqp_bytes_t why = header(&p->headers, "x-lapse-reason")->value.bytes;
    if (why.len < strlen(reason) || memcmp(why.bytes, reason, strlen(reason)) != 0) {
        fail_msg("reason '%.*s', not '%s...'", (int)why.len, (const char *)why.bytes,
                 reason);
    }
}

static void test_parked_copy_is_the_delivery_as_it_came(void **state) {
    (void)state;
    h_ctx_t h;
    h_setup(&h, "parked-copy", "1s", true);
    pid_t consumer = h_spawn_consumer(&h, "consumer.log", NULL);
    h_wait_lines(&h, "consumer.log", "event=consuming", 1, h_ms(10000));
    amqp_connection_state_t conn = h_amqp_open(&h);
    char hold[128];
    snprintf(hold, sizeof hold, "%s.hold", h.prefix);
    /* Through the holding queue, as lapse's own messages come: an unknown order (parked
     * once the store has answered), a body the decoder refuses (parked at once) and a
     * body of two frames (parked cut, its properties read past a released frame). */
    lapse_expiry_msg_t msg = {.version = 1,
                              .deadline_ms = lapse_clock_now_ms() + 1000,
                              .created_at_ms = lapse_clock_now_ms()};
    snprintf(msg.order_id, sizeof msg.order_id, "copy-ghost");
    char body[512];
    size_t len;
    assert_int_equal(lapse_expiry_msg_encode(&msg, body, sizeof body, &len), LAPSE_OK);
    publish_rich(conn, hold, "1s", "copy-ghost", body, len);
    publish_rich(conn, hold, "1s", "copy-bad", "{not json", 9);
    char *big = malloc(COPY_BIG);
    assert_non_null(big);
    memset(big, 'x', COPY_BIG);
    publish_rich(conn, hold, "1s", "copy-big", big, COPY_BIG);
    free(big);
    h_wait_lines(&h, "consumer.log", "decision=parked", 3, h_ms(20000));

    char parked[128];
    snprintf(parked, sizeof parked, "%s.parked", h.prefix);
    int seen = 0; /* a bit for each of the three */
    for (int64_t until = lapse_clock_now_ms() + h_ms(10000);
         seen != 7 && lapse_clock_now_ms() < until;) {
        amqp_rpc_reply_t r = amqp_basic_get(conn, 1, amqp_cstring_bytes(parked), 1);
        assert_int_equal(r.reply_type, AMQP_RESPONSE_NORMAL);
        if (r.reply.id == AMQP_BASIC_GET_EMPTY_METHOD) {
            usleep(50000);
            continue;
        }
        amqp_message_t m;
        assert_int_equal(amqp_read_message(conn, 1, &m, 0).reply_type,
                         AMQP_RESPONSE_NORMAL);
        amqp_bytes_t id = m.properties.message_id;
        if (id.len == 10 && memcmp(id.bytes, "copy-ghost", 10) == 0) {
            assert_kept(&h, &m, "unknown order: copy-ghost");
            assert_int_equal(m.body.len, len);
            assert_memory_equal(m.body.bytes, body, len);
            seen |= 1;
        } else if (id.len == 8 && memcmp(id.bytes, "copy-bad", 8) == 0) {
            assert_kept(&h, &m, "ERR_MSG_JSON: ");
            assert_bytes(m.body, "{not json");
            seen |= 2;
        } else {
            assert_bytes(id, "copy-big");
            assert_kept(&h, &m, "ERR_MSG_TOO_LARGE: body is 200000 bytes");
            assert_int_equal(m.body.len, 16384);
            assert_true(((const char *)m.body.bytes)[0] == 'x' &&
                        ((const char *)m.body.bytes)[16383] == 'x');
            seen |= 4;
        }
        amqp_destroy_message(&m);
        amqp_maybe_release_buffers(conn);
    }
    assert_int_equal(seen, 7);
    assert_int_equal(parked_depth(&h, conn), 0);
    assert_int_equal(h_count_lines(&h, "consumer.log", "decision=parked"), 3);
    assert_int_equal(h_sql_int(&h, "SELECT count(*) FROM orders"), 0);
    assert_int_equal(h_stop(consumer, SIGTERM, h_ms(10000)), 0);
    h_amqp_close(conn);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_and_replay_parked_messages),
        cmocka_unit_test(test_parked_copy_is_the_delivery_as_it_came),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

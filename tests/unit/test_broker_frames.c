/* SPDX-License-Identifier: MIT
 * A staged publish (src/broker_frames.c) is byte for byte what rabbitmq-c's
 * amqp_basic_publish writes to its socket: fixed cases (no properties, the event's
 * properties with headers, an empty body, bodies split at frame_max), then random ones.
 * The reference is rabbitmq-c itself writing into a loopback TCP connection that this
 * test reads; no broker is involved, none is needed to compare bytes. */
#include "broker_int.h"

#include <lapse/message.h>

#include <amqp_tcp_socket.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#define RANDOM_CASES 3000
#define BODY_MAX     40000

/* rabbitmq-c writing into one end of a loopback connection; the test reads the other. */
typedef struct ref {
    amqp_connection_state_t conn;
    int peer;
} ref_t;

static void ref_open(ref_t *r, int frame_max) {
    int lsn = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(lsn >= 0);
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    assert_int_equal(bind(lsn, (struct sockaddr *)&addr, sizeof addr), 0);
    assert_int_equal(listen(lsn, 1), 0);
    assert_int_equal(getsockname(lsn, (struct sockaddr *)&addr, &len), 0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof addr), 0);
    r->peer = accept(lsn, NULL, NULL);
    assert_true(r->peer >= 0);
    close(lsn);
    r->conn = amqp_new_connection();
    amqp_socket_t *sock = amqp_tcp_socket_new(r->conn);
    assert_non_null(sock);
    amqp_tcp_socket_set_sockfd(sock, fd);
    /* A new connection waits for the broker's protocol header; once it has read one,
     * it is in the state of a logged-in connection, which may be tuned. */
    uint8_t header[] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};
    amqp_bytes_t in = {.len = sizeof header, .bytes = header};
    while (in.len > 0) {
        amqp_frame_t frame;
        int used = amqp_handle_input(r->conn, in, &frame);
        assert_true(used > 0);
        in.bytes = (uint8_t *)in.bytes + used;
        in.len -= (size_t)used;
    }
    assert_int_equal(amqp_tune_connection(r->conn, 0, frame_max, 0), AMQP_STATUS_OK);
    assert_int_equal(amqp_get_frame_max(r->conn), frame_max);
}

static void ref_close(ref_t *r) {
    amqp_destroy_connection(r->conn);
    close(r->peer);
}

/* What rabbitmq-c sent for one publish (new, *n bytes), or NULL when it refused it.
 * At least `expect` bytes are waited for: rabbitmq-c sends a body that ends on a frame
 * boundary with MSG_MORE, which the kernel holds for up to 200 ms. */
static uint8_t *ref_publish(ref_t *r, amqp_bytes_t exchange, amqp_bytes_t key,
                            bool mandatory, const amqp_basic_properties_t *props,
                            amqp_bytes_t body, size_t expect, size_t *n) {
    int st = amqp_basic_publish(r->conn, LAPSE__CHANNEL, exchange, key, mandatory, 0,
                                props, body);
    size_t cap = body.len + 65536, used = 0;
    uint8_t *out = malloc(cap);
    assert_non_null(out);
    for (;;) {
        struct pollfd pfd = {.fd = r->peer, .events = POLLIN};
        if (poll(&pfd, 1, st == AMQP_STATUS_OK && used < expect ? 2000 : 0) <= 0) {
            break;
        }
        ssize_t got = recv(r->peer, out + used, cap - used, MSG_DONTWAIT);
        assert_true(got > 0);
        used += (size_t)got;
        assert_true(used < cap);
    }
    *n = used;
    if (st != AMQP_STATUS_OK) {
        assert_int_equal(used, 0);
        free(out);
        return NULL;
    }
    return out;
}

/* Both ways, one publish appended to f after what it held: the same bytes, or both
 * refuse (and f is left as it was). */
static void check(ref_t *r, lapse__frames_t *f, const char *exchange, const char *key,
                  bool mandatory, const amqp_basic_properties_t *props,
                  amqp_bytes_t body) {
    size_t before = f->n, n = 0;
    lapse_status_t rc = lapse__frames_publish(
        f, (size_t)amqp_get_frame_max(r->conn), LAPSE__CHANNEL,
        amqp_cstring_bytes(exchange), amqp_cstring_bytes(key), mandatory, props, body);
    uint8_t *want = ref_publish(r, amqp_cstring_bytes(exchange), amqp_cstring_bytes(key),
                                mandatory, props, body, f->n - before, &n);
    if (want == NULL) {
        assert_int_equal(rc, LAPSE_ERR_INVALID);
        assert_int_equal(f->n, before);
        return;
    }
    assert_int_equal(rc, LAPSE_OK);
    assert_int_equal(f->n - before, n);
    assert_memory_equal(f->p + before, want, n);
    free(want);
}

static amqp_bytes_t filled(size_t len, uint8_t seed) {
    uint8_t *p = malloc(len > 0 ? len : 1);
    assert_non_null(p);
    for (size_t i = 0; i < len; i++) {
        p[i] = (uint8_t)(seed + i * 31u);
    }
    return (amqp_bytes_t){.len = len, .bytes = p};
}

/* The properties of an order.cancelled event, and of an expiry message's headers. */
static amqp_basic_properties_t event_props(amqp_table_entry_t *entries) {
    amqp_basic_properties_t p;
    memset(&p, 0, sizeof p);
    p._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
               AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TIMESTAMP_FLAG |
               AMQP_BASIC_APP_ID_FLAG | AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_HEADERS_FLAG;
    p.content_type = amqp_cstring_bytes("application/json");
    p.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    p.message_id = amqp_cstring_bytes("cancelled:ord-1");
    p.timestamp = 1796057253;
    p.app_id = amqp_cstring_bytes(LAPSE_APP_ID);
    p.type = amqp_cstring_bytes(LAPSE_EVENT_CANCELLED);
    entries[0] = lapse__entry_i64(LAPSE_HDR_DEADLINE, 1796057253548);
    entries[1] = lapse__entry_str(LAPSE_HDR_DEADLINE_TEXT, "2026-11-30T16:47:33.548Z");
    entries[2] = lapse__entry_i64(LAPSE_HDR_PUBLISH_SEQ, 1001);
    p.headers = (amqp_table_t){.num_entries = 3, .entries = entries};
    return p;
}

static void test_fixed_publishes_match_rabbitmq_c(void **state) {
    (void)state;
    ref_t r;
    ref_open(&r, 131072);
    lapse__frames_t f = {0};
    amqp_table_entry_t entries[3];
    amqp_basic_properties_t props = event_props(entries);
    const char *body =
        "{\"event\":\"order.cancelled\",\"order_id\":\"ord-1\",\"holds\":[]}";
    check(&r, &f, "t.events", LAPSE_EVENT_CANCELLED, true, &props,
          amqp_cstring_bytes(body));
    check(&r, &f, "", "t.hold.1s", false, NULL, amqp_cstring_bytes(body));
    check(&r, &f, "t.expired", "", true, &props, amqp_empty_bytes); /* no body frame */
    /* Three publishes, one after the other in the same buffer. */
    assert_true(f.n > 3 * 8 * 3);
    lapse__frames_free(&f);
    assert_null(f.p);
    assert_int_equal(f.n, 0);
    ref_close(&r);
}

static void test_bodies_are_split_at_frame_max(void **state) {
    (void)state;
    const int frame_max = 4096; /* AMQP's least */
    ref_t r;
    ref_open(&r, frame_max);
    lapse__frames_t f = {0};
    size_t chunk = (size_t)frame_max - 8;
    size_t lens[] = {1, chunk - 1, chunk, chunk + 1, 3 * chunk, 3 * chunk + 7};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        amqp_bytes_t body = filled(lens[i], (uint8_t)i);
        f.n = 0;
        check(&r, &f, "t.events", "k", true, NULL, body);
        free(body.bytes);
    }
    lapse__frames_free(&f);
    ref_close(&r);
}

static void test_properties_larger_than_a_frame_are_refused_by_both(void **state) {
    (void)state;
    ref_t r;
    ref_open(&r, 4096);
    lapse__frames_t f = {0};
    check(&r, &f, "t.events", "k", false, NULL, amqp_cstring_bytes("before"));
    size_t held = f.n;
    amqp_bytes_t big = filled(6000, 7);
    ((char *)big.bytes)[big.len - 1] = '\0';
    for (size_t i = 0; i + 1 < big.len; i++) {
        ((char *)big.bytes)[i] = (char)('a' + i % 26);
    }
    amqp_table_entry_t e = lapse__entry_str("x-big", big.bytes);
    amqp_basic_properties_t props = {._flags = AMQP_BASIC_HEADERS_FLAG,
                                     .headers = {.num_entries = 1, .entries = &e}};
    check(&r, &f, "t.events", "k", false, &props, amqp_cstring_bytes("{}"));
    assert_int_equal(f.n, held); /* the publish before it is kept, whole */
    /* Between 1 KiB and frame_max: encoded after the first try fails. */
    ((char *)big.bytes)[3000] = '\0';
    check(&r, &f, "t.events", "k", false, &props, amqp_cstring_bytes("{}"));
    free(big.bytes);
    lapse__frames_free(&f);
    ref_close(&r);
}

static void test_random_publishes_match_rabbitmq_c(void **state) {
    (void)state;
    srand(20261201);
    const int frame_maxes[] = {4096, 8192, 131072};
    for (size_t m = 0; m < sizeof frame_maxes / sizeof *frame_maxes; m++) {
        ref_t r;
        ref_open(&r, frame_maxes[m]);
        lapse__frames_t f = {0};
        for (int i = 0; i < RANDOM_CASES; i++) {
            amqp_table_entry_t entries[3];
            amqp_basic_properties_t props = event_props(entries);
            props._flags &= (amqp_flags_t)rand();
            props.headers.num_entries = rand() % 4;
            char exchange[40], key[40];
            snprintf(exchange, sizeof exchange, "%.*s", rand() % 30,
                     "lapse.events.xyz.abcdefghijklmnopqrst");
            snprintf(key, sizeof key, "%.*s", rand() % 30,
                     "order.cancelled.0123456789abcdef");
            size_t len =
                rand() % 8 == 0 ? (size_t)rand() % BODY_MAX : (size_t)rand() % 600;
            amqp_bytes_t body = filled(len, (uint8_t)i);
            if (f.n > 256 * 1024) {
                f.n = 0; /* as a send empties the stage */
            }
            check(&r, &f, exchange, key, rand() % 2 == 0, rand() % 5 == 0 ? NULL : &props,
                  body);
            free(body.bytes);
        }
        lapse__frames_free(&f);
        ref_close(&r);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed_publishes_match_rabbitmq_c),
        cmocka_unit_test(test_bodies_are_split_at_frame_max),
        cmocka_unit_test(test_properties_larger_than_a_frame_are_refused_by_both),
        cmocka_unit_test(test_random_publishes_match_rabbitmq_c),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

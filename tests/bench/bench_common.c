/* SPDX-License-Identifier: MIT
 * Bench helpers shared by the ceiling programs. */
#include "bench_common.h"

#include <amqp_tcp_socket.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

void bench_die(const char *what, const char *detail) {
    fprintf(stderr, "bench: %s: %s\n", what, detail);
    exit(1);
}

void bench_check(amqp_rpc_reply_t reply, const char *what) {
    char text[256];
    switch (reply.reply_type) {
        case AMQP_RESPONSE_NORMAL:
            return;
        case AMQP_RESPONSE_NONE:
            bench_die(what, "missing RPC reply");
        case AMQP_RESPONSE_LIBRARY_EXCEPTION:
            bench_die(what, amqp_error_string2(reply.library_error));
        case AMQP_RESPONSE_SERVER_EXCEPTION:
            if (reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
                const amqp_channel_close_t *m = reply.reply.decoded;
                snprintf(text, sizeof text, "channel closed: %u %.*s", m->reply_code,
                         (int)m->reply_text.len, (const char *)m->reply_text.bytes);
            } else if (reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
                const amqp_connection_close_t *m = reply.reply.decoded;
                snprintf(text, sizeof text, "connection closed: %u %.*s", m->reply_code,
                         (int)m->reply_text.len, (const char *)m->reply_text.bytes);
            } else {
                snprintf(text, sizeof text, "unexpected method 0x%08x", reply.reply.id);
            }
            bench_die(what, text);
    }
    bench_die(what, "unknown reply type");
}

amqp_connection_state_t bench_connect(const char *url, const char *name) {
    char *copy = strdup(url);
    struct amqp_connection_info info;
    if (!copy || amqp_parse_url(copy, &info) != AMQP_STATUS_OK) {
        bench_die("bad AMQP URL", url);
    }
    amqp_connection_state_t conn = amqp_new_connection();
    amqp_socket_t *socket = amqp_tcp_socket_new(conn);
    if (!socket) {
        bench_die("socket", "cannot create");
    }
    int st = amqp_socket_open(socket, info.host, info.port);
    if (st != AMQP_STATUS_OK) {
        bench_die("connect", amqp_error_string2(st));
    }
    amqp_table_entry_t entry = {
        .key = amqp_cstring_bytes("connection_name"),
        .value = {.kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes(name)}};
    amqp_table_t props = {.num_entries = 1, .entries = &entry};
    bench_check(amqp_login_with_properties(conn, info.vhost, 0, AMQP_DEFAULT_FRAME_SIZE,
                                           0, &props, AMQP_SASL_METHOD_PLAIN, info.user,
                                           info.password),
                "login");
    free(copy);
    amqp_channel_open(conn, BENCH_CHANNEL);
    bench_check(amqp_get_rpc_reply(conn), "channel.open");
    return conn;
}

void bench_close(amqp_connection_state_t conn) {
    amqp_channel_close(conn, BENCH_CHANNEL, AMQP_REPLY_SUCCESS);
    amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(conn);
}

void bench_declare(amqp_connection_state_t conn, const char *queue, bool quorum) {
    amqp_table_entry_t entry = {.key = amqp_cstring_bytes("x-queue-type"),
                                .value = {.kind = AMQP_FIELD_KIND_UTF8,
                                          .value.bytes = amqp_cstring_bytes("quorum")}};
    amqp_table_t args = {.num_entries = quorum ? 1 : 0, .entries = &entry};
    amqp_queue_declare(conn, BENCH_CHANNEL, amqp_cstring_bytes(queue), 0, 1, 0, 0, args);
    bench_check(amqp_get_rpc_reply(conn), "queue.declare");
}

double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

size_t bench_count(const char *text, const char *what) {
    char *end;
    unsigned long long n = strtoull(text, &end, 10);
    if (*end == 'k' || *end == 'K') {
        n *= 1000;
        end++;
    } else if (*end == 'M') {
        n *= 1000000;
        end++;
    }
    if (end == text || *end != '\0' || n == 0) {
        fprintf(stderr, "bench: %s: '%s' is not a positive count\n", what, text);
        exit(2);
    }
    return (size_t)n;
}

static void format_ms(int64_t ms, char out[32]) {
    time_t s = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&s, &tm);
    size_t n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, 32 - n, ".%03dZ", (int)(ms % 1000));
}

size_t bench_body(char *buf, size_t cap, size_t i, int64_t deadline_ms) {
    char deadline[32];
    char created[32];
    format_ms(deadline_ms, deadline);
    format_ms(deadline_ms - 1800000, created);
    int n = snprintf(buf, cap,
                     "{\"v\":1,\"order_id\":\"ord-%08zu\",\"deadline\":\"%s\","
                     "\"created_at\":\"%s\"}",
                     i, deadline, created);
    return n < 0 || (size_t)n >= cap ? 0 : (size_t)n;
}

bench_window_t bench_window_init(size_t size) {
    bench_window_t w = {
        .done = calloc(size, sizeof(bool)), .size = size, .low = 0, .next = 1};
    if (!w.done) {
        bench_die("window", "out of memory");
    }
    return w;
}

static void settle(bench_window_t *w, uint64_t tag, bool multiple) {
    if (tag <= w->low || tag >= w->next) {
        return;
    }
    for (uint64_t t = multiple ? w->low + 1 : tag; t <= tag; t++) {
        w->done[t % w->size] = true;
    }
    while (w->low + 1 < w->next && w->done[(w->low + 1) % w->size]) {
        w->low++;
        w->done[w->low % w->size] = false;
    }
}

void bench_await_confirm(amqp_connection_state_t conn, bench_window_t *w) {
    amqp_frame_t frame;
    struct timeval tv = {.tv_sec = 30};
    int st = amqp_simple_wait_frame_noblock(conn, &frame, &tv);
    if (st != AMQP_STATUS_OK) {
        bench_die("waiting for confirms", amqp_error_string2(st));
    }
    if (frame.frame_type != AMQP_FRAME_METHOD) {
        return;
    }
    switch (frame.payload.method.id) {
        case AMQP_BASIC_ACK_METHOD: {
            const amqp_basic_ack_t *ack = frame.payload.method.decoded;
            settle(w, ack->delivery_tag, ack->multiple);
            break;
        }
        case AMQP_BASIC_NACK_METHOD:
            bench_die("publish", "the broker nacked a message");
        case AMQP_BASIC_RETURN_METHOD:
            bench_die("publish", "the broker returned a message (no queue bound?)");
        case AMQP_CHANNEL_CLOSE_METHOD:
        case AMQP_CONNECTION_CLOSE_METHOD:
            bench_die("publish", "the broker closed the channel");
        default:
            break;
    }
}

/* SPDX-License-Identifier: MIT
 * bench_publish: the publish ceiling. Publishes N persistent messages of lapse's size and
 * shape into a durable queue with pipelined publisher confirms, and prints the rate.
 *
 * usage: bench_publish URL QUEUE N [WINDOW] [classic|quorum] [EXCHANGE ROUTING_KEY]
 * With EXCHANGE and ROUTING_KEY the messages go to that exchange, `mandatory`, as lapse
 * publishes them (QUEUE is then not declared: it is the one the exchange routes to, in a
 * topology the caller declared); else to the default exchange, routed to QUEUE.
 * Prints "published=N seconds=S rate=R" on stdout; exits 1 on any error, nack or return.
 */
#include "bench_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

int main(int argc, char **argv) {
    if (argc < 4 || argc == 7 || argc > 8) {
        fputs("usage: bench_publish URL QUEUE N [WINDOW] [classic|quorum] "
              "[EXCHANGE ROUTING_KEY]\n",
              stderr);
        return 2;
    }
    const char *queue = argv[2];
    size_t n = bench_count(argv[3], "N");
    size_t size = argc > 4 ? bench_count(argv[4], "WINDOW") : 500;
    bool quorum = argc > 5 && strcmp(argv[5], "quorum") == 0;
    bool routed = argc == 8;
    amqp_bytes_t exchange = routed ? amqp_cstring_bytes(argv[6]) : amqp_empty_bytes;
    amqp_bytes_t routing_key = amqp_cstring_bytes(routed ? argv[7] : queue);

    amqp_connection_state_t conn = bench_connect(argv[1], "bench_publish");
    if (!routed) {
        bench_declare(conn, queue, quorum);
    }
    amqp_confirm_select(conn, BENCH_CHANNEL);
    bench_check(amqp_get_rpc_reply(conn), "confirm.select");

    bench_window_t w = bench_window_init(size);
    struct timeval wall;
    gettimeofday(&wall, NULL);
    int64_t deadline_ms = (int64_t)wall.tv_sec * 1000 + wall.tv_usec / 1000 + 1800000;
    amqp_table_entry_t header = {
        .key = amqp_cstring_bytes("x-lapse-deadline-ms"),
        .value = {.kind = AMQP_FIELD_KIND_I64, .value.i64 = deadline_ms}};
    amqp_basic_properties_t props = {
        ._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
                  AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TIMESTAMP_FLAG |
                  AMQP_BASIC_APP_ID_FLAG | AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_HEADERS_FLAG,
        .content_type = amqp_cstring_bytes("application/json"),
        .delivery_mode = AMQP_DELIVERY_PERSISTENT,
        .timestamp = (uint64_t)(deadline_ms / 1000 - 1800),
        .app_id = amqp_cstring_bytes("lapse"),
        .type = amqp_cstring_bytes("order.expire"),
        .headers = {.num_entries = 1, .entries = &header}};

    double t0 = bench_now();
    for (size_t i = 0; i < n; i++) {
        while (w.next - 1 - w.low >= size) {
            bench_await_confirm(conn, &w);
        }
        char body[256];
        size_t len = bench_body(body, sizeof body, i, deadline_ms);
        char id[32];
        snprintf(id, sizeof id, "ord-%08zu", i);
        props.message_id = amqp_cstring_bytes(id);
        int st = amqp_basic_publish(conn, BENCH_CHANNEL, exchange, routing_key, routed, 0,
                                    &props, (amqp_bytes_t){.len = len, .bytes = body});
        if (st != AMQP_STATUS_OK) {
            bench_die("basic.publish", amqp_error_string2(st));
        }
        w.next++;
    }
    while (w.low + 1 < w.next) {
        bench_await_confirm(conn, &w);
    }
    double seconds = bench_now() - t0;
    printf("published=%zu seconds=%.3f rate=%.0f\n", n, seconds, (double)n / seconds);
    free(w.done);
    bench_close(conn);
    return 0;
}

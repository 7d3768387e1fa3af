/* SPDX-License-Identifier: MIT
 * bench_consume: the consume ceiling. Consumes N messages from QUEUE with manual acks and
 * a prefetch window, acking with `multiple` every half window, doing no other work.
 *
 * usage: bench_consume URL QUEUE N [PREFETCH]
 * Prints "consumed=N seconds=S rate=R" on stdout (time from consume-ok to the last ack);
 * exits 1 on any error or when no message arrives for 30 s. */
#include "bench_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5) {
        fputs("usage: bench_consume URL QUEUE N [PREFETCH]\n", stderr);
        return 2;
    }
    size_t n = bench_count(argv[3], "N");
    size_t prefetch = argc > 4 ? bench_count(argv[4], "PREFETCH") : 500;
    if (prefetch > 65535) {
        bench_die("PREFETCH", "at most 65535");
    }
    size_t ack_every = prefetch / 2 > 0 ? prefetch / 2 : 1;

    amqp_connection_state_t conn = bench_connect(argv[1], "bench_consume");
    amqp_basic_qos(conn, BENCH_CHANNEL, 0, (uint16_t)prefetch, 0);
    bench_check(amqp_get_rpc_reply(conn), "basic.qos");
    double t0 = bench_now();
    amqp_basic_consume(conn, BENCH_CHANNEL, amqp_cstring_bytes(argv[2]), amqp_empty_bytes,
                       0, 0, 0, amqp_empty_table);
    bench_check(amqp_get_rpc_reply(conn), "basic.consume");

    size_t got = 0;
    size_t unacked = 0;
    uint64_t last_tag = 0;
    while (got < n) {
        amqp_envelope_t env;
        struct timeval tv = {.tv_sec = 30};
        amqp_maybe_release_buffers(conn);
        amqp_rpc_reply_t reply = amqp_consume_message(conn, &env, &tv, 0);
        if (reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            reply.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
            bench_die("consume", "unexpected frame (channel closed?)");
        }
        bench_check(reply, "consume");
        got++;
        unacked++;
        last_tag = env.delivery_tag;
        amqp_destroy_envelope(&env);
        if (unacked >= ack_every || got == n) {
            int st = amqp_basic_ack(conn, BENCH_CHANNEL, last_tag, 1);
            if (st != AMQP_STATUS_OK) {
                bench_die("basic.ack", amqp_error_string2(st));
            }
            unacked = 0;
        }
    }
    double seconds = bench_now() - t0;
    printf("consumed=%zu seconds=%.3f rate=%.0f\n", n, seconds, (double)n / seconds);
    bench_close(conn);
    return 0;
}

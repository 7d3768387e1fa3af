/* SPDX-License-Identifier: MIT
 * bench_queue: ask the broker about a queue over AMQP (a passive queue.declare answers at
 * once; rabbitmqctl and the HTTP API lag by seconds).
 *
 * usage: bench_queue URL QUEUE count            print "messages=M consumers=C"
 *        bench_queue URL QUEUE wait M SECONDS   poll until it holds >= M messages
 *        bench_queue URL QUEUE drained SECONDS  poll until it holds 0 messages
 *        bench_queue URL QUEUE delete [QUEUE...]  delete it (and its messages), and each
 *                                               further QUEUE, on one connection
 *        bench_queue URL NAME delete-exchange   delete the exchange NAME
 * wait/drained print the last count and exit 1 on timeout; a missing queue exits 3. */
#include "bench_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void count(amqp_connection_state_t conn, const char *queue, uint32_t *messages,
                  uint32_t *consumers) {
    amqp_queue_declare_ok_t *ok = amqp_queue_declare(
        conn, BENCH_CHANNEL, amqp_cstring_bytes(queue), 1, 0, 0, 0, amqp_empty_table);
    amqp_rpc_reply_t reply = amqp_get_rpc_reply(conn);
    if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
        reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD &&
        ((amqp_channel_close_t *)reply.reply.decoded)->reply_code == AMQP_NOT_FOUND) {
        fprintf(stderr, "bench_queue: no queue '%s'\n", queue);
        exit(3);
    }
    bench_check(reply, "passive queue.declare");
    *messages = ok->message_count;
    *consumers = ok->consumer_count;
}

static int poll(amqp_connection_state_t conn, const char *queue, uint32_t want,
                bool empty, double seconds) {
    double until = bench_now() + seconds;
    uint32_t messages;
    uint32_t consumers;
    for (;;) {
        count(conn, queue, &messages, &consumers);
        bool done = empty ? messages == 0 : messages >= want;
        if (done || bench_now() > until) {
            printf("messages=%u consumers=%u\n", messages, consumers);
            return done ? 0 : 1;
        }
        nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    }
}

static void delete_queue(amqp_connection_state_t conn, const char *queue) {
    amqp_queue_delete(conn, BENCH_CHANNEL, amqp_cstring_bytes(queue), 0, 0);
    bench_check(amqp_get_rpc_reply(conn), "queue.delete");
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fputs("usage: bench_queue URL QUEUE count|wait M SECONDS|drained SECONDS\n"
              "       bench_queue URL QUEUE delete [QUEUE...]\n"
              "       bench_queue URL EXCHANGE delete-exchange\n",
              stderr);
        return 2;
    }
    const char *queue = argv[2];
    const char *verb = argv[3];
    amqp_connection_state_t conn = bench_connect(argv[1], "bench_queue");
    int code = 0;
    uint32_t messages;
    uint32_t consumers;
    if (strcmp(verb, "count") == 0 && argc == 4) {
        count(conn, queue, &messages, &consumers);
        printf("messages=%u consumers=%u\n", messages, consumers);
    } else if (strcmp(verb, "wait") == 0 && argc == 6) {
        code = poll(conn, queue, (uint32_t)bench_count(argv[4], "M"), false,
                    (double)bench_count(argv[5], "SECONDS"));
    } else if (strcmp(verb, "drained") == 0 && argc == 5) {
        code = poll(conn, queue, 0, true, (double)bench_count(argv[4], "SECONDS"));
    } else if (strcmp(verb, "delete") == 0) {
        /* Deleting a queue that does not exist succeeds: the caller may name queues a
         * measurement never declared. */
        delete_queue(conn, queue);
        for (int i = 4; i < argc; i++) {
            delete_queue(conn, argv[i]);
        }
    } else if (strcmp(verb, "delete-exchange") == 0 && argc == 4) {
        amqp_exchange_delete(conn, BENCH_CHANNEL, amqp_cstring_bytes(queue), 0);
        bench_check(amqp_get_rpc_reply(conn), "exchange.delete");
    } else {
        fputs("bench_queue: bad arguments (see the usage in bench_queue.c)\n", stderr);
        code = 2;
    }
    bench_close(conn);
    return code;
}

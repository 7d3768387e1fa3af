/* SPDX-License-Identifier: MIT
 * bench_fair: the fair consume ceiling, lapse's broker work per cancel and nothing else.
 * Consumes N messages from QUEUE with manual acks and a prefetch window, as bench_consume
 * does; for each delivery publishes one persistent ~150 B event (mandatory, routing key
 * order.cancelled) to EXCHANGE on a second connection in confirm mode, as lapse's
 * consumer does; and acks each batch of half a window with `multiple` once all of its
 * events are confirmed. No decoding, no store: the rate any consumer that emits one
 * confirmed event per message can reach on this broker with this simple loop.
 *
 * usage: bench_fair URL QUEUE EXCHANGE EVENTS_QUEUE N [PREFETCH] [classic|quorum]
 * Declares EXCHANGE (topic, durable) and EVENTS_QUEUE (durable, of the given type)
 * bound to it with order.cancelled, so that the events are persisted, as in production.
 * Prints "consumed=N events=E seconds=S rate=R" on stdout, E being what EVENTS_QUEUE
 * holds at the end (time from consume-ok to the last ack); exits 1 on any error, nack
 * or returned event, or when no message arrives for 30 s. */
#include "bench_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#define EVENT_KEY "order.cancelled"

static void declare_events(amqp_connection_state_t conn, const char *exchange,
                           const char *queue, bool quorum) {
    amqp_exchange_declare(conn, BENCH_CHANNEL, amqp_cstring_bytes(exchange),
                          amqp_cstring_bytes("topic"), 0, 1, 0, 0, amqp_empty_table);
    bench_check(amqp_get_rpc_reply(conn), "exchange.declare");
    bench_declare(conn, queue, quorum);
    amqp_queue_bind(conn, BENCH_CHANNEL, amqp_cstring_bytes(queue),
                    amqp_cstring_bytes(exchange), amqp_cstring_bytes(EVENT_KEY),
                    amqp_empty_table);
    bench_check(amqp_get_rpc_reply(conn), "queue.bind");
}

/* One event per delivery: lapse's properties and a body of its size and shape. */
static void publish_event(amqp_connection_state_t out, const char *exchange,
                          const amqp_envelope_t *env, size_t i, bench_window_t *w) {
    char id[64];
    const amqp_basic_properties_t *in = &env->message.properties;
    if ((in->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) && in->message_id.len < 40) {
        snprintf(id, sizeof id, "%.*s", (int)in->message_id.len,
                 (const char *)in->message_id.bytes);
    } else {
        snprintf(id, sizeof id, "ord-%08zu", i);
    }
    char body[256];
    int len =
        snprintf(body, sizeof body,
                 "{\"v\":1,\"type\":\"order.cancelled\",\"event_id\":\"cancel-%s\","
                 "\"order_id\":\"%s\",\"cancelled_at\":\"2026-12-01T00:00:00.000Z\","
                 "\"deadline\":\"2026-12-01T00:00:00.000Z\"}",
                 id, id);
    char event_id[80];
    snprintf(event_id, sizeof event_id, "cancel-%s", id);
    amqp_basic_properties_t props = {
        ._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
                  AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TIMESTAMP_FLAG |
                  AMQP_BASIC_APP_ID_FLAG | AMQP_BASIC_TYPE_FLAG,
        .content_type = amqp_cstring_bytes("application/json"),
        .delivery_mode = AMQP_DELIVERY_PERSISTENT,
        .message_id = amqp_cstring_bytes(event_id),
        .timestamp = 1796083200,
        .app_id = amqp_cstring_bytes("lapse"),
        .type = amqp_cstring_bytes(EVENT_KEY)};
    int st = amqp_basic_publish(out, BENCH_CHANNEL, amqp_cstring_bytes(exchange),
                                amqp_cstring_bytes(EVENT_KEY), 1, 0, &props,
                                (amqp_bytes_t){.len = (size_t)len, .bytes = body});
    if (st != AMQP_STATUS_OK) {
        bench_die("basic.publish", amqp_error_string2(st));
    }
    w->next++;
}

int main(int argc, char **argv) {
    if (argc < 6 || argc > 8) {
        fputs("usage: bench_fair URL QUEUE EXCHANGE EVENTS_QUEUE N [PREFETCH] "
              "[classic|quorum]\n",
              stderr);
        return 2;
    }
    const char *exchange = argv[3];
    const char *events_queue = argv[4];
    size_t n = bench_count(argv[5], "N");
    size_t prefetch = argc > 6 ? bench_count(argv[6], "PREFETCH") : 500;
    bool quorum = argc > 7 && strcmp(argv[7], "quorum") == 0;
    if (prefetch > 65535) {
        bench_die("PREFETCH", "at most 65535");
    }
    size_t batch = prefetch / 2 > 0 ? prefetch / 2 : 1;

    amqp_connection_state_t out = bench_connect(argv[1], "bench_fair events");
    declare_events(out, exchange, events_queue, quorum);
    amqp_confirm_select(out, BENCH_CHANNEL);
    bench_check(amqp_get_rpc_reply(out), "confirm.select");
    bench_window_t w = bench_window_init(batch + 1);

    amqp_connection_state_t in = bench_connect(argv[1], "bench_fair");
    amqp_basic_qos(in, BENCH_CHANNEL, 0, (uint16_t)prefetch, 0);
    bench_check(amqp_get_rpc_reply(in), "basic.qos");
    double t0 = bench_now();
    amqp_basic_consume(in, BENCH_CHANNEL, amqp_cstring_bytes(argv[2]), amqp_empty_bytes,
                       0, 0, 0, amqp_empty_table);
    bench_check(amqp_get_rpc_reply(in), "basic.consume");

    size_t got = 0;
    size_t unacked = 0;
    uint64_t last_tag = 0;
    while (got < n) {
        amqp_envelope_t env;
        struct timeval tv = {.tv_sec = 30};
        amqp_maybe_release_buffers(in);
        amqp_rpc_reply_t reply = amqp_consume_message(in, &env, &tv, 0);
        if (reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            reply.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
            bench_die("consume", "unexpected frame (channel closed?)");
        }
        bench_check(reply, "consume");
        publish_event(out, exchange, &env, got, &w);
        got++;
        unacked++;
        last_tag = env.delivery_tag;
        amqp_destroy_envelope(&env);
        if (unacked >= batch || got == n) {
            while (w.low + 1 < w.next) {
                bench_await_confirm(out, &w);
            }
            amqp_maybe_release_buffers(out);
            int st = amqp_basic_ack(in, BENCH_CHANNEL, last_tag, 1);
            if (st != AMQP_STATUS_OK) {
                bench_die("basic.ack", amqp_error_string2(st));
            }
            unacked = 0;
        }
    }
    double seconds = bench_now() - t0;

    amqp_queue_declare_ok_t *ok =
        amqp_queue_declare(out, BENCH_CHANNEL, amqp_cstring_bytes(events_queue), 1, 0, 0,
                           0, amqp_empty_table);
    bench_check(amqp_get_rpc_reply(out), "passive queue.declare");
    printf("consumed=%zu events=%u seconds=%.3f rate=%.0f\n", n, ok->message_count,
           seconds, (double)n / seconds);
    free(w.done);
    bench_close(in);
    bench_close(out);
    return 0;
}

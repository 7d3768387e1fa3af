/* SPDX-License-Identifier: MIT
 * Consumer: how far its clock may run ahead of the broker's, measured by a probe at
 * the start of each session (see effective_now in consumer.c for how it is used). */
#include "consumer_int.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define PROBES 5
#define PROBE_SPACING_MS                                                                 \
    250 /* five probes span more than a second: one lands just                           \
           after a second boundary of the broker's clock */
#define PROBE_WAIT_MS 1000

/* The latest x-death time of a message, ms (whole seconds), or -1. */
int64_t lapse__dead_lettered_at_ms(const amqp_basic_properties_t *props) {
    if (!(props->_flags & AMQP_BASIC_HEADERS_FLAG)) {
        return -1;
    }
    int64_t latest = -1;
    for (int i = 0; i < props->headers.num_entries; i++) {
        const amqp_table_entry_t *h = &props->headers.entries[i];
        if (h->key.len != 7 || memcmp(h->key.bytes, "x-death", 7) != 0 ||
            h->value.kind != AMQP_FIELD_KIND_ARRAY) {
            continue;
        }
        const amqp_array_t *deaths = &h->value.value.array;
        for (int j = 0; j < deaths->num_entries; j++) {
            if (deaths->entries[j].kind != AMQP_FIELD_KIND_TABLE) {
                continue;
            }
            const amqp_table_t *death = &deaths->entries[j].value.table;
            for (int k = 0; k < death->num_entries; k++) {
                const amqp_table_entry_t *f = &death->entries[k];
                if (f->key.len == 4 && memcmp(f->key.bytes, "time", 4) == 0 &&
                    f->value.kind == AMQP_FIELD_KIND_TIMESTAMP &&
                    f->value.value.u64 < (uint64_t)INT64_MAX / 1000 &&
                    (int64_t)f->value.value.u64 * 1000 > latest) {
                    latest = (int64_t)f->value.value.u64 * 1000;
                }
            }
        }
    }
    return latest;
}

void lapse__consumer_skew_sample(lapse_consumer_t *c, int64_t sample) {
    if (sample < c->skew.current) {
        c->skew.current = sample;
    }
}

/* One probe: published into a private queue whose TTL is 0, dead-lettered at once into
 * another, read back. Its x-death time is the broker's clock at that moment. */
static bool probe_once(lapse_consumer_t *c, const char *into, const char *from) {
    amqp_basic_properties_t props = {._flags = AMQP_BASIC_DELIVERY_MODE_FLAG,
                                     .delivery_mode = AMQP_DELIVERY_NONPERSISTENT};
    amqp_bytes_t body = amqp_cstring_bytes("lapse clock probe");
    if (amqp_basic_publish(c->in.conn, LAPSE__CHANNEL, amqp_empty_bytes,
                           amqp_cstring_bytes(into), 0, 0, &props,
                           body) != AMQP_STATUS_OK) {
        return false;
    }
    int64_t until = lapse_clock_now_ms() + PROBE_WAIT_MS;
    while (lapse_clock_now_ms() < until) {
        amqp_rpc_reply_t r =
            amqp_basic_get(c->in.conn, LAPSE__CHANNEL, amqp_cstring_bytes(from), 1);
        if (r.reply_type != AMQP_RESPONSE_NORMAL) {
            return false;
        }
        if (r.reply.id != AMQP_BASIC_GET_OK_METHOD) {
            usleep(2000);
            continue;
        }
        amqp_message_t msg;
        if (amqp_read_message(c->in.conn, LAPSE__CHANNEL, &msg, 0).reply_type !=
            AMQP_RESPONSE_NORMAL) {
            return false;
        }
        int64_t now = lapse_clock_now_ms();
        int64_t at = lapse__dead_lettered_at_ms(&msg.properties);
        amqp_destroy_message(&msg);
        if (at >= 0) {
            lapse__consumer_skew_sample(c, now - at);
        }
        return true;
    }
    return false;
}

/* Before consuming: a tight bound from probes, so that the waits of a backlog (which
 * inflate the bound learnt from deliveries) do not make on-time orders look early.
 * Best effort: a failure leaves the bound to the deliveries. */
void lapse__consumer_probe_clock(lapse_consumer_t *c) {
    amqp_connection_state_t conn = c->in.conn;
    char from[128] = "";
    char into[128] = "";
    amqp_queue_declare_ok_t *ok = amqp_queue_declare(
        conn, LAPSE__CHANNEL, amqp_empty_bytes, 0, 0, 1, 1, amqp_empty_table);
    if (!ok || amqp_get_rpc_reply(conn).reply_type != AMQP_RESPONSE_NORMAL) {
        return;
    }
    lapse__bytes_to_str(ok->queue, from, sizeof from);
    amqp_table_entry_t e[3] = {lapse__entry_str("x-dead-letter-exchange", ""),
                               lapse__entry_str("x-dead-letter-routing-key", from),
                               lapse__entry_i64("x-message-ttl", 0)};
    amqp_table_t args = {.num_entries = 3, .entries = e};
    ok = amqp_queue_declare(conn, LAPSE__CHANNEL, amqp_empty_bytes, 0, 0, 1, 1, args);
    if (!ok || amqp_get_rpc_reply(conn).reply_type != AMQP_RESPONSE_NORMAL) {
        return;
    }
    lapse__bytes_to_str(ok->queue, into, sizeof into);
    int got = 0;
    for (int i = 0; i < PROBES; i++) {
        if (i > 0) {
            usleep(PROBE_SPACING_MS * 1000);
        }
        got += probe_once(c, into, from);
    }
    amqp_queue_delete(conn, LAPSE__CHANNEL, amqp_cstring_bytes(into), 0, 0);
    amqp_queue_delete(conn, LAPSE__CHANNEL, amqp_cstring_bytes(from), 0, 0);
    lapse__log(c->cfg, LAPSE_LOG_INFO,
               "event=clock_probe probes=%d ahead_by_up_to_ms=%lld", got,
               (long long)(c->skew.current == INT64_MAX ? -1 : c->skew.current));
}

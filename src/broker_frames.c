/* SPDX-License-Identifier: MIT
 * A basic.publish as AMQP 0-9-1 frames, appended to a buffer: the method, the content
 * header and the body frames, byte for byte what amqp_basic_publish sends
 * (tests/unit/test_broker_frames.c compares the two), so that a run of publishes leaves
 * in one send instead of three per message. The method arguments and the properties are
 * encoded by rabbitmq-c's own amqp_encode_method and amqp_encode_properties; this file
 * adds only the frame envelopes and the splitting of a body at frame_max. */
#include "broker_int.h"

#include <stdlib.h>
#include <string.h>

#define FRAME_HEAD     7 /* type, channel, payload size */
#define FRAME_END_SIZE 1
#define FRAME_OVERHEAD (FRAME_HEAD + FRAME_END_SIZE)
/* What the content header puts before the properties: class, weight, body size. */
#define CONTENT_HEAD 12
/* Room tried first for a method's arguments or a header's properties; a frame that
 * needs more gets up to frame_max. */
#define FIRST_TRY 1024

bool lapse__frames_reserve(lapse__frames_t *f, size_t more) {
    if (f->n + more <= f->cap) {
        return true;
    }
    size_t cap = f->cap != 0 ? f->cap : 4096;
    while (cap < f->n + more) {
        cap *= 2;
    }
    uint8_t *grown = realloc(f->p, cap);
    if (grown == NULL) {
        return false;
    }
    f->p = grown;
    f->cap = cap;
    return true;
}

static void put16(uint8_t *at, uint16_t v) {
    at[0] = (uint8_t)(v >> 8);
    at[1] = (uint8_t)v;
}

static void put32(uint8_t *at, uint32_t v) {
    put16(at, (uint16_t)(v >> 16));
    put16(at + 2, (uint16_t)v);
}

static void put64(uint8_t *at, uint64_t v) {
    put32(at, (uint32_t)(v >> 32));
    put32(at + 4, (uint32_t)v);
}

/* Close the frame that starts at f->n with a payload of size bytes. */
static void seal(lapse__frames_t *f, uint8_t type, amqp_channel_t channel, size_t size) {
    uint8_t *at = f->p + f->n;
    at[0] = type;
    put16(at + 1, channel);
    put32(at + 3, (uint32_t)size);
    at[FRAME_HEAD + size] = AMQP_FRAME_END;
    f->n += FRAME_HEAD + size + FRAME_END_SIZE;
}

/* A method or content-header frame whose payload is lead bytes (written by lead_fn)
 * followed by what encode writes: tried in FIRST_TRY bytes, then in frame_max. */
typedef int (*encode_fn)(const void *what, uint8_t *lead, amqp_bytes_t room);

static int encode_method(const void *what, uint8_t *lead, amqp_bytes_t room) {
    put32(lead, AMQP_BASIC_PUBLISH_METHOD);
    return amqp_encode_method(AMQP_BASIC_PUBLISH_METHOD, (void *)what, room);
}

typedef struct header_arg {
    const amqp_basic_properties_t *props;
    uint64_t body_size;
} header_arg_t;

static int encode_header(const void *what, uint8_t *lead, amqp_bytes_t room) {
    const header_arg_t *h = what;
    put16(lead, AMQP_BASIC_CLASS);
    put16(lead + 2, 0); /* weight */
    put64(lead + 4, h->body_size);
    return amqp_encode_properties(AMQP_BASIC_CLASS, (void *)h->props, room);
}

static lapse_status_t frame(lapse__frames_t *f, size_t frame_max, uint8_t type,
                            amqp_channel_t channel, size_t lead, encode_fn encode,
                            const void *what) {
    size_t tries[2] = {FIRST_TRY, frame_max};
    for (int i = 0; i < 2; i++) {
        size_t room = tries[i] < frame_max ? tries[i] : frame_max;
        if (room < FRAME_OVERHEAD + lead || (i == 1 && room <= tries[0])) {
            break;
        }
        if (!lapse__frames_reserve(f, room)) {
            return LAPSE_ERR_NOMEM;
        }
        uint8_t *payload = f->p + f->n + FRAME_HEAD;
        amqp_bytes_t out = {.len = room - FRAME_OVERHEAD - lead, .bytes = payload + lead};
        int used = encode(what, payload, out);
        if (used >= 0) {
            seal(f, type, channel, lead + (size_t)used);
            return LAPSE_OK;
        }
    }
    return LAPSE_ERR_INVALID;
}

lapse_status_t lapse__frames_publish(lapse__frames_t *f, size_t frame_max,
                                     amqp_channel_t channel, amqp_bytes_t exchange,
                                     amqp_bytes_t routing_key, bool mandatory,
                                     const amqp_basic_properties_t *props,
                                     amqp_bytes_t body) {
    size_t start = f->n;
    amqp_basic_publish_t m = {.ticket = 0,
                              .exchange = exchange,
                              .routing_key = routing_key,
                              .mandatory = mandatory,
                              .immediate = 0};
    amqp_basic_properties_t none;
    if (props == NULL) {
        memset(&none, 0, sizeof none);
        props = &none;
    }
    header_arg_t h = {.props = props, .body_size = body.len};
    lapse_status_t rc =
        frame(f, frame_max, AMQP_FRAME_METHOD, channel, 4, encode_method, &m);
    if (rc == LAPSE_OK) {
        rc = frame(f, frame_max, AMQP_FRAME_HEADER, channel, CONTENT_HEAD, encode_header,
                   &h);
    }
    size_t chunk = frame_max > FRAME_OVERHEAD ? frame_max - FRAME_OVERHEAD : 0;
    if (chunk == 0 && body.len > 0) {
        rc = LAPSE_ERR_INVALID;
    }
    for (size_t off = 0; rc == LAPSE_OK && off < body.len; off += chunk) {
        size_t len = body.len - off < chunk ? body.len - off : chunk;
        if (!lapse__frames_reserve(f, len + FRAME_OVERHEAD)) {
            rc = LAPSE_ERR_NOMEM;
            break;
        }
        memcpy(f->p + f->n + FRAME_HEAD, (const uint8_t *)body.bytes + off, len);
        seal(f, AMQP_FRAME_BODY, channel, len);
    }
    if (rc != LAPSE_OK) {
        f->n = start; /* all of the publish or none of it */
    }
    return rc;
}

void lapse__frames_free(lapse__frames_t *f) {
    free(f->p);
    *f = (lapse__frames_t){0};
}

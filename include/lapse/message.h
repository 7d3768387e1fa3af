/* SPDX-License-Identifier: MIT
 * The expiry message (version 1) and the times and durations it carries. */
#ifndef LAPSE_MESSAGE_H
#define LAPSE_MESSAGE_H

#include <lapse/lapse.h>

#define LAPSE_ORDER_ID_MAX 128  /* bytes of [A-Za-z0-9._:-] */
#define LAPSE_MSG_MAX_BODY 4096 /* larger bodies are refused (parked) */
#define LAPSE_RFC3339_LEN  25   /* "2026-11-30T06:30:00.000Z" plus NUL */
#define LAPSE_MSG_TYPE     "order.expire"
#define LAPSE_APP_ID       "lapse"
#define LAPSE_HDR_DEADLINE "x-lapse-deadline-ms"
#define LAPSE_HDR_DEADLINE_TEXT                                                          \
    "x-lapse-deadline"                       /* the same, RFC 3339 UTC, for people */
#define LAPSE_HDR_REASON    "x-lapse-reason" /* why a message was parked */
#define LAPSE_HDR_PARKED_AT "x-lapse-parked-at-ms" /* when (ms since the epoch) */
#define LAPSE_HDR_ATTEMPTS  "x-lapse-attempts"     /* failed processing attempts */
/* Set by lapse on every mandatory publish: the publish's sequence number on its channel,
 * so that a returned message is matched to its publish. No meaning for readers. */
#define LAPSE_HDR_PUBLISH_SEQ "x-lapse-publish-seq"
#define LAPSE_EVENT_CANCELLED "order.cancelled"

/** A decoded expiry message: a plain value, no pointers, nothing to free. */
typedef struct lapse_expiry_msg {
    int version;                           /* 1 */
    char order_id[LAPSE_ORDER_ID_MAX + 1]; /* NUL-terminated */
    int64_t deadline_ms;                   /* ms since the Unix epoch, UTC */
    int64_t created_at_ms;
} lapse_expiry_msg_t;

/**
 * Decode and validate the JSON body of an expiry message.
 * Required: "v" (integer 1), "order_id" (valid id), "deadline" and "created_at"
 * (RFC 3339 strings). Unknown fields are ignored.
 * @param body  bytes, borrowed, not retained; need not be NUL-terminated.
 * @param out   filled on LAPSE_OK only.
 * @param err   optional; on failure receives the reason used when parking.
 * @return LAPSE_OK or LAPSE_ERR_MSG_*.
 * Thread-safety: pure, reentrant.
 */
LAPSE_API lapse_status_t lapse_expiry_msg_decode(const void *body, size_t len,
                                                 lapse_expiry_msg_t *out,
                                                 lapse_error_t *err);

/**
 * Encode msg as the compact JSON body of docs/design.md ("The message and its
 * headers") into buf (NUL-terminated).
 * @param len  receives the body length without the NUL.
 * @return LAPSE_OK, LAPSE_ERR_MSG_ORDER_ID, or LAPSE_ERR_INVALID when cap is too small.
 */
LAPSE_API lapse_status_t lapse_expiry_msg_encode(const lapse_expiry_msg_t *msg, char *buf,
                                                 size_t cap, size_t *len);

/** True when id[0..len) is 1..128 bytes of [A-Za-z0-9._:-]. */
LAPSE_API bool lapse_order_id_is_valid(const char *id, size_t len);

/**
 * Parse a duration: an integer followed by ms, s, m, h or d ("1500ms", "90s", "30m",
 * "2h", "7d"). Must be > 0 and fit in int64 milliseconds.
 * @return LAPSE_OK or LAPSE_ERR_CONFIG_DURATION.
 */
LAPSE_API lapse_status_t lapse_duration_parse(const char *text, int64_t *out_ms);

/** Shortest exact spelling of ms in the largest unit ("30m", "90s", "1500ms") into buf.
 */
LAPSE_API void lapse_duration_format(int64_t ms, char *buf, size_t cap);

/** Room for any lapse_duration_display() text, NUL included. */
#define LAPSE_DURATION_DISPLAY_LEN 32

/**
 * ms for a person to read: days, hours, minutes, seconds and milliseconds, largest
 * first, zero parts left out, no spaces ("1553d10h42m8s", "1m30s", "2s500ms", "0s"; a
 * negative span starts with '-'). Not parsed back by lapse_duration_parse(), unlike
 * lapse_duration_format(), whose spelling names queues and classes. Truncated to cap.
 */
LAPSE_API void lapse_duration_display(int64_t ms, char *buf, size_t cap);

/**
 * Parse an RFC 3339 timestamp with a "Z" or +hh:mm/-hh:mm offset and optional
 * fraction (milliseconds kept, finer digits truncated). Years 1970..9999.
 * @return LAPSE_OK or LAPSE_ERR_MSG_TIME.
 */
LAPSE_API lapse_status_t lapse_time_parse_rfc3339(const char *text, int64_t *out_ms);

/** Format ms since the epoch as "YYYY-MM-DDTHH:MM:SS.mmmZ" into buf[LAPSE_RFC3339_LEN].
 */
LAPSE_API void lapse_time_format_rfc3339(int64_t ms, char buf[LAPSE_RFC3339_LEN]);

/** Wall-clock time, ms since the epoch (CLOCK_REALTIME). */
LAPSE_API int64_t lapse_clock_now_ms(void);

#endif

/* SPDX-License-Identifier: MIT
 * Internal: one reader and one writer per header lapse or the broker puts on a message
 * (docs/design.md, "The message and its headers"). Pure: they read an
 * amqp_basic_properties_t (borrowed, nothing kept) and call nothing in rabbitmq-c.
 * Integers are read in any AMQP integer kind (other clients, and other versions of lapse,
 * may pick another width than the int64 lapse writes), and a timestamp kind too. */
#ifndef LAPSE_HEADERS_INT_H
#define LAPSE_HEADERS_INT_H

#include <amqp.h>
#include <stdbool.h>
#include <stdint.h>

/** The value of header name, or NULL; borrowed from props. */
const amqp_field_value_t *lapse__hdr_find(const amqp_basic_properties_t *props,
                                          const char *name);

/** Header name as an integer of any kind (a u64 above INT64_MAX is refused). */
bool lapse__hdr_int(const amqp_basic_properties_t *props, const char *name, int64_t *out);

/** x-lapse-attempts: failed processing attempts so far, clamped to 0..1000000; 0 when
 *  absent, negative or not an integer. */
int lapse__hdr_attempts(const amqp_basic_properties_t *props);

/** x-death: the latest `time` of its entries (broker clock, whole seconds) in ms; -1
 *  when the message was never dead-lettered. */
int64_t lapse__hdr_death_time_ms(const amqp_basic_properties_t *props);

/** x-lapse-publish-seq (positive), or 0 when absent. */
uint64_t lapse__hdr_publish_seq(const amqp_basic_properties_t *props);

/** x-lapse-parked-at-ms, or -1 when absent. */
int64_t lapse__hdr_parked_at_ms(const amqp_basic_properties_t *props);

/** x-lapse-deadline-ms, or -1 when absent. */
int64_t lapse__hdr_deadline_ms(const amqp_basic_properties_t *props);

/** Whether key is one of the headers parking sets (x-lapse-reason, x-lapse-parked-at-ms,
 *  x-lapse-attempts): a re-park replaces them, a replay removes them. */
bool lapse__hdr_is_parking(amqp_bytes_t key);

/** x-lapse-reason as text (bytes or string kind) into buf, "" when absent. */
void lapse__hdr_reason(const amqp_basic_properties_t *props, char *buf, size_t cap);

/* ---- writers: one entry per header, keys and values borrowed (a string value must
 * outlive the entry), integers written as int64 ---- */

amqp_table_entry_t lapse__hdr_attempts_entry(int attempts);
amqp_table_entry_t lapse__hdr_deadline_ms_entry(int64_t deadline_ms);
/** x-lapse-deadline: text is the deadline as RFC 3339 (lapse_time_format_rfc3339). */
amqp_table_entry_t lapse__hdr_deadline_text_entry(const char *text);
amqp_table_entry_t lapse__hdr_reason_entry(const char *reason);
amqp_table_entry_t lapse__hdr_parked_at_entry(int64_t ms);
amqp_table_entry_t lapse__hdr_publish_seq_entry(uint64_t seq);

#endif

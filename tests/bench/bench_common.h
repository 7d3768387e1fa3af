/* SPDX-License-Identifier: MIT
 * Bench helpers shared by the ceiling programs: connect, check replies, time, the
 * message. */
#ifndef LAPSE_BENCH_COMMON_H
#define LAPSE_BENCH_COMMON_H

#include <amqp.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BENCH_CHANNEL 1

/* Prints "PROG: what: detail" to stderr and exits 1. */
_Noreturn void bench_die(const char *what, const char *detail);

/* Exits through bench_die unless the reply is normal. */
void bench_check(amqp_rpc_reply_t reply, const char *what);

/* Opens a connection and channel BENCH_CHANNEL to URL (amqp://user:pass@host:port/vhost);
 * exits on failure. The program name goes into the connection's client properties. */
amqp_connection_state_t bench_connect(const char *url, const char *name);

void bench_close(amqp_connection_state_t conn);

/* Declares QUEUE durable (classic, or quorum when quorum is true). */
void bench_declare(amqp_connection_state_t conn, const char *queue, bool quorum);

/* Monotonic seconds. */
double bench_now(void);

/* Parses a positive count ("100000", "100k", "1M"); exits 2 on garbage. */
size_t bench_count(const char *text, const char *what);

/* Publisher confirms may settle one tag or every tag up to one (multiple); a ring of size
 * flags tracks which outstanding tags are settled, so out-of-order singles count too.
 * The ring is the caller's (calloc'd by bench_window_init, freed with free(w->done)). */
typedef struct bench_window {
    bool *done;
    size_t size;
    uint64_t low;  /* every tag <= low is settled */
    uint64_t next; /* the tag of the next publish */
} bench_window_t;

/* A window of SIZE outstanding publishes; exits on out of memory. */
bench_window_t bench_window_init(size_t size);

/* Waits up to 30 s for one frame on CONN and settles a confirm; nacks, closes and
 * returned (mandatory, unroutable) messages are fatal. */
void bench_await_confirm(amqp_connection_state_t conn, bench_window_t *w);

/* Writes the body of order i (the size and shape of a lapse message) into buf and returns
 * its length. */
size_t bench_body(char *buf, size_t cap, size_t i, int64_t deadline_ms);

#endif

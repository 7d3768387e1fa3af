/* SPDX-License-Identifier: MIT
 * Internal: one AMQP connection with one channel, on top of rabbitmq-c. */
#ifndef LAPSE_BROKER_INT_H
#define LAPSE_BROKER_INT_H

#include <amqp.h>
#include <signal.h>

#include "backoff_int.h"
#include "config_int.h"

#include <lapse/lapse.h>

#define LAPSE__CHANNEL 1

/* Outcome of one publish, reported once the broker settled it. */
typedef void (*lapse__settle_cb)(void *opaque, uint64_t tag, lapse_status_t outcome);

typedef struct lapse__pub_slot {
    uint64_t tag;
    bool returned;
} lapse__pub_slot_t;

/* Bytes in one growable buffer (broker_frames.c): a broker's staged frames, owned by
 * the broker; a consumer's batch of deliveries (lapse__broker_consume_next), owned by the
 * consumer. Its bytes move when it grows: hold offsets into it, not pointers. */
typedef struct lapse__frames {
    uint8_t *p;
    size_t n, cap;
} lapse__frames_t;

/** Room for more bytes after f->n (f->n unchanged); false when out of memory. */
bool lapse__frames_reserve(lapse__frames_t *f, size_t more);

/**
 * Append a basic.publish on channel (the method, the content header with props, which may
 * be NULL, and body split at frame_max) as the bytes amqp_basic_publish would send; all
 * borrowed. Nothing is appended on failure: LAPSE_ERR_NOMEM, or LAPSE_ERR_INVALID when
 * the method or the properties do not fit in frame_max (rabbitmq-c refuses those too).
 */
lapse_status_t lapse__frames_publish(lapse__frames_t *f, size_t frame_max,
                                     amqp_channel_t channel, amqp_bytes_t exchange,
                                     amqp_bytes_t routing_key, bool mandatory,
                                     const amqp_basic_properties_t *props,
                                     amqp_bytes_t body);
/** Release the buffer; f is empty after. */
void lapse__frames_free(lapse__frames_t *f);

/* What the TLS layer of a connection saw go wrong (broker_tls.c); owned by the broker. */
typedef struct lapse__tls lapse__tls_t;

/* A connection, its channel 1, and (with confirms on) the window of publishes the broker
 * has not settled yet. Not thread-safe: one per thread (rabbitmq-c's rule). */
typedef struct lapse__broker {
    amqp_connection_state_t conn;
    const lapse_config_t *cfg;
    lapse__tls_t *tls; /* amqps:// only, else NULL */
    bool open;
    bool confirms;
    uint64_t next_tag;   /* tag the next publish gets (1-based, per channel) */
    uint64_t first_open; /* lowest tag not settled yet */
    lapse__pub_slot_t *slots;
    size_t window;
    lapse__settle_cb settle_cb;
    void *settle_opaque;
    char name[96]; /* the connection name, for log lines */
    /* The broker sent connection.blocked (a memory or disk alarm) and no unblocked yet:
     * it reads nothing from this connection, so nothing is published until unblocked. */
    bool blocked;
    int64_t blocked_since; /* lapse__mono_ms() of the connection.blocked */
    /* How long waits go on while the connection is blocked (from the connection.blocked
     * frame on): LAPSE__PUBLISH_WAIT_MS after open; less for a caller with other work
     * (the consumer), since nothing is published or confirmed until the alarm clears. */
    int64_t blocked_wait_ms;
    /* Optional, set by the caller after open: once *stop is non-zero, every wait of this
     * broker (room to publish, confirms) gives up with LAPSE_ERR_STOPPED within
     * LAPSE__STOP_GRACE_MS, so SIGTERM is honoured even when the broker is blocked. */
    const volatile sig_atomic_t *stop;
    int64_t stop_seen_at; /* when a wait first saw *stop, 0 before */
    /* Optional: lapse__mono_ms() time past which every wait gives up
     * (LAPSE_ERR_BROKER_TIMEOUT); 0 for none. */
    int64_t give_up_at;
    /* lapse__broker_cork: the socket holds partial segments back (TCP_CORK), and on a
     * plain TCP connection the run's publishes are staged: encoded into `staged` and
     * written in one send at LAPSE__STAGE_FLUSH bytes, at lapse__broker_uncork and
     * before anything reads the connection. rabbitmq-c never writes between two staged
     * frames: while frames are staged, only lapse__broker_publish may be called. */
    bool corked;
    bool staging;
    /* lapse__broker_set_lowat: the socket's SO_RCVLOWAT above 1, in bytes (0: 1, the
     * default). */
    int lowat;
    lapse__frames_t staged;
    /* The properties of a delivery whose body came in several frames, decoded again from
     * their copy (reading the frames released the first decoding); recycled by every
     * lapse__broker_consume_next. */
    amqp_pool_t props_pool;
} lapse__broker_t;

/* How long the waits go on after the stop flag is seen: confirms that are on their way
 * still arrive, a blocked broker is not waited for. */
#define LAPSE__STOP_GRACE_MS 1000
/* The longest one publish waits for a blocked broker or a full socket. */
#define LAPSE__PUBLISH_WAIT_MS 30000
/* Staged frames are sent once they reach this many bytes (about 90 events). */
#define LAPSE__STAGE_FLUSH (32 * 1024)

/**
 * Connect, log in (heartbeat from cfg, connection_name shown in the management UI,
 * capability connection.blocked advertised) and open channel 1. With window > 0, put the
 * channel in confirm mode with at most window unsettled publishes; settle_cb then reports
 * each publish's outcome. cfg is borrowed and must outlive the broker.
 */
lapse_status_t lapse__broker_open(lapse__broker_t *broker, const lapse_config_t *cfg,
                                  const char *conn_name, size_t window,
                                  lapse__settle_cb settle_cb, void *settle_opaque,
                                  lapse_error_t *err);

/**
 * The socket of a new connection (broker_tls.c): TCP for amqp://; for amqps:// TLS that
 * verifies the peer's certificate against cfg's tls_ca (else the system's CAs) and its
 * host name (or IP address) against cfg's host, and sends cfg's client certificate when
 * one is set. *socket is owned by conn; *tls (new, or NULL for TCP) is freed with
 * lapse__broker_tls_free after conn is destroyed. A setting that cannot work (TLS files
 * without amqps://, a CA file or key that does not load) is LAPSE_ERR_CONFIG_VALUE or
 * LAPSE_ERR_BROKER_TLS, never retriable.
 */
lapse_status_t lapse__broker_socket_new(amqp_connection_state_t conn,
                                        const lapse_config_t *cfg, amqp_socket_t **socket,
                                        lapse__tls_t **tls, lapse_error_t *err);

/** After a failed connect or login: LAPSE_ERR_BROKER_TLS with the reason in err when the
 *  TLS layer recorded one (a certificate that failed verification, a fatal alert from
 *  the broker); else rc, err untouched. tls may be NULL. */
lapse_status_t lapse__broker_tls_failure(const lapse__tls_t *tls,
                                         const lapse_config_t *cfg, lapse_status_t rc,
                                         lapse_error_t *err);

/** OpenSSL's reason for the last failure in this thread (static), its queue emptied. */
const char *lapse__broker_tls_reason(void);

/** Accepts NULL. */
void lapse__broker_tls_free(lapse__tls_t *tls);

/** Close channel and connection (gracefully when still open); accepts a closed broker.
 *  Unsettled publishes are reported as LAPSE_ERR_BROKER_CLOSED. */
void lapse__broker_close(lapse__broker_t *broker);

/** Map a reply of rabbitmq-c to a status; keeps the broker's reply text in err. */
lapse_status_t lapse__broker_reply(lapse__broker_t *broker, amqp_rpc_reply_t reply,
                                   const char *what, lapse_error_t *err);

/**
 * Begin a run of publishes: cork the connection's socket (TCP_CORK) and, on a plain TCP
 * connection, stage the publishes, so that a run leaves in a few full sends instead of
 * three small writes per message. This spares this process a system call per frame
 * and the broker a wakeup and a loopback delivery per frame. A failed setsockopt
 * changes nothing.
 */
void lapse__broker_cork(lapse__broker_t *broker);

/**
 * Have a wait for frames on this connection end only once at least bytes have arrived,
 * or at its timeout (SO_RCVLOWAT; 1 or less: at the first byte, the default). A reader
 * that gathers a batch anyway then wakes once per few kB instead of once per segment
 * the broker sends. Remembered per connection: setting the value it has costs nothing.
 * A failed setsockopt changes nothing.
 */
void lapse__broker_set_lowat(lapse__broker_t *broker, int bytes);

/**
 * End a run: send what is staged, then uncork. Every wait of the broker (confirms, room
 * to publish) does this first, so nothing waits on frames held back. A staged send
 * that fails (or finds no room within LAPSE__PUBLISH_WAIT_MS, give_up_at or the stop
 * flag) closes the broker: LAPSE_ERR_BROKER_CLOSED, and its publishes stay unsettled
 * until lapse__broker_close reports them, as any publish lost with a connection.
 */
lapse_status_t lapse__broker_uncork(lapse__broker_t *broker, lapse_error_t *err);

/**
 * Publish body (borrowed) with props (borrowed). Blocks for confirms while the window is
 * full, and while the broker has blocked the connection (connection.blocked) or the
 * socket has no room, at most LAPSE__PUBLISH_WAIT_MS (LAPSE_ERR_BROKER_TIMEOUT), less
 * with give_up_at, or until the stop flag (LAPSE_ERR_STOPPED). *tag (optional) receives
 * the publish's tag. A mandatory publish on a confirm-mode channel also carries the
 * header x-lapse-publish-seq = its tag (replacing one in props), so that a basic.return,
 * which names no tag, is matched to exactly this publish; its outcome is then
 * LAPSE_ERR_BROKER_RETURNED.
 */
lapse_status_t lapse__broker_publish(lapse__broker_t *broker, const char *exchange,
                                     const char *routing_key, bool mandatory,
                                     const amqp_basic_properties_t *props,
                                     const void *body, size_t len, uint64_t *tag,
                                     lapse_error_t *err);

/** The settle callback and its opaque, read and replaced (the events relay takes the
 *  outcomes of its own publishes for the length of one round). */
void lapse__broker_swap_settle(lapse__broker_t *broker, lapse__settle_cb *cb,
                               void **opaque);

/**
 * Headers of a publish with x-lapse-publish-seq = seq: the entries of in (borrowed) but
 * any x-lapse-publish-seq, then the new one, written to out (room for in->num_entries + 1
 * entries; keys and values still point into in). Pure.
 * @return the table over out.
 */
amqp_table_t lapse__headers_with_seq(const amqp_table_t *in, uint64_t seq,
                                     amqp_table_entry_t *out);

/** Read confirms until every publish up to upto_tag is settled, or timeout_ms passes
 * (LAPSE_ERR_BROKER_TIMEOUT). */
lapse_status_t lapse__broker_wait_settled(lapse__broker_t *broker, uint64_t upto_tag,
                                          int64_t timeout_ms, lapse_error_t *err);

/** Read confirms until none is unsettled, or timeout_ms passes
 * (LAPSE_ERR_BROKER_TIMEOUT). */
lapse_status_t lapse__broker_wait_confirms(lapse__broker_t *broker, int64_t timeout_ms,
                                           lapse_error_t *err);

/** On a confirm-mode connection: handle what the broker sent (confirms, returns, a close)
 *  waiting up to timeout_ms for the first frame, and send a heartbeat when one is due.
 *  Call it while idle so the connection is not dropped for missed heartbeats. */
lapse_status_t lapse__broker_poll(lapse__broker_t *broker, int64_t timeout_ms,
                                  lapse_error_t *err);

/** Unsettled publishes. */
size_t lapse__broker_unsettled(const lapse__broker_t *broker);

/** basic.qos on channel 1: at most prefetch unacked deliveries. */
lapse_status_t lapse__broker_qos(lapse__broker_t *broker, uint16_t prefetch,
                                 lapse_error_t *err);

/** basic.consume from queue with manual acks; tag (borrowed) is the consumer tag. */
lapse_status_t lapse__broker_consume(lapse__broker_t *broker, const char *queue,
                                     const char *tag, lapse_error_t *err);

/* One delivery as lapse__broker_consume_next hands it over. Its bytes are appended to
 * the caller's buffer: the content header's properties encoded as they came (what
 * lapse__broker_props_decode reads back), then at most keep bytes of the body. */
typedef struct lapse__inbound {
    uint64_t delivery_tag;
    bool redelivered;
    uint64_t body_size;         /* the body's real size */
    size_t props_at, props_len; /* in the buffer */
    size_t body_at, body_len;   /* in the buffer: min(body_size, keep) bytes */
    /* The properties decoded, in the broker's own buffers: valid until the next call on
     * this broker. */
    const amqp_basic_properties_t *props;
} lapse__inbound_t;

/**
 * Wait up to timeout_ms for the next delivery. LAPSE_OK with *got = true: in is filled
 * and its bytes are appended to raw (at most keep bytes of the body: the rest is read and
 * dropped, never held whole); no allocation of its own, so a batch of deliveries weighs
 * its bytes in raw and no more. LAPSE_OK with *got = false: none came in time, or a
 * frame that needs nothing came instead; raw is as it was. A channel.close or
 * connection.close is answered with its close-ok and returned as
 * LAPSE_ERR_BROKER_CLOSED (LAPSE_ERR_BROKER_LOGIN for a connection closed with 403/530),
 * as is a basic.cancel from the broker; raw is then as it was too.
 */
lapse_status_t lapse__broker_consume_next(lapse__broker_t *broker, lapse__frames_t *raw,
                                          int64_t timeout_ms, size_t keep,
                                          lapse__inbound_t *in, bool *got,
                                          lapse_error_t *err);

/**
 * Decode properties encoded as a content header carries them (lapse__inbound_t's) into
 * pool (the caller's: the result and everything it points to live there).
 * @return LAPSE_OK, or LAPSE_ERR_BROKER_PROTOCOL when they do not decode.
 */
lapse_status_t lapse__broker_props_decode(const void *encoded, size_t len,
                                          amqp_pool_t *pool,
                                          amqp_basic_properties_t **out,
                                          lapse_error_t *err);

/** Ack tag (and, with multiple, every delivery before it). */
lapse_status_t lapse__broker_ack(lapse__broker_t *broker, uint64_t tag, bool multiple,
                                 lapse_error_t *err);

/** Nack one delivery back to its queue (requeue). */
lapse_status_t lapse__broker_nack(lapse__broker_t *broker, uint64_t tag,
                                  lapse_error_t *err);

/** Replace the 30 s timeout of synchronous RPCs (declare, get, close). */
void lapse__broker_set_rpc_timeout(lapse__broker_t *broker, int64_t timeout_ms);

/** Declare a server-named, exclusive, auto-delete queue with args (borrowed, optional);
 *  its name goes to name. */
lapse_status_t lapse__broker_declare_private(lapse__broker_t *broker,
                                             const amqp_table_t *args, char *name,
                                             size_t cap, lapse_error_t *err);

/** Declare exchange as a direct, non-durable exchange (idempotent; gone after a broker
 *  restart, declared again by the next caller). */
lapse_status_t lapse__broker_declare_transient_direct(lapse__broker_t *broker,
                                                      const char *exchange,
                                                      lapse_error_t *err);

/** Bind queue to exchange with routing key key. */
lapse_status_t lapse__broker_bind(lapse__broker_t *broker, const char *queue,
                                  const char *exchange, const char *key,
                                  lapse_error_t *err);

/** basic.get with no_ack from queue: *got says whether a message came; then msg is new
 *  (release it with lapse__broker_message_clear). */
lapse_status_t lapse__broker_get(lapse__broker_t *broker, const char *queue,
                                 amqp_message_t *msg, bool *got, lapse_error_t *err);

/** Release a message taken with lapse__broker_get. */
void lapse__broker_message_clear(amqp_message_t *msg);

/** An AMQP table entry with a string / int64 value; k and v are borrowed. */
amqp_table_entry_t lapse__entry_str(const char *k, const char *v);
amqp_table_entry_t lapse__entry_i64(const char *k, int64_t v);

/** Copy an amqp_bytes_t into buf as a NUL-terminated string (truncating). */
void lapse__bytes_to_str(amqp_bytes_t bytes, char *buf, size_t cap);

#endif

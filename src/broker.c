/* SPDX-License-Identifier: MIT
 * The rabbitmq-c boundary: connect, map replies to lapse codes, confirmed publishing. */
#include "broker_int.h"

#include "clock_int.h"
#include "headers_int.h"
#include "secret_int.h"

#include <lapse/message.h>

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define CONFIRM_WAIT_MS 30000 /* a full window waits this long for the broker */
/* The longest single step of a wait: the stop flag is looked at between steps. */
#define WAIT_STEP_MS 200
/* The longest a graceful close waits for each of its two replies. */
#define CLOSE_WAIT_S 5
/* Room for "publish to <exchange>" in a wait's error text. */
#define WHAT_MAX 160
/* Headers of a publish up to this many are stamped on the stack, more on the heap. */
#define SEQ_HEADERS_FIXED 8
/* Page of props_pool: a dead-lettered delivery's properties decode into about 1 KiB. */
#define PROPS_POOL_PAGE 4096

amqp_table_entry_t lapse__entry_str(const char *k, const char *v) {
    amqp_table_entry_t e;
    e.key = amqp_cstring_bytes(k);
    e.value.kind = AMQP_FIELD_KIND_UTF8;
    e.value.value.bytes = amqp_cstring_bytes(v);
    return e;
}

amqp_table_entry_t lapse__entry_i64(const char *k, int64_t v) {
    amqp_table_entry_t e;
    e.key = amqp_cstring_bytes(k);
    e.value.kind = AMQP_FIELD_KIND_I64;
    e.value.value.i64 = v;
    return e;
}

void lapse__bytes_to_str(amqp_bytes_t bytes, char *buf, size_t cap) {
    size_t n = bytes.len < cap - 1 ? bytes.len : cap - 1;
    if (n > 0) {
        memcpy(buf, bytes.bytes, n);
    }
    buf[n] = '\0';
}

static lapse_status_t server_close(lapse__broker_t *broker, const char *what,
                                   uint16_t code, amqp_bytes_t text, bool connection,
                                   lapse_error_t *err) {
    char reply[128];
    lapse__bytes_to_str(text, reply, sizeof reply);
    broker->open = false;
    bool refused =
        connection && (code == AMQP_ACCESS_REFUSED || code == AMQP_NOT_ALLOWED);
    lapse_status_t rc = refused ? LAPSE_ERR_BROKER_LOGIN : LAPSE_ERR_BROKER_CLOSED;
    return lapse_error_set(err, rc, "%s: broker closed the %s: %u %s", what,
                           connection ? "connection" : "channel", code, reply);
}

lapse_status_t lapse__broker_reply(lapse__broker_t *broker, amqp_rpc_reply_t reply,
                                   const char *what, lapse_error_t *err) {
    switch (reply.reply_type) {
        case AMQP_RESPONSE_NORMAL:
            return LAPSE_OK;
        case AMQP_RESPONSE_NONE:
            return lapse_error_set(err, LAPSE_ERR_BROKER_PROTOCOL, "%s: no reply", what);
        case AMQP_RESPONSE_LIBRARY_EXCEPTION:
            /* rabbitmq-c closes the connection when an RPC times out. */
            broker->open = false;
            if (reply.library_error == AMQP_STATUS_TIMEOUT) {
                return lapse_error_set(err, LAPSE_ERR_BROKER_TIMEOUT, "%s: timed out",
                                       what);
            }
            return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "%s: %s", what,
                                   amqp_error_string2(reply.library_error));
        case AMQP_RESPONSE_SERVER_EXCEPTION:
            if (reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
                amqp_connection_close_t *m = reply.reply.decoded;
                return server_close(broker, what, m->reply_code, m->reply_text, true,
                                    err);
            }
            if (reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
                amqp_channel_close_t *m = reply.reply.decoded;
                return server_close(broker, what, m->reply_code, m->reply_text, false,
                                    err);
            }
            return lapse_error_set(err, LAPSE_ERR_BROKER_PROTOCOL,
                                   "%s: unexpected method 0x%08x", what,
                                   (unsigned)reply.reply.id);
    }
    return lapse_error_set(err, LAPSE_ERR_BROKER_PROTOCOL, "%s: bad reply", what);
}

lapse_status_t lapse__broker_open(lapse__broker_t *broker, const lapse_config_t *cfg,
                                  const char *conn_name, size_t window,
                                  lapse__settle_cb settle_cb, void *settle_opaque,
                                  lapse_error_t *err) {
    memset(broker, 0, sizeof *broker);
    broker->cfg = cfg;
    broker->next_tag = 1;
    broker->first_open = 1;
    broker->settle_cb = settle_cb;
    broker->settle_opaque = settle_opaque;
    broker->blocked_wait_ms = LAPSE__PUBLISH_WAIT_MS;
    init_amqp_pool(&broker->props_pool, PROPS_POOL_PAGE);
    if (window > 0) {
        broker->slots = calloc(window, sizeof *broker->slots);
        if (!broker->slots) {
            return lapse_error_set(err, LAPSE_ERR_NOMEM, "confirm window");
        }
        broker->window = window;
    }

    broker->conn = amqp_new_connection();
    if (!broker->conn) {
        lapse__broker_close(broker);
        return lapse_error_set(err, LAPSE_ERR_NOMEM,
                               "cannot allocate an AMQP connection");
    }
    amqp_socket_t *socket = NULL;
    lapse_status_t rc =
        lapse__broker_socket_new(broker->conn, cfg, &socket, &broker->tls, err);
    if (rc != LAPSE_OK) {
        lapse__broker_close(broker);
        return rc;
    }
    struct timeval tv = {.tv_sec = 10, .tv_usec = 0};
    int st = amqp_socket_open_noblock(socket, cfg->host, cfg->port, &tv);
    if (st != AMQP_STATUS_OK) {
        /* A certificate that fails verification or a broker that refuses this client is
         * final (LAPSE_ERR_BROKER_TLS); anything else, a handshake cut short included,
         * may pass on the next try. */
        rc = lapse_error_set(err, LAPSE_ERR_BROKER_CONNECT, "connect to %s:%d: %s%s%s",
                             cfg->host, cfg->port, amqp_error_string2(st),
                             broker->tls ? ": " : "",
                             broker->tls ? lapse__broker_tls_reason() : "");
        rc = lapse__broker_tls_failure(broker->tls, cfg, rc, err);
        lapse__broker_close(broker);
        return rc;
    }
    /* Synchronous RPCs (declare, open, close) must not hang forever on a stuck broker. */
    struct timeval rpc = {.tv_sec = 30, .tv_usec = 0};
    amqp_set_rpc_timeout(broker->conn, &rpc);

    snprintf(broker->name, sizeof broker->name, "%s", conn_name);
    /* rabbitmq-c 0.11 advertises authentication_failure_close and
     * exchange_exchange_bindings only, and merges this table into its own. Without
     * connection.blocked the broker blocks a publishing connection during an alarm
     * without a word, and a publish then waits on a socket nobody reads. */
    amqp_table_entry_t caps_entries[] = {
        {.key = amqp_cstring_bytes("connection.blocked"),
         .value = {.kind = AMQP_FIELD_KIND_BOOLEAN, .value = {.boolean = 1}}}};
    amqp_table_entry_t props_entries[] = {
        lapse__entry_str("connection_name", conn_name),
        lapse__entry_str("product", "lapse"),
        lapse__entry_str("version", LAPSE_VERSION),
        {.key = amqp_cstring_bytes("capabilities"),
         .value = {.kind = AMQP_FIELD_KIND_TABLE,
                   .value = {.table = {.num_entries = 1, .entries = caps_entries}}}}};
    amqp_table_t props = {.num_entries = 4, .entries = props_entries};
    char password[LAPSE__PASSWORD_MAX];
    rc = lapse__secret_password(cfg, password, sizeof password, err);
    if (rc != LAPSE_OK) {
        lapse__broker_close(broker);
        return rc;
    }
    amqp_rpc_reply_t reply = amqp_login_with_properties(
        broker->conn, cfg->vhost, 0, AMQP_DEFAULT_FRAME_SIZE, cfg->heartbeat, &props,
        AMQP_SASL_METHOD_PLAIN, cfg->user, password);
    lapse__secret_wipe(password, sizeof password);
    /* A refused login arrives as connection.close 403 (or 530 for a vhost it may not
     * use) and is final; a dropped socket during the handshake (a broker restarting, a
     * proxy without backends) stays retriable. Under TLS 1.3 a broker that refuses the
     * client certificate says so now, with an alert: final too. */
    rc = lapse__broker_reply(broker, reply, "login", err);
    if (rc != LAPSE_OK) {
        rc = lapse__broker_tls_failure(broker->tls, cfg, rc, err);
        lapse__broker_close(broker);
        return rc;
    }
    broker->open = true;
    amqp_channel_open(broker->conn, LAPSE__CHANNEL);
    rc = lapse__broker_reply(broker, amqp_get_rpc_reply(broker->conn), "channel.open",
                             err);
    if (rc == LAPSE_OK && window > 0) {
        amqp_confirm_select(broker->conn, LAPSE__CHANNEL);
        rc = lapse__broker_reply(broker, amqp_get_rpc_reply(broker->conn),
                                 "confirm.select", err);
        broker->confirms = rc == LAPSE_OK;
    }
    if (rc != LAPSE_OK) {
        lapse__broker_close(broker);
    }
    return rc;
}

static lapse__pub_slot_t *slot_of(lapse__broker_t *broker, uint64_t tag) {
    return &broker->slots[tag % broker->window];
}

static void settle_one(lapse__broker_t *broker, uint64_t tag, lapse_status_t outcome) {
    lapse__pub_slot_t *slot = slot_of(broker, tag);
    if (slot->tag != tag) {
        return; /* already settled (a late multiple ack) */
    }
    if (outcome == LAPSE_OK && slot->returned) {
        outcome = LAPSE_ERR_BROKER_RETURNED;
    }
    slot->tag = 0;
    slot->returned = false;
    if (broker->settle_cb) {
        broker->settle_cb(broker->settle_opaque, tag, outcome);
    }
}

static void advance(lapse__broker_t *broker) {
    while (broker->first_open < broker->next_tag &&
           slot_of(broker, broker->first_open)->tag != broker->first_open) {
        broker->first_open++;
    }
}

static void settle(lapse__broker_t *broker, uint64_t tag, bool multiple,
                   lapse_status_t outcome) {
    if (tag >= broker->next_tag) {
        return;
    }
    if (multiple) {
        for (uint64_t t = broker->first_open; t <= tag; t++) {
            settle_one(broker, t, outcome);
        }
    } else {
        settle_one(broker, tag, outcome);
    }
    advance(broker);
}

amqp_table_t lapse__headers_with_seq(const amqp_table_t *in, uint64_t seq,
                                     amqp_table_entry_t *out) {
    amqp_table_t t = {.num_entries = 0, .entries = out};
    size_t key_len = strlen(LAPSE_HDR_PUBLISH_SEQ);
    for (int i = 0; in && i < in->num_entries; i++) {
        amqp_bytes_t k = in->entries[i].key;
        if (!(k.len == key_len && memcmp(k.bytes, LAPSE_HDR_PUBLISH_SEQ, key_len) == 0)) {
            out[t.num_entries++] = in->entries[i];
        }
    }
    out[t.num_entries++] = lapse__hdr_publish_seq_entry(seq);
    return t;
}

/* basic.return names no delivery tag; the publish's own sequence header does. */
static void mark_returned(lapse__broker_t *broker, uint64_t seq) {
    if (seq >= broker->first_open && seq < broker->next_tag &&
        slot_of(broker, seq)->tag == seq) {
        slot_of(broker, seq)->returned = true;
        return;
    }
    /* A return we cannot attribute (no header: not published through here): failing
     * every unsettled publish is safe, since the callers publish again and every
     * consumer is idempotent. */
    for (uint64_t t = broker->first_open; t < broker->next_tag; t++) {
        lapse__pub_slot_t *slot = slot_of(broker, t);
        if (slot->tag == t) {
            slot->returned = true;
        }
    }
}

/* connection.blocked / unblocked: logged once per change, not per frame. */
static void set_blocked(lapse__broker_t *broker, bool blocked, amqp_bytes_t reason) {
    if (broker->blocked == blocked) {
        return;
    }
    broker->blocked = blocked;
    broker->blocked_since = blocked ? lapse__mono_ms() : 0;
    if (blocked) {
        char text[128];
        lapse__bytes_to_str(reason, text, sizeof text);
        for (char *p = text; *p; p++) {
            if (*p == '"' || (unsigned char)*p < 0x20) {
                *p = '\'';
            }
        }
        lapse__log(broker->cfg, LAPSE_LOG_WARN,
                   "event=broker_blocked connection=\"%s\" reason=\"%s\" note=\"the "
                   "broker takes no publishes until its alarm clears\"",
                   broker->name, text);
    } else {
        lapse__log(broker->cfg, LAPSE_LOG_INFO,
                   "event=broker_unblocked connection=\"%s\"", broker->name);
    }
}

/* The one place a control method from the broker is handled, on a publishing or a
 * consuming connection: connection.blocked / unblocked are noted; a channel.close or
 * connection.close is answered with its close-ok and reported (what names the side);
 * anything else needs nothing. */
static lapse_status_t handle_control(lapse__broker_t *broker, const amqp_frame_t *frame,
                                     const char *what, lapse_error_t *err) {
    switch (frame->payload.method.id) {
        case AMQP_CONNECTION_BLOCKED_METHOD: {
            const amqp_connection_blocked_t *m = frame->payload.method.decoded;
            set_blocked(broker, true, m->reason);
            return LAPSE_OK;
        }
        case AMQP_CONNECTION_UNBLOCKED_METHOD:
            set_blocked(broker, false, amqp_empty_bytes);
            return LAPSE_OK;
        case AMQP_CHANNEL_CLOSE_METHOD: {
            const amqp_channel_close_t *m = frame->payload.method.decoded;
            amqp_channel_close_ok_t ok = {0};
            amqp_send_method(broker->conn, frame->channel, AMQP_CHANNEL_CLOSE_OK_METHOD,
                             &ok);
            return server_close(broker, what, m->reply_code, m->reply_text, false, err);
        }
        case AMQP_CONNECTION_CLOSE_METHOD: {
            const amqp_connection_close_t *m = frame->payload.method.decoded;
            amqp_connection_close_ok_t ok = {0};
            amqp_send_method(broker->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
            return server_close(broker, what, m->reply_code, m->reply_text, true, err);
        }
        default:
            return LAPSE_OK;
    }
}

static void set_cork(lapse__broker_t *broker, bool on) {
    if (broker->corked == on || broker->conn == NULL) {
        return;
    }
    int fd = amqp_get_sockfd(broker->conn);
    int value = on ? 1 : 0;
    if (fd >= 0 && setsockopt(fd, IPPROTO_TCP, TCP_CORK, &value, sizeof value) == 0) {
        broker->corked = on;
    }
}

void lapse__broker_set_lowat(lapse__broker_t *broker, int bytes) {
    int want = bytes > 1 ? bytes : 0;
    if (broker->lowat == want || broker->conn == NULL) {
        return;
    }
    int fd = amqp_get_sockfd(broker->conn);
    int value = want > 0 ? want : 1;
    if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &value, sizeof value) == 0) {
        broker->lowat = want;
    }
}

void lapse__broker_cork(lapse__broker_t *broker) {
    set_cork(broker, true);
    /* rabbitmq-c owns a TLS session's writes: its publishes go through it, corked. */
    broker->staging = broker->conn != NULL && broker->tls == NULL;
}

/* LAPSE_OK while a wait may go on: before deadline and give_up_at, and no later than
 * LAPSE__STOP_GRACE_MS after the stop flag was first seen. */
static lapse_status_t wait_over(lapse__broker_t *broker, int64_t deadline,
                                const char *what, lapse_error_t *err) {
    int64_t now = lapse__mono_ms();
    if (broker->stop && *broker->stop) {
        if (broker->stop_seen_at == 0) {
            broker->stop_seen_at = now;
        }
        if (now - broker->stop_seen_at >= LAPSE__STOP_GRACE_MS) {
            return lapse_error_set(err, LAPSE_ERR_STOPPED, "%s: stopped by request%s",
                                   what, broker->blocked ? " (broker blocked)" : "");
        }
    }
    if (now >= deadline || (broker->give_up_at > 0 && now >= broker->give_up_at) ||
        (broker->blocked && now - broker->blocked_since >= broker->blocked_wait_ms)) {
        return lapse_error_set(err, LAPSE_ERR_BROKER_TIMEOUT, "%s: timed out%s", what,
                               broker->blocked ? ": the broker blocked the connection "
                                                 "(memory or disk alarm)"
                                               : "");
    }
    return LAPSE_OK;
}

/* How long the next step of a wait may take. */
static int64_t step_ms(const lapse__broker_t *broker, int64_t deadline) {
    int64_t now = lapse__mono_ms();
    int64_t end = deadline;
    if (broker->give_up_at > 0 && broker->give_up_at < end) {
        end = broker->give_up_at;
    }
    int64_t left = end - now;
    return left < 0 ? 0 : left < WAIT_STEP_MS ? left : WAIT_STEP_MS;
}

/* Send the staged frames, all of them. Until the last byte is out the connection is
 * between two frames' bytes, so nothing is read meanwhile (rabbitmq-c may answer a read
 * with a heartbeat): this only waits for room, within the publish wait, give_up_at and
 * the stop flag. A send cut short leaves the stream unusable: the broker is closed. */
static lapse_status_t send_staged(lapse__broker_t *broker, lapse_error_t *err) {
    lapse__frames_t *f = &broker->staged;
    if (f->n == 0) {
        return LAPSE_OK;
    }
    int fd = amqp_get_sockfd(broker->conn);
    int64_t deadline = lapse__mono_ms() + LAPSE__PUBLISH_WAIT_MS;
    lapse_status_t rc = LAPSE_OK;
    for (size_t off = 0; off < f->n && rc == LAPSE_OK;) {
        ssize_t sent = send(fd, f->p + off, f->n - off, MSG_NOSIGNAL);
        if (sent >= 0) {
            off += (size_t)sent;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            rc = wait_over(broker, deadline, "publish: no room in the socket", err);
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            if (rc == LAPSE_OK && poll(&pfd, 1, (int)step_ms(broker, deadline)) < 0 &&
                errno != EINTR) {
                rc = lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "publish: poll: %s",
                                     strerror(errno));
            }
        } else if (errno != EINTR) {
            rc = lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "publish: send: %s",
                                 strerror(errno));
        }
    }
    f->n = 0;
    if (rc != LAPSE_OK) {
        broker->open = false;
    }
    return rc;
}

lapse_status_t lapse__broker_uncork(lapse__broker_t *broker, lapse_error_t *err) {
    lapse_status_t rc = LAPSE_OK;
    if (broker->staging && broker->conn != NULL) {
        rc = send_staged(broker, err);
    }
    broker->staging = false;
    set_cork(broker, false);
    return rc;
}

/* Before a wait: whatever is waited for may need the frames staged or held back. */
static lapse_status_t may_wait(lapse__broker_t *broker, int64_t deadline,
                               const char *what, lapse_error_t *err) {
    lapse_status_t rc = broker->staged.n > 0 ? send_staged(broker, err) : LAPSE_OK;
    set_cork(broker, false);
    return rc == LAPSE_OK ? wait_over(broker, deadline, what, err) : rc;
}

/* Read and handle one frame on a confirm-mode connection; *got says whether one came. */
static lapse_status_t pump(lapse__broker_t *broker, int64_t timeout_ms, bool *got,
                           lapse_error_t *err) {
    /* Reading may write (a heartbeat): never between two staged frames. */
    if (broker->staged.n > 0) {
        lapse_status_t rc = send_staged(broker, err);
        if (rc != LAPSE_OK) {
            return rc;
        }
    }
    if (timeout_ms > 0) {
        set_cork(broker, false); /* see may_wait */
    }
    struct timeval tv = {.tv_sec = timeout_ms / 1000,
                         .tv_usec = (suseconds_t)((timeout_ms % 1000) * 1000)};
    amqp_frame_t frame;
    *got = false;
    int st = amqp_simple_wait_frame_noblock(broker->conn, &frame, &tv);
    if (st == AMQP_STATUS_TIMEOUT) {
        return LAPSE_OK;
    }
    if (st != AMQP_STATUS_OK) {
        broker->open = false;
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "waiting for confirms: %s",
                               amqp_error_string2(st));
    }
    *got = true;
    if (frame.frame_type != AMQP_FRAME_METHOD) {
        return LAPSE_OK;
    }
    switch (frame.payload.method.id) {
        case AMQP_BASIC_ACK_METHOD: {
            amqp_basic_ack_t *m = frame.payload.method.decoded;
            settle(broker, m->delivery_tag, m->multiple, LAPSE_OK);
            return LAPSE_OK;
        }
        case AMQP_BASIC_NACK_METHOD: {
            amqp_basic_nack_t *m = frame.payload.method.decoded;
            settle(broker, m->delivery_tag, m->multiple, LAPSE_ERR_BROKER_NACK);
            return LAPSE_OK;
        }
        case AMQP_BASIC_RETURN_METHOD: {
            /* The returned message's header and body follow; its ack comes after. */
            amqp_message_t msg;
            amqp_rpc_reply_t r = amqp_read_message(broker->conn, frame.channel, &msg, 0);
            lapse_status_t rc = lapse__broker_reply(broker, r, "basic.return", err);
            if (rc != LAPSE_OK) {
                return rc;
            }
            mark_returned(broker, lapse__hdr_publish_seq(&msg.properties));
            amqp_destroy_message(&msg);
            return LAPSE_OK;
        }
        default:
            return handle_control(broker, &frame, "publish", err);
    }
}

lapse_status_t lapse__broker_poll(lapse__broker_t *broker, int64_t timeout_ms,
                                  lapse_error_t *err) {
    if (!broker->open) {
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "not connected");
    }
    bool got = true;
    lapse_status_t rc = LAPSE_OK;
    /* Reading also sends a heartbeat when one is due, so an idle publishing connection
     * is not dropped by the broker. */
    for (int i = 0; i < 64 && got && rc == LAPSE_OK; i++) {
        rc = pump(broker, i == 0 ? timeout_ms : 0, &got, err);
    }
    if (broker->open) {
        /* Decoded frames stay in rabbitmq-c's pools until released: without this a
         * connection that only publishes grows with every confirm it reads. */
        amqp_maybe_release_buffers(broker->conn);
    }
    return rc;
}

size_t lapse__broker_unsettled(const lapse__broker_t *broker) {
    return (size_t)(broker->next_tag - broker->first_open);
}

lapse_status_t lapse__broker_wait_settled(lapse__broker_t *broker, uint64_t upto_tag,
                                          int64_t timeout_ms, lapse_error_t *err) {
    if (!broker->conn) {
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "not connected");
    }
    int64_t deadline = lapse__time_add(lapse__mono_ms(), timeout_ms);
    while (broker->first_open <= upto_tag && broker->first_open < broker->next_tag) {
        if (!broker->open) {
            return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED,
                                   "connection lost with publishes unconfirmed");
        }
        char what[64];
        snprintf(what, sizeof what, "%zu publishes unconfirmed",
                 lapse__broker_unsettled(broker));
        lapse_status_t rc = may_wait(broker, deadline, what, err);
        if (rc != LAPSE_OK) {
            return rc;
        }
        bool got;
        rc = pump(broker, step_ms(broker, deadline), &got, err);
        if (rc != LAPSE_OK) {
            return rc;
        }
    }
    amqp_maybe_release_buffers(broker->conn); /* see lapse__broker_poll */
    return LAPSE_OK;
}

lapse_status_t lapse__broker_wait_confirms(lapse__broker_t *broker, int64_t timeout_ms,
                                           lapse_error_t *err) {
    if (broker->next_tag == broker->first_open) {
        return LAPSE_OK;
    }
    return lapse__broker_wait_settled(broker, broker->next_tag - 1, timeout_ms, err);
}

/* rabbitmq-c writes a publish with no deadline: on a socket the broker stopped reading
 * (it blocked the connection) amqp_basic_publish would wait forever, deaf to SIGTERM. So
 * a publish starts only when the broker has not said connection.blocked and the socket
 * has room; until then this waits, reading what the broker sends (the unblocked frame,
 * confirms), within LAPSE__PUBLISH_WAIT_MS and the stop flag. The broker blocks a
 * connection on the first publish after an alarm and says so at once, so at most the
 * publishes sent before that frame arrives go into the socket, which has room for them;
 * only a single message larger than the room left could still wait in rabbitmq-c (the
 * README's max_message_size keeps messages small). */
static lapse_status_t wait_room(lapse__broker_t *broker, const char *exchange,
                                lapse_error_t *err) {
    int64_t deadline = lapse__mono_ms() + LAPSE__PUBLISH_WAIT_MS;
    int fd = amqp_get_sockfd(broker->conn);
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN | POLLOUT};
        int ready = poll(&pfd, 1, 0);
        if (amqp_frames_enqueued(broker->conn) || amqp_data_in_buffer(broker->conn) ||
            (ready > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR)))) {
            bool got = true;
            for (int i = 0; i < 64 && got; i++) {
                lapse_status_t rc = pump(broker, 0, &got, err);
                if (rc != LAPSE_OK) {
                    return rc;
                }
            }
            if (!broker->open) {
                return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED,
                                       "publish: not connected");
            }
            pfd.revents = 0;
            ready = poll(&pfd, 1, 0);
        }
        if (!broker->blocked && ready > 0 && (pfd.revents & POLLOUT)) {
            return LAPSE_OK;
        }
        char what[WHAT_MAX];
        snprintf(what, sizeof what, "publish to %s",
                 exchange[0] ? exchange : "(default)");
        lapse_status_t rc = may_wait(broker, deadline, what, err);
        if (rc != LAPSE_OK) {
            return rc;
        }
        if (broker->blocked) {
            bool got;
            rc = pump(broker, step_ms(broker, deadline), &got, err);
            if (rc != LAPSE_OK) {
                return rc;
            }
        } else {
            pfd.revents = 0;
            poll(&pfd, 1, (int)step_ms(broker, deadline));
        }
    }
}

lapse_status_t lapse__broker_publish(lapse__broker_t *broker, const char *exchange,
                                     const char *routing_key, bool mandatory,
                                     const amqp_basic_properties_t *props,
                                     const void *body, size_t len, uint64_t *tag,
                                     lapse_error_t *err) {
    if (!broker->open) {
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "publish: not connected");
    }
    if (broker->confirms) {
        /* Keep at most `window` publishes in flight: drain confirms before the next. */
        int64_t deadline = lapse__mono_ms() + CONFIRM_WAIT_MS;
        while (lapse__broker_unsettled(broker) >= broker->window) {
            lapse_status_t rc = may_wait(broker, deadline, "confirm window full", err);
            if (rc != LAPSE_OK) {
                return rc;
            }
            bool got;
            rc = pump(broker, step_ms(broker, deadline), &got, err);
            if (rc != LAPSE_OK) {
                return rc;
            }
        }
    }
    /* A full stage is sent before the next publish joins it, so that a failed send is
     * this publish's failure, before it has a tag. Staged, the room is looked for once
     * per send of the stage. */
    lapse_status_t rc =
        broker->staged.n >= LAPSE__STAGE_FLUSH ? send_staged(broker, err) : LAPSE_OK;
    if (rc == LAPSE_OK && !(broker->staging && broker->staged.n > 0)) {
        rc = wait_room(broker, exchange, err);
    }
    if (rc != LAPSE_OK) {
        return rc;
    }
    amqp_bytes_t bytes = {.len = len, .bytes = (void *)body};
    uint64_t t = broker->next_tag;
    amqp_basic_properties_t stamped;
    amqp_table_entry_t fixed[SEQ_HEADERS_FIXED];
    amqp_table_entry_t *entries = NULL;
    if (broker->confirms && mandatory) {
        const amqp_table_t *old =
            (props->_flags & AMQP_BASIC_HEADERS_FLAG) ? &props->headers : NULL;
        size_t need = (old ? (size_t)old->num_entries : 0) + 1;
        entries = need <= SEQ_HEADERS_FIXED ? fixed : malloc(need * sizeof *entries);
        if (!entries) {
            return lapse_error_set(err, LAPSE_ERR_NOMEM, "publish headers");
        }
        stamped = *props;
        stamped.headers = lapse__headers_with_seq(old, t, entries);
        stamped._flags |= AMQP_BASIC_HEADERS_FLAG;
        props = &stamped;
    }
    int st = AMQP_STATUS_OK;
    if (broker->staging) {
        rc = lapse__frames_publish(
            &broker->staged, (size_t)amqp_get_frame_max(broker->conn), LAPSE__CHANNEL,
            amqp_cstring_bytes(exchange), amqp_cstring_bytes(routing_key), mandatory,
            props, bytes);
    } else {
        st = amqp_basic_publish(
            broker->conn, LAPSE__CHANNEL, amqp_cstring_bytes(exchange),
            amqp_cstring_bytes(routing_key), mandatory, 0, props, bytes);
    }
    if (entries != fixed) {
        free(entries);
    }
    if (rc != LAPSE_OK) {
        return lapse_error_set(
            err, rc, "publish to %s: %s", exchange[0] ? exchange : "(default)",
            rc == LAPSE_ERR_NOMEM ? "out of memory" : "properties larger than a frame");
    }
    if (st != AMQP_STATUS_OK) {
        broker->open = false;
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "publish to %s: %s",
                               exchange[0] ? exchange : "(default)",
                               amqp_error_string2(st));
    }
    broker->next_tag++;
    if (broker->confirms) {
        lapse__pub_slot_t *slot = slot_of(broker, t);
        slot->tag = t;
        slot->returned = false;
    }
    if (tag) {
        *tag = t;
    }
    return LAPSE_OK;
}

void lapse__broker_swap_settle(lapse__broker_t *broker, lapse__settle_cb *cb,
                               void **opaque) {
    lapse__settle_cb old_cb = broker->settle_cb;
    void *old_opaque = broker->settle_opaque;
    broker->settle_cb = *cb;
    broker->settle_opaque = *opaque;
    *cb = old_cb;
    *opaque = old_opaque;
}

void lapse__broker_close(lapse__broker_t *broker) {
    if (broker->confirms) {
        for (uint64_t t = broker->first_open; t < broker->next_tag; t++) {
            settle_one(broker, t, LAPSE_ERR_BROKER_CLOSED);
        }
        broker->first_open = broker->next_tag;
    }
    if (broker->conn) {
        /* A blocked connection is not read by the broker: a graceful close would wait
         * out the RPC timeout. Dropping the socket is as good (the broker requeues and
         * cleans up), so only an unblocked one is closed politely, within CLOSE_WAIT. */
        if (broker->open && !broker->blocked) {
            struct timeval tv = {.tv_sec = CLOSE_WAIT_S, .tv_usec = 0};
            amqp_set_rpc_timeout(broker->conn, &tv);
            amqp_channel_close(broker->conn, LAPSE__CHANNEL, AMQP_REPLY_SUCCESS);
            amqp_connection_close(broker->conn, AMQP_REPLY_SUCCESS);
        }
        amqp_destroy_connection(broker->conn);
    }
    lapse__frames_free(&broker->staged);
    empty_amqp_pool(&broker->props_pool);
    broker->staging = false;
    broker->corked = false;
    /* After the connection: its TLS context called back into this until destroyed. */
    lapse__broker_tls_free(broker->tls);
    broker->tls = NULL;
    free(broker->slots);
    broker->slots = NULL;
    broker->conn = NULL;
    broker->open = false;
    broker->confirms = false;
}

/* ---- the consuming side: consume, ack, qos, get, and the frames in between -----------
 */

lapse_status_t lapse__broker_qos(lapse__broker_t *broker, uint16_t prefetch,
                                 lapse_error_t *err) {
    amqp_basic_qos(broker->conn, LAPSE__CHANNEL, 0, prefetch, 0);
    return lapse__broker_reply(broker, amqp_get_rpc_reply(broker->conn), "basic.qos",
                               err);
}

lapse_status_t lapse__broker_consume(lapse__broker_t *broker, const char *queue,
                                     const char *tag, lapse_error_t *err) {
    amqp_basic_consume(broker->conn, LAPSE__CHANNEL, amqp_cstring_bytes(queue),
                       amqp_cstring_bytes(tag), 0, 0, 0, amqp_empty_table);
    return lapse__broker_reply(broker, amqp_get_rpc_reply(broker->conn), "basic.consume",
                               err);
}

/* A method that is not a delivery on a consuming connection (as rabbitmq-c's
 * amqp_consumer.c example handles them): a basic.cancel (the queue was deleted) ends the
 * session; closes and blocked notices go to handle_control, like the publishing side's.
 */
static lapse_status_t handle_method(lapse__broker_t *broker, const amqp_frame_t *f,
                                    lapse_error_t *err) {
    if (f->payload.method.id == AMQP_BASIC_CANCEL_METHOD) {
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED,
                               "consume: the broker cancelled the consumer");
    }
    return handle_control(broker, f, "consume", err);
}

lapse_status_t lapse__broker_props_decode(const void *encoded, size_t len,
                                          amqp_pool_t *pool,
                                          amqp_basic_properties_t **out,
                                          lapse_error_t *err) {
    amqp_bytes_t bytes = {.len = len, .bytes = (void *)encoded};
    void *decoded = NULL;
    int st = amqp_decode_properties(AMQP_BASIC_CLASS, pool, bytes, &decoded);
    if (st != AMQP_STATUS_OK || decoded == NULL) {
        return lapse_error_set(err, LAPSE_ERR_BROKER_PROTOCOL,
                               "message properties do not decode: %s",
                               amqp_error_string2(st));
    }
    *out = decoded;
    return LAPSE_OK;
}

static lapse_status_t content_broken(lapse__broker_t *broker, const char *why,
                                     lapse_error_t *err) {
    broker->open = false;
    return lapse_error_set(err, LAPSE_ERR_BROKER_PROTOCOL, "consume: %s", why);
}

static lapse_status_t next_frame(lapse__broker_t *broker, amqp_frame_t *frame,
                                 lapse_error_t *err) {
    int st = amqp_simple_wait_frame(broker->conn, frame);
    if (st != AMQP_STATUS_OK) {
        broker->open = false;
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "consume: %s",
                               amqp_error_string2(st));
    }
    return LAPSE_OK;
}

/* The content of a delivery whose basic.deliver is in hand: its header and body frames,
 * appended to raw. At most keep bytes of the body are kept; the rest is read and
 * dropped, releasing the channel's buffers frame by frame, so a 16 MiB body never sits
 * in memory whole (docs/design.md, "Bounded memory"). */
static lapse_status_t read_content(lapse__broker_t *broker, amqp_channel_t channel,
                                   lapse__frames_t *raw, size_t keep,
                                   lapse__inbound_t *in, lapse_error_t *err) {
    amqp_frame_t frame;
    lapse_status_t rc = next_frame(broker, &frame, err);
    if (rc != LAPSE_OK) {
        return rc;
    }
    if (frame.frame_type != AMQP_FRAME_HEADER || frame.channel != channel) {
        return content_broken(broker, "a delivery without its content header", err);
    }
    /* The encoded properties point into the socket's buffer, which the next read
     * overwrites: copied first. Their decoding lives in the channel's pool until the
     * buffers are released. */
    amqp_bytes_t enc = frame.payload.properties.raw;
    uint64_t size = frame.payload.properties.body_size;
    size_t kept = size < keep ? (size_t)size : keep;
    if (!lapse__frames_reserve(raw, enc.len + kept)) {
        return lapse_error_set(err, LAPSE_ERR_NOMEM, "consume: a delivery's bytes");
    }
    in->props = frame.payload.properties.decoded;
    in->props_at = raw->n;
    in->props_len = enc.len;
    memcpy(raw->p + raw->n, enc.bytes, enc.len);
    in->body_at = raw->n + enc.len;
    in->body_len = kept;
    in->body_size = size;
    uint64_t read = 0;
    for (unsigned frames = 0; read < size; frames++) {
        if (frames > 0) {
            /* What was needed of the frames so far is copied: let their buffers go
             * (the decoded properties with them, decoded again below). */
            amqp_maybe_release_buffers_on_channel(broker->conn, channel);
            in->props = NULL;
        }
        rc = next_frame(broker, &frame, err);
        if (rc != LAPSE_OK) {
            return rc;
        }
        if (frame.frame_type != AMQP_FRAME_BODY || frame.channel != channel) {
            return content_broken(broker, "a delivery's body cut short", err);
        }
        amqp_bytes_t part = frame.payload.body_fragment;
        if (read < kept) {
            size_t take = kept - (size_t)read < part.len ? kept - (size_t)read : part.len;
            memcpy(raw->p + in->body_at + read, part.bytes, take);
        }
        read += part.len;
    }
    if (read != size) {
        return content_broken(broker, "a delivery's body is longer than its header says",
                              err);
    }
    if (in->props == NULL) {
        amqp_basic_properties_t *props = NULL;
        rc = lapse__broker_props_decode(raw->p + in->props_at, in->props_len,
                                        &broker->props_pool, &props, err);
        if (rc != LAPSE_OK) {
            return content_broken(broker, "a delivery's properties do not decode", err);
        }
        in->props = props;
    }
    raw->n = in->body_at + kept;
    return LAPSE_OK;
}

lapse_status_t lapse__broker_consume_next(lapse__broker_t *broker, lapse__frames_t *raw,
                                          int64_t timeout_ms, size_t keep,
                                          lapse__inbound_t *in, bool *got,
                                          lapse_error_t *err) {
    *got = false;
    memset(in, 0, sizeof *in);
    /* The last delivery's frames (and its decoded properties) are done with. */
    amqp_maybe_release_buffers(broker->conn);
    recycle_amqp_pool(&broker->props_pool);
    if (timeout_ms < 0) {
        timeout_ms = 0;
    }
    struct timeval tv = {.tv_sec = timeout_ms / 1000,
                         .tv_usec = (suseconds_t)((timeout_ms % 1000) * 1000)};
    amqp_frame_t frame;
    int st = amqp_simple_wait_frame_noblock(broker->conn, &frame, &tv);
    if (st == AMQP_STATUS_TIMEOUT) {
        return LAPSE_OK;
    }
    if (st != AMQP_STATUS_OK) {
        broker->open = false;
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "consume: %s",
                               amqp_error_string2(st));
    }
    if (frame.frame_type != AMQP_FRAME_METHOD) {
        return LAPSE_OK; /* heartbeats are answered inside rabbitmq-c */
    }
    if (frame.payload.method.id != AMQP_BASIC_DELIVER_METHOD) {
        return handle_method(broker, &frame, err);
    }
    const amqp_basic_deliver_t *m = frame.payload.method.decoded;
    in->delivery_tag = m->delivery_tag;
    in->redelivered = m->redelivered != 0;
    size_t mark = raw->n;
    lapse_status_t rc = read_content(broker, frame.channel, raw, keep, in, err);
    if (rc != LAPSE_OK) {
        raw->n = mark;
        memset(in, 0, sizeof *in);
        return rc;
    }
    *got = true;
    return LAPSE_OK;
}

lapse_status_t lapse__broker_ack(lapse__broker_t *broker, uint64_t tag, bool multiple,
                                 lapse_error_t *err) {
    int st = amqp_basic_ack(broker->conn, LAPSE__CHANNEL, tag, multiple ? 1 : 0);
    if (st != AMQP_STATUS_OK) {
        broker->open = false;
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "ack: %s",
                               amqp_error_string2(st));
    }
    return LAPSE_OK;
}

lapse_status_t lapse__broker_nack(lapse__broker_t *broker, uint64_t tag,
                                  lapse_error_t *err) {
    int st = amqp_basic_nack(broker->conn, LAPSE__CHANNEL, tag, 0, 1);
    if (st != AMQP_STATUS_OK) {
        broker->open = false;
        return lapse_error_set(err, LAPSE_ERR_BROKER_CLOSED, "nack: %s",
                               amqp_error_string2(st));
    }
    return LAPSE_OK;
}

void lapse__broker_set_rpc_timeout(lapse__broker_t *broker, int64_t timeout_ms) {
    if (timeout_ms < 1) {
        timeout_ms = 1;
    }
    struct timeval tv = {.tv_sec = timeout_ms / 1000,
                         .tv_usec = (suseconds_t)((timeout_ms % 1000) * 1000)};
    amqp_set_rpc_timeout(broker->conn, &tv);
}

lapse_status_t lapse__broker_declare_private(lapse__broker_t *broker,
                                             const amqp_table_t *args, char *name,
                                             size_t cap, lapse_error_t *err) {
    amqp_queue_declare_ok_t *ok =
        amqp_queue_declare(broker->conn, LAPSE__CHANNEL, amqp_empty_bytes, 0, 0, 1, 1,
                           args ? *args : amqp_empty_table);
    lapse_status_t rc = lapse__broker_reply(broker, amqp_get_rpc_reply(broker->conn),
                                            "queue.declare", err);
    if (rc == LAPSE_OK && ok) {
        lapse__bytes_to_str(ok->queue, name, cap);
    }
    return rc;
}

lapse_status_t lapse__broker_declare_transient_direct(lapse__broker_t *broker,
                                                      const char *exchange,
                                                      lapse_error_t *err) {
    amqp_exchange_declare(broker->conn, LAPSE__CHANNEL, amqp_cstring_bytes(exchange),
                          amqp_cstring_bytes("direct"), 0, 0, 0, 0, amqp_empty_table);
    return lapse__broker_reply(broker, amqp_get_rpc_reply(broker->conn),
                               "exchange.declare", err);
}

lapse_status_t lapse__broker_bind(lapse__broker_t *broker, const char *queue,
                                  const char *exchange, const char *key,
                                  lapse_error_t *err) {
    amqp_queue_bind(broker->conn, LAPSE__CHANNEL, amqp_cstring_bytes(queue),
                    amqp_cstring_bytes(exchange), amqp_cstring_bytes(key),
                    amqp_empty_table);
    return lapse__broker_reply(broker, amqp_get_rpc_reply(broker->conn), "queue.bind",
                               err);
}

lapse_status_t lapse__broker_get(lapse__broker_t *broker, const char *queue,
                                 amqp_message_t *msg, bool *got, lapse_error_t *err) {
    *got = false;
    amqp_rpc_reply_t r =
        amqp_basic_get(broker->conn, LAPSE__CHANNEL, amqp_cstring_bytes(queue), 1);
    lapse_status_t rc = lapse__broker_reply(broker, r, "basic.get", err);
    if (rc != LAPSE_OK || r.reply.id != AMQP_BASIC_GET_OK_METHOD) {
        return rc; /* get-empty: nothing there yet */
    }
    rc = lapse__broker_reply(broker,
                             amqp_read_message(broker->conn, LAPSE__CHANNEL, msg, 0),
                             "basic.get", err);
    *got = rc == LAPSE_OK;
    return rc;
}

void lapse__broker_message_clear(amqp_message_t *msg) {
    amqp_destroy_message(msg);
}

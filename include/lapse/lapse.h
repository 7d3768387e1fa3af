/* SPDX-License-Identifier: MIT
 * lapse: cancel unpaid orders when their payment window lapses. */
#ifndef LAPSE_LAPSE_H
#define LAPSE_LAPSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <lapse/version.h>

#if defined(__GNUC__)
#define LAPSE_API __attribute__((visibility("default")))
#else
#define LAPSE_API
#endif

/** The library's version, "X.Y.Z" (LAPSE_VERSION of the build that made it: compare it
 *  with the LAPSE_VERSION a program was compiled with); static. */
LAPSE_API const char *lapse_version(void);

/* Status codes, defined once. Ranges say which subsystem failed:
 * -0x00xx general, -0x01xx broker, -0x02xx store, -0x03xx message, -0x04xx config.
 * X(name, value, retriable, message) */
#define LAPSE_STATUS_MAP(X)                                                              \
    X(OK, 0, 0, "success")                                                               \
    X(ERR_NOMEM, -0x0001, 0, "out of memory")                                            \
    X(ERR_INVALID, -0x0002, 0, "invalid argument")                                       \
    X(ERR_IO, -0x0003, 0, "input/output error")                                          \
    X(ERR_STOPPED, -0x0004, 0, "stopped by request")                                     \
    X(ERR_BROKER_CONNECT, -0x0101, 1, "cannot connect to the broker")                    \
    X(ERR_BROKER_CLOSED, -0x0102, 1, "the broker closed the channel or connection")      \
    X(ERR_BROKER_NACK, -0x0103, 1, "the broker refused (nacked) a publish")              \
    X(ERR_BROKER_RETURNED, -0x0104, 0, "the broker returned an unroutable publish")      \
    X(ERR_BROKER_TIMEOUT, -0x0105, 1, "timed out waiting for the broker")                \
    X(ERR_BROKER_PROTOCOL, -0x0106, 1, "unexpected frame from the broker")               \
    X(ERR_BROKER_LOGIN, -0x0107, 0, "the broker refused the login")                      \
    X(ERR_BROKER_TLS, -0x0108, 0, "TLS failed: a certificate or the handshake")          \
    X(ERR_STORE_OPEN, -0x0201, 0, "cannot open the order store")                         \
    X(ERR_STORE_BUSY, -0x0202, 1, "the order store is busy or locked")                   \
    X(ERR_STORE_SQL, -0x0203, 0, "order store statement failed")                         \
    X(ERR_STORE_NOT_FOUND, -0x0204, 0, "no such order")                                  \
    X(ERR_STORE_CONFLICT, -0x0205, 0, "order exists with another deadline")              \
    X(ERR_STORE_STATE, -0x0206, 0, "refused by the order's state")                       \
    X(ERR_STORE_LAPSED, -0x0207, 0, "the order's payment window has lapsed")             \
    X(ERR_STORE_MISSING, -0x0208, 0, "store not found")                                  \
    X(ERR_MSG_JSON, -0x0301, 0, "message body is not a JSON object")                     \
    X(ERR_MSG_FIELD, -0x0302, 0, "message field missing or of the wrong type")           \
    X(ERR_MSG_VERSION, -0x0303, 0, "unsupported message version")                        \
    X(ERR_MSG_ORDER_ID, -0x0304, 0, "invalid order id")                                  \
    X(ERR_MSG_TIME, -0x0305, 0, "invalid timestamp")                                     \
    X(ERR_MSG_TOO_LARGE, -0x0306, 0, "message body too large")                           \
    X(ERR_MSG_UTF8, -0x0307, 0, "message body is not valid UTF-8")                       \
    X(ERR_CONFIG_URL, -0x0401, 0, "invalid AMQP URL")                                    \
    X(ERR_CONFIG_DURATION, -0x0402, 0, "invalid duration")                               \
    X(ERR_CONFIG_CLASS, -0x0403, 0, "invalid class list")                                \
    X(ERR_CONFIG_PREFIX, -0x0404, 0, "invalid prefix")                                   \
    X(ERR_CONFIG_STORE, -0x0405, 0, "invalid store URI")                                 \
    X(ERR_CONFIG_UNKNOWN, -0x0406, 0, "unknown configuration property")                  \
    X(ERR_CONFIG_VALUE, -0x0407, 0, "invalid configuration value")                       \
    X(ERR_CONFIG_MAP, -0x0408, 0, "invalid orders map")

typedef enum lapse_status {
#define LAPSE_STATUS_ENUM_(name, value, retriable, msg) LAPSE_##name = (value),
    LAPSE_STATUS_MAP(LAPSE_STATUS_ENUM_)
#undef LAPSE_STATUS_ENUM_
} lapse_status_t;

/** Human-readable message; static, never NULL, never to be freed. */
LAPSE_API const char *lapse_strerror(lapse_status_t rc);
/** Symbolic name without prefix ("ERR_STORE_BUSY"); static, never NULL. */
LAPSE_API const char *lapse_status_name(lapse_status_t rc);
/** True when retrying later (with backoff) may succeed. */
LAPSE_API bool lapse_status_is_retriable(lapse_status_t rc);

/** Optional caller-owned detail for a failure (jansson's json_error_t). */
typedef struct lapse_error {
    lapse_status_t code;
    char text[160]; /* reason; empty when code == LAPSE_OK */
} lapse_error_t;

/** Record code and a printf-style reason in err (NULL err is allowed); returns code. */
LAPSE_API lapse_status_t lapse_error_set(lapse_error_t *err, lapse_status_t code,
                                         const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/** Reset err to LAPSE_OK and an empty text (NULL allowed). */
LAPSE_API void lapse_error_clear(lapse_error_t *err);

#endif

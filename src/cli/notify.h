/* SPDX-License-Identifier: MIT
 * The service manager's notifications (systemd's sd_notify): readiness, status, the
 * watchdog and stopping. Nothing is sent when NOTIFY_SOCKET is not set. */
#ifndef LAPSE_CLI_NOTIFY_H
#define LAPSE_CLI_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>

#include <lapse/consumer.h>

typedef struct cli_notify {
    bool on;             /* NOTIFY_SOCKET is set */
    int64_t watchdog_ms; /* WATCHDOG_USEC for this process, in ms; 0: no watchdog */
    int64_t pinged_at;   /* monotonic ms of the last WATCHDOG=1 */
    bool ready;          /* READY=1 sent */
    bool stopping;       /* STOPPING=1 sent */
    char status[200];    /* the last STATUS= sent */
} cli_notify_t;

/** Read NOTIFY_SOCKET and, through sd_watchdog_enabled, WATCHDOG_USEC/WATCHDOG_PID;
 *  libsystemd is loaded only when NOTIFY_SOCKET is set. false, after saying why on
 *  stderr, when it is set and libsystemd cannot be loaded. */
bool cli_notify_init(cli_notify_t *n);

/** STATUS=<text>, sent only when it differs from the last one. */
void cli_notify_status(cli_notify_t *n, const char *text);

/** WATCHDOG=1 when a watchdog is on and half its interval has passed since the last. */
void cli_notify_alive(cli_notify_t *n);

/** STOPPING=1 (once). */
void cli_notify_stopping(cli_notify_t *n);

/** lapse_consumer_state_cb; opaque is a cli_notify_t. Consuming: READY=1 the first
 *  time; every state keeps the watchdog fed (see the README, "Running as a service"). */
void cli_notify_consumer_state(void *opaque, lapse_consumer_state_t state,
                               const char *detail);

#endif

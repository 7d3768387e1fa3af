/* SPDX-License-Identifier: MIT
 * systemd notifications for `lapse consume` (Type=notify units), through libsystemd's
 * sd_notify. Without NOTIFY_SOCKET every function returns at once, and libsystemd is
 * never loaded (src/dynlib.c: it and its compression and crypto libraries stay out of
 * a consumer that no systemd runs).
 *
 * The watchdog is fed while the consume loop turns, whether it is consuming or waiting
 * out a reconnect backoff: a broker outage is not something a restart fixes (the new
 * process would wait for the same broker), and while it lasts the consumer still runs
 * the sweep's direct cancels from the store. What the watchdog catches is a loop that
 * no longer turns. Whether the broker is reachable is the health check's question. */
#include "notify.h"

#include "cli.h"
#include "dynlib_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <time.h>

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#define CLI_SD_SYMS(X, a) X(a, sd_notify) X(a, sd_watchdog_enabled)

static struct { CLI_SD_SYMS(LAPSE__DYNSYM_FIELD, _) } sd;

static const lapse__dynsym_t sd_syms[] = {CLI_SD_SYMS(LAPSE__DYNSYM_ENTRY, sd)};

static lapse__dynlib_t libsystemd = LAPSE__DYNLIB_INIT(LAPSE_LIBSYSTEMD_SONAME, sd_syms);

bool cli_notify_init(cli_notify_t *n) {
    memset(n, 0, sizeof *n);
    const char *socket = getenv("NOTIFY_SOCKET");
    if (socket == NULL || socket[0] == '\0') {
        return true;
    }
    lapse_error_t err = {0};
    if (lapse__dynlib_load(&libsystemd, LAPSE_ERR_IO, &err) != LAPSE_OK) {
        /* A Type=notify unit would wait for a READY=1 that never comes. */
        cli_errorf("NOTIFY_SOCKET is set, but %s", err.text);
        return false;
    }
    n->on = true;
    uint64_t usec = 0;
    /* > 0 only when WATCHDOG_USEC is set and WATCHDOG_PID, if set, is this process. */
    if (sd.sd_watchdog_enabled(0, &usec) > 0) {
        n->watchdog_ms = (int64_t)(usec / 1000);
        n->watchdog_ms = n->watchdog_ms > 0 ? n->watchdog_ms : 1;
    }
    return true;
}

void cli_notify_status(cli_notify_t *n, const char *text) {
    if (!n->on) {
        return;
    }
    /* One line: the text may carry a broker's reply text, and a newline in it would
     * become another assignment (WATCHDOG=1, EXTEND_TIMEOUT_USEC=...) from this pid. */
    char line[sizeof n->status];
    snprintf(line, sizeof line, "%s", text);
    for (char *c = line; *c; c++) {
        if ((unsigned char)*c < 0x20 || *c == 0x7f) {
            *c = ' ';
        }
    }
    if (strcmp(n->status, line) == 0) {
        return;
    }
    memcpy(n->status, line, sizeof line);
    char msg[sizeof n->status + 8];
    snprintf(msg, sizeof msg, "STATUS=%s", n->status);
    sd.sd_notify(0, msg);
}

void cli_notify_alive(cli_notify_t *n) {
    if (!n->on || n->watchdog_ms == 0) {
        return;
    }
    int64_t now = mono_ms();
    if (n->pinged_at != 0 && now - n->pinged_at < n->watchdog_ms / 2) {
        return;
    }
    n->pinged_at = now;
    sd.sd_notify(0, "WATCHDOG=1");
}

void cli_notify_stopping(cli_notify_t *n) {
    if (!n->on || n->stopping) {
        return;
    }
    n->stopping = true;
    snprintf(n->status, sizeof n->status, "stopping: finishing the deliveries in hand");
    sd.sd_notify(0, "STOPPING=1\nSTATUS=stopping: finishing the deliveries in hand");
}

void cli_notify_consumer_state(void *opaque, lapse_consumer_state_t state,
                               const char *detail) {
    cli_notify_t *n = opaque;
    if (!n->on) {
        return;
    }
    char text[sizeof n->status];
    switch (state) {
        case LAPSE_CONSUMER_CONSUMING:
            snprintf(text, sizeof text, "consuming %s", detail);
            if (!n->ready) {
                /* Subscribed: the queue has this consumer now. */
                n->ready = true;
                snprintf(n->status, sizeof n->status, "%s", text);
                char msg[sizeof text + 24];
                snprintf(msg, sizeof msg, "READY=1\nSTATUS=%s", text);
                sd.sd_notify(0, msg);
            }
            cli_notify_status(n, text);
            break;
        case LAPSE_CONSUMER_CONNECTING:
            snprintf(text, sizeof text, "%s%s",
                     detail[0] ? "reconnecting: " : "connecting", detail);
            cli_notify_status(n, text);
            break;
        case LAPSE_CONSUMER_STOPPING:
            cli_notify_stopping(n);
            return;
    }
    cli_notify_alive(n);
}

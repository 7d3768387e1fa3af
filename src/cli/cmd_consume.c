/* SPDX-License-Identifier: MIT
 * lapse consume: the long-running consumer service. */
#include "cli.h"

#include <lapse/consumer.h>

#include "backoff_int.h"
#include "config_int.h"
#include "consumer_int.h"
#include "metrics_http.h"
#include "notify.h"

#include <stdio.h>

/* The store, waited for while it is out of reach (a database server that is down or
 * restarting): a service that exits then would only be restarted into the same
 * failure. Anything else (a wrong URI or password, a newer schema) fails at once. */
static lapse_store_t *open_store_waiting(cli_t *cli, const volatile sig_atomic_t *stop,
                                         cli_notify_t *notify, int *code) {
    for (unsigned attempt = 0;; attempt++) {
        lapse_status_t rc;
        lapse_error_t err = {0};
        lapse_store_t *store = cli_try_store(cli, 0, &rc, &err);
        if (store == NULL && rc == LAPSE_ERR_STORE_BUSY && *stop) {
            cli_notify_stopping(notify);
            *code = CLI_EXIT_OK; /* SIGTERM while the file was locked: a clean stop */
            return NULL;
        }
        if (store != NULL || rc != LAPSE_ERR_STORE_BUSY) {
            if (store == NULL) {
                *code = cli_fail(rc, &err, "open store");
            }
            return store;
        }
        int64_t wait = lapse__backoff_ms(attempt, 1000, 30000);
        /* Waiting is this loop turning: the watchdog stays fed (notify.c). */
        char status[200];
        snprintf(status, sizeof status, "waiting for the store: %s", err.text);
        cli_notify_status(notify, status);
        cli_notify_alive(notify);
        lapse__log(cli->cfg, LAPSE_LOG_WARN,
                   "event=store_unavailable attempt=%u retry_in_ms=%lld reason=\"%s\"",
                   attempt + 1, (long long)wait, err.text);
        if (!lapse__sleep_ms(wait, stop)) {
            cli_notify_stopping(notify);
            *code = CLI_EXIT_OK; /* SIGTERM while waiting: a clean stop */
            return NULL;
        }
    }
}

int cmd_consume(cli_t *cli, int argc, char **argv) {
    /* Its options are settings (--prefetch, --max-attempts, --sweep-every, --grace,
     * --in-flight), already in cli->cfg. */
    if (argc != 0) {
        return cli_usage_error("consume", "unexpected argument '%s'", argv[0]);
    }
    volatile sig_atomic_t *stop = cli_install_stop_handlers();
    /* Under systemd (Type=notify): READY=1 once subscribed, the watchdog, STOPPING=1. */
    cli_notify_t notify;
    if (!cli_notify_init(&notify)) {
        return CLI_EXIT_FAILED;
    }
    int code = CLI_EXIT_OK;
    cli_metrics_t *metrics = cli_metrics_start(cli, &code); /* --metrics-listen */
    lapse_store_t *store =
        code == CLI_EXIT_OK ? open_store_waiting(cli, stop, &notify, &code) : NULL;
    if (!store) {
        cli_metrics_stop(metrics);
        return code;
    }
    lapse_status_t rc;
    lapse_error_t err = {0};
    lapse_consumer_t *consumer = lapse_consumer_new(cli->cfg, store, &rc, &err);
    if (consumer) {
        lapse_consumer_set_state_cb(consumer, cli_notify_consumer_state, &notify);
        lapse__consumer_set_metrics(consumer, cli_metrics_registry(metrics));
        rc = lapse_consumer_run(consumer, stop, &err);
    }
    if (rc != LAPSE_OK) {
        code = cli_fail(rc, &err, "consume");
        if (code == CLI_EXIT_USAGE) {
            code = CLI_EXIT_FAILED;
        }
    }
    lapse_consumer_free(consumer);
    lapse_store_close(store);
    cli_metrics_stop(metrics);
    return code;
}

/* SPDX-License-Identifier: MIT
 * lapse consume: the long-running consumer service. */
#include "cli.h"

#include <lapse/consumer.h>

int cmd_consume(cli_t *cli, int argc, char **argv) {
    /* Its options are settings (--prefetch, --max-attempts, --sweep-every, --grace,
     * --in-flight), already in cli->cfg. */
    if (argc != 0) {
        return cli_usage_error("consume", "unexpected argument '%s'", argv[0]);
    }
    volatile sig_atomic_t *stop = cli_install_stop_handlers();
    int code = CLI_EXIT_OK;
    lapse_store_t *store = cli_open_store(cli, 0, &code);
    if (!store) {
        return code;
    }
    lapse_status_t rc;
    lapse_error_t err = {0};
    lapse_consumer_t *consumer = lapse_consumer_new(cli->cfg, store, &rc, &err);
    if (consumer) {
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
    return code;
}

/* SPDX-License-Identifier: MIT
 * lapse consume: the long-running consumer service. */
#include "cli.h"

#include <lapse/consumer.h>

#include <getopt.h>
#include <stdlib.h>

static const char usage[] =
    "usage: lapse consume [--prefetch N] [--max-attempts N] [--sweep-every D] "
    "[--grace D]\n"
    "  --prefetch N      deliveries in flight (default 1000); batches hold up to half\n"
    "  --max-attempts N  a delivery whose cancel keeps failing (store errors) is "
    "retried\n"
    "                    with a growing delay (1 s, 2 s, 4 s, ... at most 5 min) and\n"
    "                    parked after N attempts (default 10)\n"
    "  --sweep-every D   at start and then every D (default 60s; 0 = never): publish\n"
    "                    again orders never confirmed, and cancel directly orders still\n"
    "                    pending --grace after their deadline (their message was lost)\n"
    "  --grace D         see --sweep-every (default 60s); keep it above any clock\n"
    "                    difference between hosts\n"
    "Runs until SIGINT/SIGTERM: then finishes and acks what it holds and exits 0.\n"
    "Logs one key=value line per decision to stderr.\n";

int cmd_consume(cli_t *cli, int argc, char **argv) {
    /* Each option sets the config property of the same meaning. */
    static const struct option opts[] = {{"prefetch", required_argument, NULL, 'p'},
                                         {"max-attempts", required_argument, NULL, 'm'},
                                         {"sweep-every", required_argument, NULL, 's'},
                                         {"grace", required_argument, NULL, 'g'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (opt == 'h') {
            fputs(usage, stdout);
            return CLI_EXIT_OK;
        }
        static const char *const properties[][3] = {
            {"p", "prefetch", "--prefetch"},
            {"m", "max_attempts", "--max-attempts"},
            {"s", "sweep_every", "--sweep-every"},
            {"g", "sweep_grace", "--grace"}};
        const char *property = NULL;
        const char *flag = NULL;
        for (size_t i = 0; i < sizeof properties / sizeof properties[0]; i++) {
            if (opt == properties[i][0][0]) {
                property = properties[i][1];
                flag = properties[i][2];
            }
        }
        if (!property) {
            return cli_usage_error("consume", "unknown or incomplete option '%s'",
                                   argv[optind - 1]);
        }
        lapse_error_t err = {0};
        if (lapse_config_set(cli->cfg, property, optarg, &err) != LAPSE_OK) {
            return cli_usage_error("consume", "%s: %s", flag, err.text);
        }
    }
    if (optind != argc) {
        return cli_usage_error("consume", "unexpected argument '%s'", argv[optind]);
    }
    volatile sig_atomic_t *stop = cli_install_stop_handlers();
    int code = CLI_EXIT_OK;
    lapse_store_t *store = cli_open_store(cli, &code);
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

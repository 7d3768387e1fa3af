/* SPDX-License-Identifier: MIT
 * lapse topology declare|export. */
#include "cli.h"

#include <lapse/topology.h>

#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: lapse topology declare   declare exchanges, queues and bindings "
    "(idempotent)\n"
    "       lapse topology export    print them as RabbitMQ definitions JSON\n";

int cmd_topology(cli_t *cli, int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(usage, stdout);
        return CLI_EXIT_OK;
    }
    if (argc != 2) {
        return cli_usage_error("topology", "expected 'declare' or 'export'");
    }
    if (strcmp(argv[1], "export") == 0) {
        char *json = lapse_topology_export(cli->cfg);
        if (!json) {
            fprintf(stderr, "lapse topology: out of memory\n");
            return CLI_EXIT_FAILED;
        }
        puts(json);
        free(json);
        return CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "declare") == 0) {
        lapse_error_t err = {0};
        lapse_status_t rc = lapse_topology_declare(cli->cfg, &err);
        if (rc != LAPSE_OK) {
            int code = cli_fail(rc, &err, "topology declare");
            return code == CLI_EXIT_USAGE ? CLI_EXIT_FAILED : code;
        }
        printf("declared topology prefix=%s classes=%s\n",
               lapse_config_get(cli->cfg, "prefix"),
               lapse_config_get(cli->cfg, "classes"));
        return CLI_EXIT_OK;
    }
    return cli_usage_error("topology", "unknown action '%s'", argv[1]);
}

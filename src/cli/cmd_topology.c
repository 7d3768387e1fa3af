/* SPDX-License-Identifier: MIT
 * lapse topology declare|export. */
#include "cli.h"

#include <lapse/topology.h>

#include <stdlib.h>
#include <string.h>

int cmd_topology(cli_t *cli, int argc, char **argv) {
    if (argc != 1) {
        return cli_usage_error("topology", "expected 'declare' or 'export'");
    }
    if (cli_opt(cli, CLI_OPT_ROLES) && strcmp(argv[0], "export") != 0) {
        return cli_usage_error("topology", "--roles goes with 'export'");
    }
    if (strcmp(argv[0], "export") == 0) {
        char *json = cli_opt(cli, CLI_OPT_ROLES) ? lapse_roles_export(cli->cfg)
                                                 : lapse_topology_export(cli->cfg);
        if (!json) {
            fprintf(stderr, "lapse topology: out of memory\n");
            return CLI_EXIT_FAILED;
        }
        puts(json);
        free(json);
        return CLI_EXIT_OK;
    }
    if (strcmp(argv[0], "declare") == 0) {
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
    return cli_usage_error("topology", "unknown action '%s'", argv[0]);
}

/* SPDX-License-Identifier: MIT
 * lapse config: every setting in effect and where it came from (flag, variable,
 * default), passwords hidden. */
#include "cli.h"

#include <jansson.h>
#include <stdlib.h>

int cmd_config(cli_t *cli, int argc, char **argv) {
    if (argc > 0) {
        return cli_usage_error("config", "unexpected argument '%s'", argv[0]);
    }
    bool as_json = cli_opt(cli, CLI_OPT_JSON) != NULL;
    json_t *root = as_json ? json_object() : NULL;
    for (size_t i = 0; i < cli_n_options; i++) {
        const cli_option_t *opt = &cli_options[i];
        if (!opt->property || (opt->flags & CLI_HIDDEN)) {
            continue;
        }
        char value[1200];
        cli_redact(lapse_config_get(cli->cfg, opt->property), value, sizeof value);
        char flag[48];
        snprintf(flag, sizeof flag, "--%s", opt->name);
        const char *from = cli->from[i] == CLI_FROM_FLAG ? flag
                           : cli->from[i]                ? cli->from[i]
                                                         : "default";
        if (as_json) {
            json_object_set_new(root, opt->name,
                                json_pack("{s:s, s:s}", "value", value, "from", from));
        } else {
            printf("%-20s %-44s %s\n", flag, value, from);
        }
    }
    if (as_json) {
        char *text = json_dumps(root, JSON_COMPACT);
        json_decref(root);
        if (!text) {
            cli_errorf("config: out of memory");
            return CLI_EXIT_FAILED;
        }
        puts(text);
        free(text);
    }
    return CLI_EXIT_OK;
}

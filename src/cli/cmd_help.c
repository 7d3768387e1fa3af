/* SPDX-License-Identifier: MIT
 * lapse help [COMMAND [ACTION]]: the texts of --help, and (hidden) the README's
 * reference and the man page. */
#include "cli.h"

int cmd_help(cli_t *cli, int argc, char **argv) {
    bool markdown = cli_opt(cli, CLI_OPT_MARKDOWN) != NULL;
    bool man = cli_opt(cli, CLI_OPT_MAN) != NULL;
    if (markdown && man) {
        return cli_usage_error("help", "--markdown and --man exclude each other");
    }
    if (markdown || man) {
        if (argc > 0) {
            return cli_usage_error("help", "%s takes no COMMAND",
                                   markdown ? "--markdown" : "--man");
        }
        (markdown ? cli_help_markdown : cli_help_man)(stdout);
        return CLI_EXIT_OK;
    }
    if (argc == 0) {
        cli_help_top(stdout);
        return CLI_EXIT_OK;
    }
    const char *name = argv[0];
    bool actions = cli_command_has_actions(name);
    if (actions && argc == 1) {
        cli_help_group(stdout, name);
        return CLI_EXIT_OK;
    }
    const cli_command_t *c = cli_command_find(name, actions ? argv[1] : NULL);
    if (!c) {
        return actions ? cli_usage_error("help", "unknown action '%s %s'", name, argv[1])
                       : cli_usage_error("help", "unknown command '%s'", name);
    }
    if (argc > (actions ? 2 : 1)) {
        return cli_usage_error("help", "unexpected argument '%s'", argv[actions ? 2 : 1]);
    }
    cli_help_command(stdout, c);
    return CLI_EXIT_OK;
}

/* SPDX-License-Identifier: MIT
 * The command line, parsed once for every command from the option table: getopt_long
 * over the whole argv, so options may stand before or after the command; then each
 * option is checked against the command, and settings are applied (variable, then flag).
 * No error names more of an unknown option than its name, nor repeats the value of an
 * option that may hold a password. */
#include "cli.h"
#include "config_int.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

const char CLI_FROM_FLAG[] = "flag";

/* getopt_long's val for row i: above every short option letter. */
#define LONG_VAL(i) (256 + (int)(i))

/* One struct option per distinct name (rows that share a name share the flag), and the
 * short letters. "-" first: getopt_long hands over positional arguments in place, in
 * order (as val 1), whatever POSIXLY_CORRECT says, so an option after the command is
 * parsed like one before it. ":" next: a missing value is ':' rather than '?'. */
static void build_getopt(struct option *longopts, char *shortopts, size_t scap) {
    size_t n = 0;
    size_t s = 0;
    shortopts[s++] = '-';
    shortopts[s++] = ':';
    for (size_t i = 0; i < cli_n_options; i++) {
        const cli_option_t *opt = &cli_options[i];
        if (cli_option_find(opt->name, CLI_CMD_COUNT_) != opt) {
            continue; /* a later row of a name already there */
        }
        longopts[n++] = (struct option){
            opt->name, opt->metavar ? required_argument : no_argument, NULL, LONG_VAL(i)};
        if (opt->short_name && s + 3 < scap) {
            shortopts[s++] = opt->short_name;
            if (opt->metavar) {
                shortopts[s++] = ':';
            }
        }
    }
    longopts[n] = (struct option){NULL, 0, NULL, 0};
    shortopts[s] = '\0';
}

/* The row getopt_long's val stands for (the first of its name), or NULL. */
static const cli_option_t *row_of(int val) {
    if (val >= LONG_VAL(0) && val < LONG_VAL(cli_n_options)) {
        return &cli_options[val - LONG_VAL(0)];
    }
    for (size_t i = 0; val > 0 && i < cli_n_options; i++) {
        if (cli_options[i].short_name == val) {
            return &cli_options[i];
        }
    }
    return NULL;
}

static size_t row_index(const cli_option_t *opt) {
    return (size_t)(opt - cli_options);
}

/* The error text of a setting's value: a secret-bearing option's value is never shown,
 * even if the config library put it in its text. */
static const char *safe_text(const cli_option_t *opt, const char *value,
                             const lapse_error_t *err, lapse_status_t rc) {
    if ((opt->flags & CLI_SECRET) && value[0] && strstr(err->text, value)) {
        return lapse_strerror(rc);
    }
    return err->text[0] ? err->text : lapse_strerror(rc);
}

/* Apply, for every setting cmd takes, its variable (when its flag was not given), then
 * the flags in the order given. A bad variable behind a flag is never read. */
static int apply_settings(cli_t *cli, const cli_given_t *settings, size_t n) {
    bool flagged[CLI_MAX_OPTIONS] = {false};
    for (size_t i = 0; i < n; i++) {
        flagged[row_index(settings[i].opt)] = true;
    }
    lapse_error_t err;
    for (size_t i = 0; i < cli_n_options; i++) {
        const cli_option_t *opt = &cli_options[i];
        const char *env = opt->property ? lapse_config_property_env(opt->property) : NULL;
        if (!env || flagged[i] || !cli_option_accepts(opt, cli->command->cmd)) {
            continue;
        }
        const char *value = getenv(env);
        if (!value || !value[0]) {
            continue; /* an empty variable counts as unset, as compose files make them */
        }
        lapse_status_t rc = lapse_config_set(cli->cfg, opt->property, value, &err);
        if (rc != LAPSE_OK) {
            cli_errorf("%s: %s", env, safe_text(opt, value, &err, rc));
            return CLI_EXIT_USAGE;
        }
        cli->from[i] = env;
    }
    for (size_t i = 0; i < n; i++) {
        const cli_option_t *opt = settings[i].opt;
        lapse_status_t rc =
            lapse_config_set(cli->cfg, opt->property, settings[i].value, &err);
        if (rc != LAPSE_OK) {
            return cli_usage_error(cli->label, "--%s: %s", opt->name,
                                   safe_text(opt, settings[i].value, &err, rc));
        }
        cli->from[row_index(opt)] = CLI_FROM_FLAG;
    }
    /* Settings that only work together are a usage error before anything connects;
     * `config` still shows them, which is how one finds the odd one out. */
    if (cli->command->cmd != CLI_CMD_CONFIG &&
        lapse__config_check_tls(cli->cfg, &err) != LAPSE_OK) {
        return cli_usage_error(cli->label, "%s", err.text);
    }
    return CLI_RUN;
}

/* "expected 'list' or 'replay'", from the table. */
static int expected_action(const char *name) {
    char list[128] = "";
    size_t used = 0;
    for (size_t i = 0; i < cli_n_commands; i++) {
        if (strcmp(cli_commands[i].name, name) == 0 && cli_commands[i].action) {
            int n = snprintf(list + used, sizeof list - used, "%s'%s'",
                             used ? " or " : "", cli_commands[i].action);
            used += n > 0 ? (size_t)n : 0;
        }
    }
    return cli_usage_error(name, "expected %s", list);
}

/* Which command pos names (one word, or two for a command with actions). NULL after
 * printing help or an error, with *code set. */
static const cli_command_t *resolve(char **pos, int n_pos, bool help, int *words,
                                    int *code) {
    const char *name = pos[0];
    *code = CLI_EXIT_USAGE;
    if (!cli_command_has_actions(name)) {
        const cli_command_t *c = cli_command_find(name, NULL);
        if (!c) {
            cli_usage_error(NULL, "unknown command '%s'", name);
        }
        *words = 1;
        return c;
    }
    const cli_command_t *c = n_pos > 1 ? cli_command_find(name, pos[1]) : NULL;
    if (c) {
        *words = 2;
        return c;
    }
    if (help) {
        cli_help_group(stdout, name);
        *code = CLI_EXIT_OK;
    } else if (n_pos < 2) {
        expected_action(name);
    } else {
        cli_usage_error(name, "unknown action '%s'", pos[1]);
    }
    return NULL;
}

int cli_parse(cli_t *cli, int argc, char **argv, int *n_pos, char ***pos_out) {
    static struct option longopts[CLI_MAX_OPTIONS + 1];
    static char shortopts[2 * CLI_MAX_OPTIONS + 4];
    build_getopt(longopts, shortopts, sizeof shortopts);

    char **pos = calloc((size_t)argc + 1, sizeof *pos);
    cli_given_t *given = calloc((size_t)argc + 1, sizeof *given);
    if (!pos || !given) {
        free(pos);
        free(given);
        cli_errorf("out of memory");
        return CLI_EXIT_FAILED;
    }
    int n = 0;
    size_t n_given = 0;
    bool help = false, version = false;
    /* The command, once its name has gone by, so an error after it can name it. */
    const char *context = NULL;
    int code = CLI_RUN;
    opterr = 0;
    optind = 0; /* glibc: start afresh */
    int c;
    while (code == CLI_RUN &&
           (c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        const cli_option_t *opt = row_of(c == '?' || c == ':' ? optopt : c);
        if (c == 1) {
            pos[n++] = optarg;
            if (n == 1 && cli_command_find(optarg, NULL)) {
                context = optarg;
            }
        } else if (c == ':' && opt) {
            code = cli_usage_error(context, "option '--%s' needs a value", opt->name);
        } else if (c == '?' && opt && optopt >= LONG_VAL(0)) {
            /* A known long switch given "=value". */
            code = cli_usage_error(context, "option '--%s' takes no value", opt->name);
        } else if (c == '?' && optopt > 0) {
            code = cli_usage_error(context, "unknown option '-%c'", optopt);
        } else if (c == '?') {
            /* An unknown (or ambiguous) long option: its name only, never what follows
             * '=' (`--amqp-url=amqp://user:secret@host/`). */
            const char *arg = argv[optind - 1];
            code = cli_usage_error(context, "unknown option '%.*s'",
                                   (int)strcspn(arg, "="), arg);
        } else if (opt && opt->id == CLI_OPT_HELP) {
            help = true;
        } else if (opt && opt->id == CLI_OPT_VERSION) {
            version = true;
        } else if (opt) {
            given[n_given++] = (cli_given_t){opt, optarg ? optarg : ""};
        }
    }
    /* After "--": positional arguments only. */
    while (code == CLI_RUN && optind < argc) {
        pos[n++] = argv[optind++];
    }
    if (code == CLI_RUN && version && !help) {
        printf("lapse %s\n", lapse_version());
        code = CLI_EXIT_OK;
    } else if (code == CLI_RUN && n == 0) {
        if (help) {
            cli_help_top(stdout);
            code = CLI_EXIT_OK;
        } else {
            code = cli_usage_error(NULL, "no command given");
        }
    }
    int words = 0;
    if (code == CLI_RUN &&
        (cli->command = resolve(pos, n, help, &words, &code)) != NULL) {
        cli_command_label(cli->command, cli->label, sizeof cli->label);
        code = CLI_RUN;
        if (help) {
            cli_help_command(stdout, cli->command);
            code = CLI_EXIT_OK;
        }
    }
    /* Each option as the command knows it (rows may share a name); settings apart. */
    cli_given_t *settings = calloc(n_given + 1, sizeof *settings);
    size_t n_settings = 0, n_local = 0;
    if (!settings && code == CLI_RUN) {
        cli_errorf("out of memory");
        code = CLI_EXIT_FAILED;
    }
    for (size_t i = 0; code == CLI_RUN && i < n_given; i++) {
        const cli_option_t *opt = cli_option_find(given[i].opt->name, cli->command->cmd);
        if (!opt) {
            code =
                cli_usage_error(cli->label, "option '--%s' does not apply to 'lapse %s'",
                                given[i].opt->name, cli->label);
        } else if (opt->property) {
            settings[n_settings++] = (cli_given_t){opt, given[i].value};
        } else {
            given[n_local++] = (cli_given_t){opt, given[i].value};
        }
    }
    /* `lapse help` reads no setting, so a bad variable does not keep it from helping. */
    if (code == CLI_RUN && cli->command->cmd != CLI_CMD_HELP) {
        code = apply_settings(cli, settings, n_settings);
    }
    free(settings);
    if (code != CLI_RUN) {
        free(pos);
        free(given);
        return code;
    }
    cli->given = given;
    cli->n_given = n_local;
    /* The command's own words are not its arguments. */
    memmove(pos, pos + words, (size_t)(n - words + 1) * sizeof *pos);
    *n_pos = n - words;
    *pos_out = pos;
    return CLI_RUN;
}

const char *cli_opt(const cli_t *cli, cli_opt_id_t id) {
    const char *value = NULL;
    for (size_t i = 0; i < cli->n_given; i++) {
        if (cli->given[i].opt->id == id) {
            value = cli->given[i].value;
        }
    }
    return value;
}

size_t cli_opt_all(const cli_t *cli, cli_opt_id_t id, const char **values, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; i < cli->n_given; i++) {
        if (cli->given[i].opt->id == id) {
            if (n < cap) {
                values[n] = cli->given[i].value;
            }
            n++;
        }
    }
    return n;
}

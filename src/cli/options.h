/* SPDX-License-Identifier: MIT
 * The one table of the command line: every command and every option, from which the
 * parser, the help texts, the environment list and the README's reference are made. */
#ifndef LAPSE_CLI_OPTIONS_H
#define LAPSE_CLI_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef enum cli_cmd {
    CLI_CMD_PUBLISH,
    CLI_CMD_PAY,
    CLI_CMD_CONSUME,
    CLI_CMD_STATUS,
    CLI_CMD_PENDING,
    CLI_CMD_SWEEP,
    CLI_CMD_RECONCILE,
    CLI_CMD_PARKED_LIST,
    CLI_CMD_PARKED_REPLAY,
    CLI_CMD_TOPOLOGY,
    CLI_CMD_DEMO,
    CLI_CMD_CONFIG,
    CLI_CMD_HELP,
    CLI_CMD_HEALTH,
    CLI_CMD_COUNT_
} cli_cmd_t;

/* Which commands accept an option: a set of CLI_IN() bits, or CLI_GLOBAL. */
#define CLI_IN(cmd) (1u << (cmd))
#define CLI_GLOBAL  ((1u << CLI_CMD_COUNT_) - 1)

/* What a command-local option means to the command that reads it (cli_opt()). Options
 * that set a configuration property are CLI_OPT_SETTING: commands read the config. */
typedef enum cli_opt_id {
    CLI_OPT_SETTING = 0,
    CLI_OPT_HELP,
    CLI_OPT_VERSION,
    CLI_OPT_JSON,
    CLI_OPT_LIMIT,
    CLI_OPT_DUE_BEFORE,
    CLI_OPT_DRY_RUN,
    CLI_OPT_TIMEOUT,
    CLI_OPT_DEADLINE,
    CLI_OPT_HOLD,
    CLI_OPT_BATCH,
    CLI_OPT_ALL,
    CLI_OPT_MARKDOWN,
    CLI_OPT_ROLES,
    CLI_OPT_MAN
} cli_opt_id_t;

enum {
    CLI_SECRET = 1u << 0, /* the value may hold a password: never echoed */
    CLI_REPEAT = 1u << 1, /* may be given more than once; each value counts */
    CLI_HIDDEN = 1u << 3  /* an internal switch, left out of every help text */
};

typedef struct cli_option {
    const char *name;     /* the long flag without "--" */
    char short_name;      /* 0: none */
    const char *metavar;  /* NULL: a switch that takes no value */
    const char *property; /* config property it sets (its variable and default come from
                             the config library); NULL: command-local, see id */
    cli_opt_id_t id;
    const char *def; /* default of a command-local option, for the help; NULL: none */
    const char
        *example;      /* a valid value other than the default (settings): docs, tests */
    unsigned commands; /* CLI_IN() bits, or CLI_GLOBAL */
    unsigned flags;    /* CLI_SECRET, CLI_REPEAT, CLI_HIDDEN */
    const char *help;
} cli_option_t;

typedef struct cli_command {
    cli_cmd_t cmd;
    const char *name;    /* "parked" */
    const char *action;  /* "list": the second word; NULL for a one-word command */
    const char *args;    /* positional arguments for the synopsis, "" when none */
    const char *summary; /* one line for the command list */
    const char *about;   /* the command's help, before its options */
} cli_command_t;

/** The tables; static. cli_options rows that share a name share id and metavar and
 *  accept disjoint sets of commands (checked by test_cli_options). */
extern const cli_option_t cli_options[];
extern const size_t cli_n_options;
extern const cli_command_t cli_commands[];
extern const size_t cli_n_commands;

/** The longest table, for callers that keep something per option. */
#define CLI_MAX_OPTIONS 64

/** True when opt may be given to cmd. */
bool cli_option_accepts(const cli_option_t *opt, cli_cmd_t cmd);

/** The row named name (without "--") that cmd accepts; else the first row of that name
 *  when cmd is CLI_CMD_COUNT_ (any command); NULL when none. */
const cli_option_t *cli_option_find(const char *name, cli_cmd_t cmd);

/** The command with this name and action (action NULL: a one-word command), or NULL. */
const cli_command_t *cli_command_find(const char *name, const char *action);

/** True when name is a command that takes an action word ("parked"). */
bool cli_command_has_actions(const char *name);

/** "status", or "parked list", for messages. */
const char *cli_command_label(const cli_command_t *command, char *buf, size_t cap);

/* Generated texts (help.c). Each writes to out and returns nothing: the caller checks
 * out's error state, as for any other output. */

/** `lapse --help`: usage, commands with their options, global options, environment. */
void cli_help_top(FILE *out);
/** `lapse COMMAND --help`. */
void cli_help_command(FILE *out, const cli_command_t *command);
/** `lapse parked --help`: each action's synopsis. */
void cli_help_group(FILE *out, const char *name);
/** `lapse help --markdown`: the README's reference, between its marker lines. */
void cli_help_markdown(FILE *out);
/** `lapse help --man`: the lapse(1) man page in roff (help_man.c). */
void cli_help_man(FILE *out);

/* What every generated text shares (help.c). */

/** The program's one-sentence description, and the exit codes ("0 done, 1 ..."). */
extern const char cli_help_about[];
extern const char cli_help_exit_codes[];
/** False for a CLI_HIDDEN switch, which no help text shows. */
bool cli_option_shown(const cli_option_t *opt);
/** True when opt is listed under cmd: shown, one of its own options (not a global one),
 *  and for `config` not a setting (each is listed under the commands that use it). */
bool cli_option_listed(const cli_option_t *opt, cli_cmd_t cmd);
/** The default the help shows, or NULL (none, or empty); static. */
const char *cli_option_default(const cli_option_t *opt);
/** The setting's environment variable, or NULL; static. */
const char *cli_option_env(const cli_option_t *opt);
/** "every command", or "consume, sweep": the commands that list opt, written to buf. */
const char *cli_option_commands(const cli_option_t *opt, char *buf, size_t cap);

#endif

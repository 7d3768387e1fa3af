/* SPDX-License-Identifier: MIT
 * Shared pieces of the lapse executable: context, exit codes, logging, signals. */
#ifndef LAPSE_CLI_H
#define LAPSE_CLI_H

#include <signal.h>
#include <stdio.h>

#include <lapse/config.h>
#include <lapse/store.h>

#include "options.h"

enum {
    CLI_EXIT_OK = 0,
    CLI_EXIT_FAILED = 1,
    CLI_EXIT_USAGE = 2,
    CLI_EXIT_REFUSED = 3,
    CLI_EXIT_NOT_FOUND = 4
};

/* A command-local option as given; value is borrowed from argv ("" for a switch). */
typedef struct cli_given {
    const cli_option_t *opt;
    const char *value;
} cli_given_t;

typedef struct cli {
    lapse_config_t *cfg;
    const char *self; /* path of this executable, for the demo's child consumer */
    const cli_command_t *command;
    char label[32]; /* "status", "parked list": for messages */
    /* Command-local options in the order given (settings went into cfg); owned, freed by
     * main. */
    cli_given_t *given;
    size_t n_given;
    /* Per row of cli_options that sets a property: where its value came from,
     * CLI_FROM_FLAG or the variable's name (static); NULL for the default. */
    const char *from[CLI_MAX_OPTIONS];
} cli_t;

extern const char CLI_FROM_FLAG[];

/* A command: argv holds its argc positional arguments (the words after the command's
 * name and action, options taken out), argv[argc] == NULL. */
typedef int (*cli_cmd_fn)(cli_t *cli, int argc, char **argv);

int cmd_publish(cli_t *cli, int argc, char **argv);
int cmd_pay(cli_t *cli, int argc, char **argv);
int cmd_consume(cli_t *cli, int argc, char **argv);
int cmd_status(cli_t *cli, int argc, char **argv);
int cmd_topology(cli_t *cli, int argc, char **argv);
int cmd_demo(cli_t *cli, int argc, char **argv);
int cmd_pending(cli_t *cli, int argc, char **argv);
int cmd_sweep(cli_t *cli, int argc, char **argv);
int cmd_reconcile(cli_t *cli, int argc, char **argv);
int cmd_parked_list(cli_t *cli, int argc, char **argv);
int cmd_parked_replay(cli_t *cli, int argc, char **argv);
int cmd_config(cli_t *cli, int argc, char **argv);
int cmd_help(cli_t *cli, int argc, char **argv);
int cmd_health(cli_t *cli, int argc, char **argv);

/* cli_parse() returns this when the command is to run. */
#define CLI_RUN (-1)

/**
 * Parse argv with getopt_long: options before or after the command, in any order. Then
 * check that each option applies to the command, apply the environment variable of each
 * setting the command takes (when its flag is absent), then the flags.
 * @return CLI_RUN with cli->command, cli->given and *pos (new array of *n_pos borrowed
 *         strings, NULL-terminated, freed with free()) set; or an exit code after
 *         printing the help, the version or one line of usage error.
 */
int cli_parse(cli_t *cli, int argc, char **argv, int *n_pos, char ***pos);

/** The value of the last id option given ("" for a switch), or NULL when not given. */
const char *cli_opt(const cli_t *cli, cli_opt_id_t id);

/** Every value given for a repeatable id option, in order: up to cap into values;
 *  returns how many were given. */
size_t cli_opt_all(const cli_t *cli, cli_opt_id_t id, const char **values, size_t cap);

/** A duration setting ("60s" or "0") of cli->cfg in ms. */
int64_t cli_setting_ms(const cli_t *cli, const char *property);

/** Copy text into buf with the password of every URL in it replaced by "***"
 *  ("amqp://u:***@h/"), so that no error or listing shows one. Returns buf. */
char *cli_redact(const char *text, char *buf, size_t cap);

/** From now on, error lines follow log's format (JSON) and journald prefix ("<3>"); log
 *  is borrowed and must outlive every later error line. */
struct cli_log;
void cli_set_error_log(const struct cli_log *log);

/** Print one line "lapse: <printf text>" to stderr, passwords redacted. */
void cli_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/** The same as "lapse <cmd>: <printf text>": a command's own messages that carry
 *  anything the user typed or a file held. */
void cli_say(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/** Map a status to the exit codes of docs/design.md, "The command line". */
int cli_exit_code(lapse_status_t rc);

/** Print "lapse: <what>: <reason>" to stderr; returns cli_exit_code(rc). */
int cli_fail(lapse_status_t rc, const lapse_error_t *err, const char *what);

/** Print "lapse <cmd>: <msg> (see 'lapse <cmd> --help')" to stderr as one line,
 *  passwords redacted; cmd NULL: "lapse: <msg> (see 'lapse --help')". Returns
 *  CLI_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/** Install SIGINT/SIGTERM handlers that set and return the stop flag. */
volatile sig_atomic_t *cli_install_stop_handlers(void);

/** Open the configured store, retrying while it is busy; flags as
 *  lapse_store_open_flags() (LAPSE_STORE_MUST_EXIST for commands that only read). NULL
 *  after printing an error; *exit_code receives the code to exit with. */
lapse_store_t *cli_open_store(cli_t *cli, unsigned flags, int *exit_code);
/** The same without reporting: NULL with *rc and err set (the caller decides). */
lapse_store_t *cli_try_store(cli_t *cli, unsigned flags, lapse_status_t *rc,
                             lapse_error_t *err);

/** Give stdout a buffer that holds a whole output (unless it is a terminal), so that
 *  cli_finish_stdout() can say why writing it failed. Call before any output. */
void cli_buffer_stdout(void);

/** Flush stdout and report a write error on it once, for every command: returns code,
 *  or CLI_EXIT_FAILED when code was 0 and stdout could not be written. */
int cli_finish_stdout(int code);

#endif

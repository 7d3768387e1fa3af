/* SPDX-License-Identifier: MIT
 * Shared pieces of the lapse executable: context, exit codes, logging, signals. */
#ifndef LAPSE_CLI_H
#define LAPSE_CLI_H

#include <signal.h>
#include <stdio.h>

#include <lapse/config.h>
#include <lapse/store.h>

enum {
    CLI_EXIT_OK = 0,
    CLI_EXIT_FAILED = 1,
    CLI_EXIT_USAGE = 2,
    CLI_EXIT_REFUSED = 3,
    CLI_EXIT_NOT_FOUND = 4
};

typedef struct cli {
    lapse_config_t *cfg;
    const char *self; /* path of this executable, for the demo's child consumer */
} cli_t;

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
int cmd_parked(cli_t *cli, int argc, char **argv);

/** Map a status to the exit codes of docs/design.md, "The command line". */
int cli_exit_code(lapse_status_t rc);

/** Print "lapse: <what>: <reason>" to stderr; returns cli_exit_code(rc). */
int cli_fail(lapse_status_t rc, const lapse_error_t *err, const char *what);

/** Print "lapse <cmd>: <msg> (see 'lapse <cmd> --help')" to stderr as one line; returns
 *  CLI_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/** Log sink writing "<time> level=<l> <line>" to stderr. */
void cli_log_stderr(void *opaque, lapse_log_level_t level, const char *line);

/** Install SIGINT/SIGTERM handlers that set and return the stop flag. */
volatile sig_atomic_t *cli_install_stop_handlers(void);

/** Open the configured store, retrying while it is busy. NULL after printing an error;
 *  *exit_code receives the code to exit with. */
lapse_store_t *cli_open_store(cli_t *cli, int *exit_code);

/** True when argv holds -h or --help before any "--". */
int cli_wants_help(int argc, char **argv);

#endif

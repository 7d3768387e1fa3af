/* SPDX-License-Identifier: MIT
 * Shared pieces of the lapse executable: exit codes, errors, logging, signals. */
#include "cli.h"

#include <lapse/message.h>

#include <stdarg.h>
#include <string.h>

int cli_exit_code(lapse_status_t rc) {
    switch (rc) {
        case LAPSE_OK:
            return CLI_EXIT_OK;
        case LAPSE_ERR_INVALID:
        case LAPSE_ERR_CONFIG_URL:
        case LAPSE_ERR_CONFIG_DURATION:
        case LAPSE_ERR_CONFIG_CLASS:
        case LAPSE_ERR_CONFIG_PREFIX:
        case LAPSE_ERR_CONFIG_STORE:
        case LAPSE_ERR_CONFIG_UNKNOWN:
        case LAPSE_ERR_CONFIG_VALUE:
            return CLI_EXIT_USAGE;
        case LAPSE_ERR_STORE_CONFLICT:
        case LAPSE_ERR_STORE_STATE:
        case LAPSE_ERR_STORE_LAPSED:
            return CLI_EXIT_REFUSED;
        case LAPSE_ERR_STORE_NOT_FOUND:
            return CLI_EXIT_NOT_FOUND;
        default:
            return CLI_EXIT_FAILED;
    }
}

int cli_fail(lapse_status_t rc, const lapse_error_t *err, const char *what) {
    const char *detail = err && err->text[0] ? err->text : lapse_strerror(rc);
    fprintf(stderr, "lapse: %s: %s (%s)\n", what, detail, lapse_status_name(rc));
    return cli_exit_code(rc);
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    /* One line, as docs/design.md ("The command line") asks of every error; the
     * usage is one --help away. */
    fprintf(stderr, "lapse %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see 'lapse %s --help')\n", cmd);
    va_end(ap);
    return CLI_EXIT_USAGE;
}

void cli_log_stderr(void *opaque, lapse_log_level_t level, const char *line) {
    (void)opaque;
    static const char *const names[] = {"error", "warn", "info", "debug"};
    char ts[LAPSE_RFC3339_LEN];
    lapse_time_format_rfc3339(lapse_clock_now_ms(), ts);
    fprintf(stderr, "%s level=%s %s\n", ts, names[level], line);
}

static volatile sig_atomic_t stop_flag;

static void on_stop_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

volatile sig_atomic_t *cli_install_stop_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return &stop_flag;
}

lapse_store_t *cli_open_store(cli_t *cli, int *exit_code) {
    lapse_status_t rc;
    lapse_error_t err = {0};
    lapse_store_t *store =
        lapse_store_open(lapse_config_get(cli->cfg, "store"), &rc, &err);
    if (!store) {
        *exit_code = cli_fail(rc, &err, "open store");
    }
    return store;
}

int cli_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            return 0;
        }
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            return 1;
        }
    }
    return 0;
}

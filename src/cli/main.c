/* SPDX-License-Identifier: MIT
 * lapse: parse the command line (parse.c, from the table in options.c), run one
 * command, and check once, for all of them, that stdout was written. */
#include "cli.h"
#include "log_sink.h"

#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

static const cli_cmd_fn commands[CLI_CMD_COUNT_] = {
    [CLI_CMD_PUBLISH] = cmd_publish,
    [CLI_CMD_PAY] = cmd_pay,
    [CLI_CMD_CONSUME] = cmd_consume,
    [CLI_CMD_STATUS] = cmd_status,
    [CLI_CMD_PENDING] = cmd_pending,
    [CLI_CMD_SWEEP] = cmd_sweep,
    [CLI_CMD_RECONCILE] = cmd_reconcile,
    [CLI_CMD_PARKED_LIST] = cmd_parked_list,
    [CLI_CMD_PARKED_REPLAY] = cmd_parked_replay,
    [CLI_CMD_TOPOLOGY] = cmd_topology,
    [CLI_CMD_DEMO] = cmd_demo,
    [CLI_CMD_CONFIG] = cmd_config,
    [CLI_CMD_HELP] = cmd_help,
    [CLI_CMD_HEALTH] = cmd_health,
};

/* glibc serves a request of 128 KiB or more with mmap, but raises that threshold to the
 * size of the first such block freed; from then on rabbitmq-c's 128 KiB buffers (socket
 * input, output, decoding pool pages: frame_max each) come from the heap and what was
 * touched there stays resident. A fixed threshold below them keeps them mapped and
 * returned whole when freed, and a low trim threshold gives back the heap's freed top:
 * 0.4-0.5 MB less peak RSS for a draining consumer, 0.1-0.2 MB for the publisher, no
 * CPU measured (issue 14, 100k orders, two runs each). Set by the program, not the
 * library: malloc's settings belong to the process. */
static void tune_malloc(void) {
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);
    mallopt(M_TRIM_THRESHOLD, 128 * 1024);
#endif
}

/* GnuTLS comes in with libpq (through libldap) and with libmicrohttpd, and by default
 * initialises itself when it is loaded: crypto back-end, random generator, system
 * priority file, about 1 MB of RSS that a PostgreSQL consumer or publisher never uses
 * (libpq speaks TLS through OpenSSL). GNUTLS_NO_IMPLICIT_INIT=1 (gnutls_global_init(3))
 * leaves that to the libraries that do use GnuTLS: libldap's TLS set-up and
 * libmicrohttpd's MHD_init both call gnutls_global_init themselves. A value the user
 * set is kept. Before anything runs, while the process has one thread. */
static void defer_gnutls_init(void) {
    (void)setenv("GNUTLS_NO_IMPLICIT_INIT", "1", 0);
}

int main(int argc, char **argv) {
    tune_malloc();
    defer_gnutls_init();
    cli_buffer_stdout();
    lapse_config_t *cfg = lapse_config_new();
    if (!cfg) {
        cli_errorf("out of memory");
        return CLI_EXIT_FAILED;
    }
    /* Text until the settings are known; nothing logs before they are. */
    cli_log_t log = {0};
    lapse_config_set_log_cb(cfg, cli_log_sink, &log);
    lapse_config_set_log_burst_cb(cfg, cli_log_burst);
    cli_t cli = {.cfg = cfg, .self = argv[0]};
    int n_pos = 0;
    char **pos = NULL;
    int code = cli_parse(&cli, argc, argv, &n_pos, &pos);
    if (code == CLI_RUN) {
        cli_log_setup(&log, cfg);
        cli_set_error_log(&log);
        code = commands[cli.command->cmd](&cli, n_pos, pos);
    }
    code = cli_finish_stdout(code);
    free(pos);
    free(cli.given);
    lapse_config_free(cfg);
    return code;
}

/* SPDX-License-Identifier: MIT
 * The consumer's HTTP listener (consume --metrics-listen): GET /metrics and GET /healthz
 * served by libmicrohttpd on a thread of its own, from a registry the consumer records
 * into (src/metrics_int.h). */
#ifndef LAPSE_CLI_METRICS_HTTP_H
#define LAPSE_CLI_METRICS_HTTP_H

#include "cli.h"
#include "metrics_int.h"

typedef struct cli_metrics cli_metrics_t;

/**
 * With metrics_listen set in cli->cfg: a new registry, and its server listening on that
 * address (logged as event=metrics_listening address=HOST:PORT, the port the kernel gave
 * when 0 was asked). NULL with *code left alone when no address is set; NULL with *code
 * = CLI_EXIT_FAILED after one line on stderr when it cannot listen (port in use, a host
 * that does not resolve). New: stopped and freed by cli_metrics_stop.
 */
cli_metrics_t *cli_metrics_start(cli_t *cli, int *code);

/** The registry to hand to the consumer; borrowed until cli_metrics_stop; NULL for a
 *  NULL handle. */
lapse__metrics_t *cli_metrics_registry(cli_metrics_t *metrics);

/** Stop the server (its thread joined) and free the registry; accepts NULL. */
void cli_metrics_stop(cli_metrics_t *metrics);

#endif

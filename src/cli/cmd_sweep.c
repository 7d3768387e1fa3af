/* SPDX-License-Identifier: MIT
 * lapse sweep: the store-side safety net, run once by hand. */
#include "cli.h"

#include <lapse/message.h>
#include <lapse/sweep.h>

#include <getopt.h>
#include <string.h>

static const char sweep_usage[] =
    "usage: lapse sweep [--dry-run] [--grace DURATION] [--in-flight DURATION]\n"
    "  Once: cancel directly, from the store, every order still pending a grace period\n"
    "  after its deadline (its expiry message was lost: a purged queue, a broker that\n"
    "  lost its disk), then publish again every order whose message the broker never\n"
    "  confirmed (a failed publish, a crash between recording and confirming).\n"
    "  --grace D      how long past its deadline an order may wait for its message\n"
    "                 (default 60s); keep it above any clock difference between hosts\n"
    "  --in-flight D  leave orders recorded less than D ago: their publish may still be\n"
    "                 waiting for its confirm (default 30s; 0 = none)\n"
    "  --dry-run      count only: change nothing, connect to no broker\n"
    "Last, it publishes the order.cancelled events waiting in the outbox (those of the\n"
    "orders it cancelled, and any older ones); when the broker is out of reach or no\n"
    "queue is bound to the events exchange, a warning says so and they stay in the\n"
    "outbox for a consumer or the next sweep, without failing the run.\n"
    "Prints one key=value line and a sentence. Exits 0, or 1 when a part failed (the\n"
    "other part still ran; cancelling needs no broker).\n";

/* A duration, or "0". */
static int parse_span(const char *text, int64_t *out) {
    if (strcmp(text, "0") == 0) {
        *out = 0;
        return 0;
    }
    return lapse_duration_parse(text, out) == LAPSE_OK ? 0 : -1;
}

/* SIGINT/SIGTERM stop the sweep after the batch in hand. */
static int on_progress(void *opaque, const lapse_sweep_report_t *so_far) {
    (void)so_far;
    return *(volatile sig_atomic_t *)opaque != 0;
}

int cmd_sweep(cli_t *cli, int argc, char **argv) {
    static const struct option opts[] = {{"dry-run", no_argument, NULL, 'n'},
                                         {"grace", required_argument, NULL, 'g'},
                                         {"in-flight", required_argument, NULL, 'f'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    lapse_sweep_opts_t so;
    lapse_sweep_opts_init(&so);
    int opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (opt) {
            case 'h':
                fputs(sweep_usage, stdout);
                return CLI_EXIT_OK;
            case 'n':
                so.dry_run = true;
                break;
            case 'g':
                if (parse_span(optarg, &so.grace_ms) != 0) {
                    return cli_usage_error("sweep", "invalid --grace '%s' (e.g. 60s, 5m)",
                                           optarg);
                }
                break;
            case 'f':
                if (parse_span(optarg, &so.in_flight_ms) != 0) {
                    return cli_usage_error(
                        "sweep", "invalid --in-flight '%s' (e.g. 30s, or 0)", optarg);
                }
                break;
            default:
                return cli_usage_error("sweep", "unknown or incomplete option '%s'",
                                       argv[optind - 1]);
        }
    }
    if (optind != argc) {
        return cli_usage_error("sweep", "unexpected argument '%s'", argv[optind]);
    }
    so.progress = on_progress;
    so.progress_opaque = (void *)cli_install_stop_handlers();
    int code = CLI_EXIT_OK;
    lapse_store_t *store = cli_open_store(cli, &code);
    if (!store) {
        return code;
    }
    lapse_sweep_report_t r;
    lapse_error_t err = {0};
    lapse_status_t rc = lapse_sweep_run(cli->cfg, store, &so, &r, &err);
    lapse_store_close(store);
    char grace[32];
    lapse_duration_format(so.grace_ms, grace, sizeof grace);
    printf("sweep republished=%llu cancelled=%llu would_republish=%llu would_cancel=%llu "
           "skipped=%llu failed=%llu dry_run=%s events_published=%llu "
           "events_waiting=%lld\n",
           (unsigned long long)r.republished, (unsigned long long)r.cancelled,
           (unsigned long long)r.would_republish, (unsigned long long)r.would_cancel,
           (unsigned long long)r.skipped, (unsigned long long)r.failed,
           so.dry_run ? "yes" : "no", (unsigned long long)r.events_published,
           (long long)r.events_waiting);
    if (so.dry_run) {
        printf("Dry run, nothing changed: %llu lost order(s) would be cancelled (pending "
               "%s past their deadline), %llu unconfirmed order(s) published again.\n",
               (unsigned long long)r.would_cancel, grace,
               (unsigned long long)r.would_republish);
    } else {
        printf("%llu lost order(s) cancelled (pending %s past their deadline), %llu "
               "unconfirmed order(s) published again, %llu left to a later sweep.\n",
               (unsigned long long)r.cancelled, grace, (unsigned long long)r.republished,
               (unsigned long long)r.failed);
        if (r.events_published > 0 || r.events_waiting > 0) {
            printf("%llu event(s) published, %lld still waiting in the outbox.\n",
                   (unsigned long long)r.events_published, (long long)r.events_waiting);
        }
    }
    if (rc != LAPSE_OK) {
        cli_fail(rc, &err, "sweep");
        return CLI_EXIT_FAILED;
    }
    return CLI_EXIT_OK;
}

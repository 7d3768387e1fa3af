/* SPDX-License-Identifier: MIT
 * lapse reconcile: publish the expiry of every pending order again. */
#include "cli.h"

#include <lapse/message.h>
#include <lapse/sweep.h>

#include <getopt.h>
#include <unistd.h>

#define PROGRESS_EVERY_MS 200

static const char usage[] =
    "usage: lapse reconcile [--dry-run]\n"
    "  Publish the expiry message of EVERY pending order again, for its recorded\n"
    "  deadline: after moving to a new broker or vhost (declare the topology there\n"
    "  first). Messages left on the old broker are harmless: each order is cancelled\n"
    "  once, and a paid one never.\n"
    "  --dry-run  count only\n"
    "Shows progress on a terminal and prints the final count. Exits 0, or 1 on "
    "failure.\n";

typedef struct progress {
    volatile sig_atomic_t *stop;
    bool tty;
    int64_t shown_at;
} progress_t;

/* A progress line on a terminal; SIGINT/SIGTERM stop after the batch in hand. */
static int on_progress(void *opaque, const lapse_sweep_report_t *r) {
    progress_t *p = opaque;
    int64_t now = lapse_clock_now_ms();
    if (p->tty && now - p->shown_at >= PROGRESS_EVERY_MS) {
        p->shown_at = now;
        fprintf(stderr, "\rlapse reconcile: %llu published, %llu skipped, %llu failed",
                (unsigned long long)(r->republished + r->would_republish),
                (unsigned long long)r->skipped, (unsigned long long)r->failed);
    }
    return *p->stop != 0;
}

int cmd_reconcile(cli_t *cli, int argc, char **argv) {
    static const struct option opts[] = {{"dry-run", no_argument, NULL, 'n'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    lapse_sweep_opts_t so;
    lapse_sweep_opts_init(&so);
    int opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (opt == 'h') {
            fputs(usage, stdout);
            return CLI_EXIT_OK;
        }
        if (opt != 'n') {
            return cli_usage_error("reconcile", "unknown option '%s'", argv[optind - 1]);
        }
        so.dry_run = true;
    }
    if (optind != argc) {
        return cli_usage_error("reconcile", "unexpected argument '%s'", argv[optind]);
    }
    progress_t p = {.stop = cli_install_stop_handlers(), .tty = isatty(STDERR_FILENO)};
    so.progress = on_progress;
    so.progress_opaque = &p;
    int code = CLI_EXIT_OK;
    lapse_store_t *store = cli_open_store(cli, &code);
    if (!store) {
        return code;
    }
    lapse_sweep_report_t r;
    lapse_error_t err = {0};
    lapse_status_t rc = lapse_sweep_reconcile(cli->cfg, store, &so, &r, &err);
    lapse_store_close(store);
    if (p.tty) {
        fputc('\n', stderr);
    }
    printf("reconcile republished=%llu would_republish=%llu skipped=%llu failed=%llu "
           "dry_run=%s\n",
           (unsigned long long)r.republished, (unsigned long long)r.would_republish,
           (unsigned long long)r.skipped, (unsigned long long)r.failed,
           so.dry_run ? "yes" : "no");
    printf("%s%llu pending order(s) %s, %llu skipped (paid or cancelled meanwhile), %llu "
           "failed.\n",
           so.dry_run ? "Dry run: " : "",
           (unsigned long long)(so.dry_run ? r.would_republish : r.republished),
           so.dry_run ? "would be published again" : "published again",
           (unsigned long long)r.skipped, (unsigned long long)r.failed);
    if (rc != LAPSE_OK) {
        cli_fail(rc, &err, "reconcile");
        return CLI_EXIT_FAILED;
    }
    return CLI_EXIT_OK;
}

/* SPDX-License-Identifier: MIT
 * lapse reconcile: publish the expiry of every pending order again. */
#include "cli.h"

#include <lapse/message.h>
#include <lapse/sweep.h>

#include <unistd.h>

#define PROGRESS_EVERY_MS 200

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
    lapse_sweep_opts_t so;
    lapse_sweep_opts_init(&so);
    so.dry_run = cli_opt(cli, CLI_OPT_DRY_RUN) != NULL;
    if (argc != 0) {
        return cli_usage_error("reconcile", "unexpected argument '%s'", argv[0]);
    }
    progress_t p = {.stop = cli_install_stop_handlers(), .tty = isatty(STDERR_FILENO)};
    so.progress = on_progress;
    so.progress_opaque = &p;
    int code = CLI_EXIT_OK;
    /* It only re-publishes what a store holds: a missing one is a mistyped one. */
    lapse_store_t *store = cli_open_store(cli, LAPSE_STORE_MUST_EXIST, &code);
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

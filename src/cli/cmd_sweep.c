/* SPDX-License-Identifier: MIT
 * lapse sweep: the store-side safety net, run once by hand. */
#include "cli.h"

#include <lapse/message.h>
#include <lapse/sweep.h>

#include <string.h>

/* SIGINT/SIGTERM stop the sweep after the batch in hand. */
static int on_progress(void *opaque, const lapse_sweep_report_t *so_far) {
    (void)so_far;
    return *(volatile sig_atomic_t *)opaque != 0;
}

int cmd_sweep(cli_t *cli, int argc, char **argv) {
    lapse_sweep_opts_t so;
    lapse_sweep_opts_init(&so);
    so.dry_run = cli_opt(cli, CLI_OPT_DRY_RUN) != NULL;
    /* --grace and --in-flight are the settings the consumer's own sweep uses. */
    so.grace_ms = cli_setting_ms(cli, "sweep_grace");
    so.in_flight_ms = cli_setting_ms(cli, "sweep_in_flight");
    so.retention_ms = cli_setting_ms(cli, "retention");
    if (argc != 0) {
        return cli_usage_error("sweep", "unexpected argument '%s'", argv[0]);
    }
    so.progress = on_progress;
    so.progress_opaque = (void *)cli_install_stop_handlers();
    int code = CLI_EXIT_OK;
    /* A dry run only reads: a missing store is a mistyped one, not one to create. */
    lapse_store_t *store =
        cli_open_store(cli, so.dry_run ? LAPSE_STORE_MUST_EXIST : 0, &code);
    if (!store) {
        return code;
    }
    lapse_sweep_report_t r;
    lapse_error_t err = {0};
    lapse_status_t rc = lapse_sweep_run(cli->cfg, store, &so, &r, &err);
    lapse_store_close(store);
    char grace[LAPSE_DURATION_DISPLAY_LEN];
    lapse_duration_display(so.grace_ms, grace, sizeof grace);
    printf("sweep republished=%llu cancelled=%llu would_republish=%llu would_cancel=%llu "
           "skipped=%llu failed=%llu dry_run=%s events_published=%llu "
           "events_waiting=%lld pruned_orders=%llu pruned_events=%llu\n",
           (unsigned long long)r.republished, (unsigned long long)r.cancelled,
           (unsigned long long)r.would_republish, (unsigned long long)r.would_cancel,
           (unsigned long long)r.skipped, (unsigned long long)r.failed,
           so.dry_run ? "yes" : "no", (unsigned long long)r.events_published,
           (long long)r.events_waiting, (unsigned long long)r.pruned_orders,
           (unsigned long long)r.pruned_events);
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

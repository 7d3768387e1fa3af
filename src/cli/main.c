/* SPDX-License-Identifier: MIT
 * lapse: global options, then one subcommand. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: lapse [--amqp URL] [--store URI] [--prefix NAME] [--classes LIST] COMMAND "
    "[ARGS]\n"
    "\n"
    "commands:\n"
    "  publish ORDER_ID [--timeout DURATION] [--hold RESOURCE]...\n"
    "  publish --batch FILE|-     one JSON object a line\n"
    "  pay ORDER_ID\n"
    "  consume [--prefetch N]     long-running; SIGINT/SIGTERM stop it cleanly\n"
    "  status [ORDER_ID] [--json]\n"
    "  pending [--due-before TIME] [--limit N] [--json]\n"
    "                             pending orders by deadline, from the store\n"
    "  sweep [--dry-run] [--grace D]\n"
    "                             cancel lost orders, publish unconfirmed ones again\n"
    "  reconcile [--dry-run]      publish every pending order again (new broker)\n"
    "  topology declare|export\n"
    "  parked list [--json] [--limit N]\n"
    "  parked replay --all|ORDER_ID   send parked messages back to the expired queue\n"
    "  demo                       a short end-to-end run against the broker\n"
    "\n"
    "global options (each beats its environment variable):\n"
    "  --amqp URL       LAPSE_AMQP_URL  (default amqp://guest:guest@localhost:5672/%2f)\n"
    "  --store URI      LAPSE_STORE     (default sqlite:lapse.db)\n"
    "  --prefix NAME    LAPSE_PREFIX    (default lapse)\n"
    "  --classes LIST   LAPSE_CLASSES   payment windows with a holding queue each\n"
    "                                   (default 30m; e.g. 15m,30m,45m)\n"
    "  --queue-type T   LAPSE_QUEUE_TYPE classic (default) or quorum: replicated queues\n"
    "                                   with at-least-once dead-lettering\n"
    "  --events-queue Q LAPSE_EVENTS_QUEUE a durable queue bound to the events\n"
    "                                   exchange, keeping the order.cancelled events;\n"
    "                                   declared and exported with the topology\n"
    "                                   (default: none)\n"
    "  --clock-skew D   shift this process's clock (testing only; e.g. 3s or -3s)\n"
    "  --help, --version\n"
    "\n"
    "exit codes: 0 done, 1 failed, 2 usage, 3 refused by the order's state, 4 no such "
    "order\n"
    "Run 'lapse COMMAND --help' for a command's options.\n";

static const struct {
    const char *name;
    cli_cmd_fn fn;
} commands[] = {
    {"publish", cmd_publish}, {"pay", cmd_pay},           {"consume", cmd_consume},
    {"status", cmd_status},   {"topology", cmd_topology}, {"demo", cmd_demo},
    {"pending", cmd_pending}, {"sweep", cmd_sweep},       {"reconcile", cmd_reconcile},
    {"parked", cmd_parked},
};

static const struct {
    const char *flag;
    const char *property;
    const char *env;
} globals[] = {
    {"--amqp", "amqp_url", "LAPSE_AMQP_URL"},
    {"--store", "store", "LAPSE_STORE"},
    {"--prefix", "prefix", "LAPSE_PREFIX"},
    {"--classes", "classes", "LAPSE_CLASSES"},
    {"--queue-type", "queue_type", "LAPSE_QUEUE_TYPE"},
    {"--events-queue", "events_queue", "LAPSE_EVENTS_QUEUE"},
    {"--clock-skew", "clock_skew", NULL},
};

/* True when a global flag (before the command) is given, as "--x v" or "--x=v". */
static int has_flag(int argc, char **argv, const char *flag) {
    size_t len = strlen(flag);
    for (int i = 1; i < argc && argv[i][0] == '-'; i++) {
        if (strncmp(argv[i], flag, len) == 0 &&
            (argv[i][len] == '\0' || argv[i][len] == '=')) {
            return 1;
        }
        if (!strchr(argv[i], '=') && strcmp(argv[i], "--help") != 0 &&
            strcmp(argv[i], "-h") != 0 && strcmp(argv[i], "--version") != 0) {
            i++; /* skip the flag's value */
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    lapse_config_t *cfg = lapse_config_new();
    if (!cfg) {
        fprintf(stderr, "lapse: out of memory\n");
        return CLI_EXIT_FAILED;
    }
    lapse_config_set_log_cb(cfg, cli_log_stderr, NULL);
    lapse_error_t err = {0};
    int code = CLI_EXIT_OK;
    lapse_status_t rc;
    /* A flag beats its variable, so a variable is only read (and checked) when its flag
     * is absent. */
    for (size_t g = 0; g < sizeof globals / sizeof globals[0]; g++) {
        const char *value = globals[g].env ? getenv(globals[g].env) : NULL;
        if (!value || !value[0] || has_flag(argc, argv, globals[g].flag)) {
            continue;
        }
        rc = lapse_config_set(cfg, globals[g].property, value, &err);
        if (rc != LAPSE_OK) {
            fprintf(stderr, "lapse: %s: %s\n", globals[g].env, err.text);
            code = CLI_EXIT_USAGE;
            goto out;
        }
    }
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            goto out;
        }
        if (strcmp(argv[i], "--version") == 0) {
            printf("lapse %s\n", LAPSE_VERSION);
            goto out;
        }
        const char *flag = argv[i];
        const char *value = NULL;
        const char *eq = strchr(flag, '=');
        size_t flag_len = eq ? (size_t)(eq - flag) : strlen(flag);
        size_t g = 0;
        for (; g < sizeof globals / sizeof globals[0]; g++) {
            if (strlen(globals[g].flag) == flag_len &&
                strncmp(globals[g].flag, flag, flag_len) == 0) {
                break;
            }
        }
        if (g == sizeof globals / sizeof globals[0]) {
            fprintf(stderr, "lapse: unknown option '%s' (see 'lapse --help')\n", flag);
            code = CLI_EXIT_USAGE;
            goto out;
        }
        if (eq) {
            value = eq + 1;
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            fprintf(stderr, "lapse: option '%s' needs a value (see 'lapse --help')\n",
                    flag);
            code = CLI_EXIT_USAGE;
            goto out;
        }
        rc = lapse_config_set(cfg, globals[g].property, value, &err);
        if (rc != LAPSE_OK) {
            fprintf(stderr, "lapse: %.*s: %s\n", (int)flag_len, flag, err.text);
            code = CLI_EXIT_USAGE;
            goto out;
        }
    }
    if (i >= argc) {
        fprintf(stderr, "lapse: no command given (see 'lapse --help')\n");
        code = CLI_EXIT_USAGE;
        goto out;
    }
    cli_t cli = {.cfg = cfg, .self = argv[0]};
    for (size_t c = 0; c < sizeof commands / sizeof commands[0]; c++) {
        if (strcmp(argv[i], commands[c].name) == 0) {
            code = commands[c].fn(&cli, argc - i, argv + i);
            goto out;
        }
    }
    fprintf(stderr, "lapse: unknown command '%s' (see 'lapse --help')\n", argv[i]);
    code = CLI_EXIT_USAGE;
out:
    lapse_config_free(cfg);
    return code;
}

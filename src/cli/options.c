/* SPDX-License-Identifier: MIT
 * The one table of the command line (librdkafka's property table is the model): each
 * option once, with what it sets, which commands take it, and its help. The parser
 * (parse.c), every help text and the README's reference (help.c) are made from it, and
 * each setting's environment variable and default come from the config library's own
 * table, so nothing here can drift from what the code does. Adding an option is adding a
 * row:
 *  - a setting: its property's row in src/config.c (name, variable, default, parser)
 *    and a row here with .property, .metavar, .example (a valid value other than the
 *    default: the tests set it through the variable) and the commands that use it;
 *  - a command-local option: a row here with a cli_opt_id_t the command reads with
 *    cli_opt().
 * Then scripts/readme-options; integration_cli and unit_cli_options walk the table, so
 * the new row is tested without a new test. */
#include "options.h"

#include <string.h>

#define IN(cmd) CLI_IN(CLI_CMD_##cmd)

/* Settings that only some commands use are still shown and taken by `lapse config`. */
#define CONSUMER_SETTING (IN(CONSUME) | IN(CONFIG))

const cli_option_t cli_options[] = {
    /* Global settings: every command takes them, before or after its name. */
    {.name = "amqp",
     .metavar = "URL",
     .property = "amqp_url",
     .example = "amqp://app:secret@mq.example:5673/shop",
     .commands = CLI_GLOBAL,
     .flags = CLI_SECRET,
     .help = "the RabbitMQ broker, amqp://user:password@host:port/vhost (the vhost \"/\" "
             "is written %2f), or amqps://... for TLS (port 5671 by default), the "
             "certificate and host name verified"},
    {.name = "amqp-password-file",
     .metavar = "FILE",
     .property = "amqp_password_file",
     .example = "/run/credentials/lapse.service/amqp-password",
     .commands = CLI_GLOBAL,
     .help = "read the broker password from FILE (one line; a final newline is dropped) "
             "instead of the URL, at each connect: systemd credentials, Docker secrets"},
    {.name = "tls-ca",
     .metavar = "FILE",
     .property = "tls_ca",
     .example = "/etc/lapse/rabbitmq-ca.pem",
     .commands = CLI_GLOBAL,
     .help = "amqps://: the PEM file of the CAs that may sign the broker's certificate "
             "(default: the system's, /etc/ssl/certs/ca-certificates.crt); its host name "
             "is always checked too"},
    {.name = "tls-cert",
     .metavar = "FILE",
     .property = "tls_cert",
     .example = "/etc/lapse/client.pem",
     .commands = CLI_GLOBAL,
     .help = "amqps://: a PEM client certificate (chain) to send, with --tls-key"},
    {.name = "tls-key",
     .metavar = "FILE",
     .property = "tls_key",
     .example = "/etc/lapse/client.key",
     .commands = CLI_GLOBAL,
     .help = "amqps://: the unencrypted PEM private key of --tls-cert"},
    {.name = "store",
     .metavar = "URI",
     .property = "store",
     .example = "sqlite:/var/lib/lapse/orders.db",
     .commands = CLI_GLOBAL,
     /* A PostgreSQL URI may carry a password. */
     .flags = CLI_SECRET,
     .help = "the order store: sqlite:PATH (a new file is created mode 0600) or a "
             "PostgreSQL URI, postgresql://user@host:5432/db (libpq's; PG* variables and "
             ".pgpass apply); commands that only read never create one"},
    {.name = "store-schema",
     .metavar = "NAME",
     .property = "store_schema",
     .example = "shop_lapse",
     .commands = CLI_GLOBAL,
     .help = "PostgreSQL: the schema that holds lapse's tables, created and migrated by "
             "lapse"},
    {.name = "orders-map",
     .metavar = "FILE",
     .property = "orders_map",
     .example = "/etc/lapse/orders-map.json",
     .commands = CLI_GLOBAL,
     .help = "PostgreSQL: cancel in the shop's own orders table, described by this JSON "
             "map (see \"Using your own orders table\"); checked against the database at "
             "start"},
    {.name = "prefix",
     .metavar = "NAME",
     .property = "prefix",
     .example = "shop",
     .commands = CLI_GLOBAL,
     .help = "first part of every exchange and queue name, [A-Za-z0-9_-], so several "
             "applications can share a vhost"},
    {.name = "classes",
     .metavar = "LIST",
     .property = "classes",
     .example = "15m,45m",
     .commands = CLI_GLOBAL,
     .help = "payment windows with a holding queue each, e.g. 15m,30m,45m; any other "
             "timeout goes down the delay ladder"},
    {.name = "queue-type",
     .metavar = "TYPE",
     .property = "queue_type",
     .example = "quorum",
     .commands = CLI_GLOBAL,
     .help = "classic, or quorum: replicated queues with at-least-once dead-lettering"},
    {.name = "events-queue",
     .metavar = "QUEUE",
     .property = "events_queue",
     .example = "shop.cancellations",
     .commands = CLI_GLOBAL,
     .help =
         "a durable queue bound to the events exchange that keeps the order.cancelled "
         "events, declared and exported with the topology (default: none; see "
         "definitions/events-queue.json)"},
    {.name = "heartbeat",
     .metavar = "SECONDS",
     .property = "heartbeat",
     .example = "10",
     .commands = CLI_GLOBAL,
     .help = "AMQP heartbeat interval, 0..3600; 0 turns heartbeats off"},
    {.name = "log-level",
     .metavar = "LEVEL",
     .property = "log_level",
     .example = "warning",
     .commands = CLI_GLOBAL,
     .help = "debug, info, warning or error: log lines below LEVEL are dropped (warning "
             "drops the consumer's line per decision)"},
    {.name = "log-format",
     .metavar = "FORMAT",
     .property = "log_format",
     .example = "json",
     .commands = CLI_GLOBAL,
     .help = "text (time level=L key=value...) or json (one object a line: ts, level, "
             "and each key as a string field)"},
    {.name = "help",
     .short_name = 'h',
     .id = CLI_OPT_HELP,
     .commands = CLI_GLOBAL,
     .help = "show this help and exit"},
    {.name = "version",
     .short_name = 'V',
     .id = CLI_OPT_VERSION,
     .commands = CLI_GLOBAL,
     .help = "print \"lapse VERSION\" and exit"},

    /* The consumer's settings. */
    {.name = "prefetch",
     .metavar = "N",
     .property = "prefetch",
     .example = "200",
     .commands = CONSUMER_SETTING,
     .help = "deliveries in flight, 1..65535; they are decided in batches of up to half"},
    {.name = "max-attempts",
     .metavar = "N",
     .property = "max_attempts",
     .example = "3",
     .commands = CONSUMER_SETTING,
     .help = "a delivery whose cancel keeps failing (store errors) is retried with a "
             "growing delay (1 s, 2 s, 4 s, ... at most 5 min) and parked after N "
             "attempts, 1..1000"},
    {.name = "sweep-every",
     .metavar = "D",
     .property = "sweep_every",
     .example = "5m",
     .commands = CONSUMER_SETTING,
     .help = "the consumer's sweep, at start and then every D (0: never): publish again "
             "orders never confirmed, cancel orders still pending --grace after their "
             "deadline"},
    {.name = "grace",
     .metavar = "D",
     .property = "sweep_grace",
     .example = "2m",
     .commands = CONSUMER_SETTING | IN(SWEEP),
     .help = "how long past its deadline an order may wait for its expiry message "
             "before a sweep cancels it directly; keep it above any clock difference "
             "between hosts"},
    {.name = "in-flight",
     .metavar = "D",
     .property = "sweep_in_flight",
     .example = "10s",
     .commands = CONSUMER_SETTING | IN(SWEEP),
     .help = "a sweep leaves orders recorded less than D ago (0: none): their publish "
             "may still be waiting for its confirm"},
    {.name = "retention",
     .metavar = "D",
     .property = "retention",
     .example = "90d",
     .commands = CONSUMER_SETTING | IN(SWEEP),
     .help = "sweeps delete paid and cancelled orders, and published events, once their "
             "deadline and settlement are D in the past (0: keep everything)"},
    {.name = "metrics-listen",
     .metavar = "HOST:PORT",
     .property = "metrics_listen",
     .example = "127.0.0.1:9464",
     .commands = CONSUMER_SETTING | IN(HEALTH),
     .help = "consume: serve GET /metrics (Prometheus text format) and GET /healthz on "
             "this address, e.g. 127.0.0.1:9464, [::1]:9464 or :9464 for every "
             "interface (default: none); health: the consumer to ask"},

    /* publish */
    {.name = "timeout",
     .metavar = "DURATION",
     .id = CLI_OPT_TIMEOUT,
     .def = "30m",
     .commands = IN(PUBLISH),
     .help =
         "payment window, e.g. 90s, 30m, 2h, 400d; one equal to a class waits in that "
         "class's queue, any other goes down the delay ladder (whole seconds, rounded "
         "up)"},
    {.name = "deadline",
     .metavar = "RFC3339",
     .id = CLI_OPT_DEADLINE,
     .commands = IN(PUBLISH),
     .help = "an absolute deadline instead, e.g. 2026-12-01T18:00:00Z, at most 2^28-1 s "
             "(about 8.5 years) ahead"},
    {.name = "hold",
     .metavar = "RESOURCE",
     .id = CLI_OPT_HOLD,
     .commands = IN(PUBLISH),
     .flags = CLI_REPEAT,
     .help = "a resource the order holds until paid or cancelled, 1-256 bytes; "
             "repeatable"},
    {.name = "batch",
     .metavar = "FILE|-",
     .id = CLI_OPT_BATCH,
     .commands = IN(PUBLISH),
     .help =
         "publish one JSON object a line from FILE (- for stdin): "
         "{\"order_id\":..,\"timeout\":\"30m\"} or {\"order_id\":..,\"deadline\":..}, "
         "optional \"holds\":[..]"},

    {.name = "roles",
     .id = CLI_OPT_ROLES,
     .commands = IN(TOPOLOGY),
     .help = "export: print the publisher, consumer and operator users (no password) "
             "and their permissions instead of the topology"},

    /* Listings */
    {.name = "json",
     .id = CLI_OPT_JSON,
     .commands = IN(STATUS) | IN(PENDING) | IN(PARKED_LIST) | IN(CONFIG),
     .help = "print JSON instead of text"},
    {.name = "due-before",
     .metavar = "TIME",
     .id = CLI_OPT_DUE_BEFORE,
     .commands = IN(PENDING),
     .help = "only orders due before TIME: RFC 3339 (2026-12-01T18:00:00Z) or a duration "
             "from now (10m)"},
    {.name = "limit",
     .metavar = "N",
     .id = CLI_OPT_LIMIT,
     .def = "100",
     .commands = IN(PENDING),
     .help = "at most N orders (0: all); a note on stderr says when the list was cut "
             "short"},
    {.name = "limit",
     .metavar = "N",
     .id = CLI_OPT_LIMIT,
     .def = "1000",
     .commands = IN(PARKED_LIST),
     .help = "list at most N messages, 1..1000000; the rest is counted as more"},

    /* sweep, reconcile, parked replay, help */
    {.name = "dry-run",
     .short_name = 'n',
     .id = CLI_OPT_DRY_RUN,
     .commands = IN(SWEEP) | IN(RECONCILE),
     .help = "count only: change nothing"},
    {.name = "all",
     .id = CLI_OPT_ALL,
     .commands = IN(PARKED_REPLAY),
     .help = "every message parked when the command starts"},
    {.name = "markdown",
     .id = CLI_OPT_MARKDOWN,
     .commands = IN(HELP),
     .flags = CLI_HIDDEN,
     .help = "print the README's options reference"},
    {.name = "man",
     .id = CLI_OPT_MAN,
     .commands = IN(HELP),
     .flags = CLI_HIDDEN,
     .help = "print the lapse(1) man page (roff)"},
};

const size_t cli_n_options = sizeof cli_options / sizeof cli_options[0];

_Static_assert(sizeof cli_options / sizeof cli_options[0] <= CLI_MAX_OPTIONS,
               "raise CLI_MAX_OPTIONS");

const cli_command_t cli_commands[] = {
    {CLI_CMD_PUBLISH, "publish", NULL, "(ORDER_ID | --batch FILE|-)",
     "record orders and schedule their expiry on the broker",
     "Records the order as pending (with its holds) in the store, publishes its expiry "
     "message and waits for the broker's confirm. Exits 0 once confirmed; 3 if the "
     "order exists with another deadline. With --batch: in transactions of 500, bad "
     "lines reported with their numbers and skipped, exit 1 if any line failed."},
    {CLI_CMD_PAY, "pay", NULL, "ORDER_ID", "pay an order before its deadline",
     "Pending and before its deadline: paid. Exits 0 when paid (or already paid), 3 "
     "when cancelled or past its deadline, 4 when unknown. Never creates a store."},
    {CLI_CMD_CONSUME, "consume", NULL, "",
     "the long-running consumer: cancel orders as their windows lapse",
     "Runs until SIGINT/SIGTERM: then finishes and acks what it holds and exits 0. "
     "Logs one key=value line per decision to stderr, at level info (see --log-level, "
     "--log-format). Under systemd (NOTIFY_SOCKET set) it sends READY=1 once subscribed, "
     "STATUS= lines, WATCHDOG=1 while its loop turns and STOPPING=1 on SIGTERM."},
    {CLI_CMD_HEALTH, "health", NULL, "", "ask a running consumer whether it is healthy",
     "Asks the consumer listening on --metrics-listen for GET /healthz, for scripts and "
     "container health checks: exits 0 and prints 'ok' when it answers 200 (subscribed "
     "to the expired queue and its store answers), else exits 1 with the reason on "
     "stderr, also when no consumer answers within 5 s. A listener on every interface "
     "(:PORT, 0.0.0.0, [::]) is asked on the loopback address."},
    {CLI_CMD_STATUS, "status", NULL, "[ORDER_ID]",
     "queues and order counts, or one order",
     "Without ORDER_ID: messages and consumers per queue (each class, each rung of the "
     "delay ladder with how long it holds a message), orders per status, and the "
     "outbox: order.cancelled events not yet published. With "
     "ORDER_ID: the order's status, times and holds (exit 4 if unknown). Never creates "
     "a store."},
    {CLI_CMD_PENDING, "pending", NULL, "", "pending orders by deadline, from the store",
     "Pending orders by deadline, earliest first, read from the store. Text: one line "
     "per order, 'ORDER_ID DEADLINE scheduled=yes|no (in 5m)'. JSON: an array, one "
     "object a line, with order_id, deadline, deadline_ms, created_at_ms, scheduled, "
     "holds. Never creates a store."},
    {CLI_CMD_SWEEP, "sweep", NULL, "",
     "cancel lost orders, publish unconfirmed ones again",
     "Once: cancel directly, from the store, every order still pending --grace after "
     "its deadline (its expiry message was lost: a purged queue, a broker that lost its "
     "disk), then publish again every order whose message the broker never confirmed. "
     "Last, it publishes the order.cancelled events waiting in the outbox (those of the "
     "orders it cancelled, and any older ones); when the broker is out of reach or no "
     "queue is bound to the events exchange, a warning says so and they stay in the "
     "outbox for a consumer or the next sweep, without failing the run. "
     "Prints one key=value line and a sentence. Exits 0, or 1 when a part failed (the "
     "other part still ran; cancelling needs no broker). --dry-run connects to no "
     "broker and never creates a store."},
    {CLI_CMD_RECONCILE, "reconcile", NULL, "",
     "publish every pending order again (after moving to a new broker)",
     "Publishes the expiry message of EVERY pending order again, for its recorded "
     "deadline: after moving to a new broker or vhost (declare the topology there "
     "first). Messages left on the old broker are harmless: each order is cancelled "
     "once, and a paid one never. Shows progress on a terminal and prints the final "
     "count. Never creates a store."},
    {CLI_CMD_PARKED_LIST, "parked", "list", "", "show the parked messages",
     "Each parked message, oldest first, without removing or reordering them: when it "
     "was parked, attempts, order id (the message_id, else the body's order_id, else "
     "'-') and reason. JSON: {\"messages\": [{\"order_id\", \"message_id\", "
     "\"reason\", \"attempts\", \"parked_at_ms\", \"body_bytes\"}], \"listed\": N, "
     "\"more\": N}."},
    {CLI_CMD_PARKED_REPLAY, "parked", "replay", "(--all | ORDER_ID)",
     "send parked messages back to the expired queue",
     "Publishes parked messages back to the expired exchange without the parking "
     "headers, and removes each parked copy once the broker confirmed it. A replayed "
     "message is processed like any other. ORDER_ID: the messages whose message_id or "
     "body order_id is ORDER_ID (exit 4 when there is none)."},
    {CLI_CMD_TOPOLOGY, "topology", NULL, "(declare | export [--roles])",
     "declare the exchanges and queues | print them as definitions JSON",
     "declare: declare exchanges, queues and bindings on the broker (idempotent). "
     "export: print them as RabbitMQ definitions JSON, for the management UI or "
     "rabbitmqctl import_definitions. export --roles: print the users "
     "<prefix>-publisher, <prefix>-consumer and <prefix>-operator with the narrowest "
     "permissions each role needs and no password; import them once, then give each a "
     "password with rabbitmqctl change_password (importing again clears it)."},
    {CLI_CMD_DEMO, "demo", NULL, "", "a short end-to-end run against the broker",
     "Publishes seven orders: six with windows of the two shortest --classes (each at "
     "most 60s) and one 1.5 s longer than the second, which goes down the delay ladder; "
     "pays some in time and one too late, runs a consumer, and shows each order lapse. "
     "Needs a declared topology: lapse --classes 5s,8s topology declare."},
    {CLI_CMD_CONFIG, "config", NULL, "", "show the settings in effect",
     "Prints every setting with its value and where it came from: a flag, its "
     "environment variable, or the default. It takes every setting of every command "
     "(see each command's help). Passwords are shown as ***. JSON: "
     "{\"<setting>\":{\"value\":..,\"from\":..}}."},
    {CLI_CMD_HELP, "help", NULL, "[COMMAND]", "help on lapse or on one command",
     "Prints the same text as 'lapse --help' or 'lapse COMMAND --help'."},
};

const size_t cli_n_commands = sizeof cli_commands / sizeof cli_commands[0];

bool cli_option_accepts(const cli_option_t *opt, cli_cmd_t cmd) {
    return (opt->commands & CLI_IN(cmd)) != 0;
}

const cli_option_t *cli_option_find(const char *name, cli_cmd_t cmd) {
    for (size_t i = 0; i < cli_n_options; i++) {
        if (strcmp(cli_options[i].name, name) == 0 &&
            (cmd == CLI_CMD_COUNT_ || cli_option_accepts(&cli_options[i], cmd))) {
            return &cli_options[i];
        }
    }
    return NULL;
}

const cli_command_t *cli_command_find(const char *name, const char *action) {
    for (size_t i = 0; i < cli_n_commands; i++) {
        const cli_command_t *c = &cli_commands[i];
        if (strcmp(c->name, name) == 0 &&
            (c->action == NULL ? action == NULL
                               : action != NULL && strcmp(c->action, action) == 0)) {
            return c;
        }
    }
    return NULL;
}

bool cli_command_has_actions(const char *name) {
    for (size_t i = 0; i < cli_n_commands; i++) {
        if (cli_commands[i].action != NULL && strcmp(cli_commands[i].name, name) == 0) {
            return true;
        }
    }
    return false;
}

const char *cli_command_label(const cli_command_t *command, char *buf, size_t cap) {
    snprintf(buf, cap, "%s%s%s", command->name, command->action ? " " : "",
             command->action ? command->action : "");
    return buf;
}

/* SPDX-License-Identifier: MIT
 * lapse pending: pending orders by deadline, from the store (the broker cannot list what
 * waits in its queues). */
#include "cli.h"

#include <lapse/message.h>

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_LIMIT 100
#define ID_WIDTH      24 /* the order id column; longer ids push the line right */

static const char usage[] =
    "usage: lapse pending [--due-before TIME] [--limit N] [--json]\n"
    "  Pending orders by deadline, earliest first, read from the store.\n"
    "  --due-before T  only orders due before T: RFC 3339 (2026-12-01T18:00:00Z) or a\n"
    "                  duration from now (10m)\n"
    "  --limit N       at most N orders (default 100; 0 = all)\n"
    "  --json          a JSON array, one object a line: {\"order_id\",\"deadline\",\n"
    "                  \"deadline_ms\",\"created_at_ms\",\"scheduled\",\"holds\"}\n"
    "Text: one line per order, 'ORDER_ID DEADLINE scheduled=yes|no (in 5m00s)'.\n"
    "A note on stderr says when --limit cut the list short.\n";

typedef struct listing {
    bool as_json;
    size_t limit; /* what to print; 0: all */
    size_t printed;
    bool truncated;
    int64_t now_ms;
    bool failed; /* stdout or JSON encoding failed */
} listing_t;

/* "in 29m59s" or "overdue 3s", rounded down to the second, for a person. */
static void relative(int64_t delta_ms, char *buf, size_t cap) {
    const char *word = delta_ms >= 0 ? "in" : "overdue";
    long long s = (long long)((delta_ms >= 0 ? delta_ms : -delta_ms) / 1000);
    if (s >= 86400) {
        snprintf(buf, cap, "%s %lldd%02lldh", word, s / 86400, s % 86400 / 3600);
    } else if (s >= 3600) {
        snprintf(buf, cap, "%s %lldh%02lldm", word, s / 3600, s % 3600 / 60);
    } else if (s >= 60) {
        snprintf(buf, cap, "%s %lldm%02llds", word, s / 60, s % 60);
    } else {
        snprintf(buf, cap, "%s %llds", word, s);
    }
}

static int print_json(listing_t *l, const lapse_order_t *order, const char *deadline) {
    json_t *holds = json_array();
    for (size_t i = 0; holds && i < order->n_holds; i++) {
        json_array_append_new(holds, json_string(order->holds[i]));
    }
    json_t *obj =
        json_pack("{s:s, s:s, s:I, s:I, s:b, s:o}", "order_id", order->order_id,
                  "deadline", deadline, "deadline_ms", (json_int_t)order->deadline_ms,
                  "created_at_ms", (json_int_t)order->created_at_ms, "scheduled",
                  (int)order->scheduled, "holds", holds);
    char *text = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (!text) {
        l->failed = true;
        return 1;
    }
    printf("%s%s", l->printed > 0 ? ",\n" : "\n", text);
    free(text);
    return 0;
}

static int on_order(void *opaque, const lapse_order_t *order) {
    listing_t *l = opaque;
    if (l->limit > 0 && l->printed == l->limit) {
        l->truncated = true; /* the one extra order asked for */
        return 1;
    }
    char deadline[LAPSE_RFC3339_LEN];
    lapse_time_format_rfc3339(order->deadline_ms, deadline);
    if (l->as_json) {
        if (print_json(l, order, deadline) != 0) {
            return 1;
        }
    } else {
        char when[48];
        relative(order->deadline_ms - l->now_ms, when, sizeof when);
        printf("%-*s %s scheduled=%-3s (%s)\n", ID_WIDTH, order->order_id, deadline,
               order->scheduled ? "yes" : "no", when);
    }
    l->printed++;
    if (ferror(stdout)) {
        l->failed = true;
        return 1;
    }
    return 0;
}

static int parse_limit(const char *text, size_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (text[0] < '0' || text[0] > '9' || *end != '\0' || errno != 0 ||
        v > (unsigned long long)(SIZE_MAX - 1)) {
        return -1;
    }
    *out = (size_t)v;
    return 0;
}

int cmd_pending(cli_t *cli, int argc, char **argv) {
    static const struct option opts[] = {{"due-before", required_argument, NULL, 'd'},
                                         {"limit", required_argument, NULL, 'l'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    listing_t l = {.limit = DEFAULT_LIMIT, .now_ms = lapse_clock_now_ms()};
    lapse_pending_filter_t filter;
    lapse_pending_filter_init(&filter);
    filter.with_holds = true;
    int opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (opt) {
            case 'h':
                fputs(usage, stdout);
                return CLI_EXIT_OK;
            case 'j':
                l.as_json = true;
                break;
            case 'l':
                if (parse_limit(optarg, &l.limit) != 0) {
                    return cli_usage_error("pending", "invalid --limit '%s' (0 = all)",
                                           optarg);
                }
                break;
            case 'd': {
                int64_t ms;
                if (lapse_time_parse_rfc3339(optarg, &ms) == LAPSE_OK) {
                    filter.due_before_ms = ms;
                } else if (lapse_duration_parse(optarg, &ms) == LAPSE_OK &&
                           ms <= INT64_MAX - l.now_ms) {
                    filter.due_before_ms = l.now_ms + ms;
                } else {
                    return cli_usage_error("pending",
                                           "invalid --due-before '%s' (RFC 3339 time or "
                                           "a duration from now such as 10m)",
                                           optarg);
                }
                break;
            }
            default:
                return cli_usage_error("pending", "unknown or incomplete option '%s'",
                                       argv[optind - 1]);
        }
    }
    if (optind != argc) {
        return cli_usage_error("pending", "unexpected argument '%s'", argv[optind]);
    }
    /* One more than shown, to tell whether the limit cut the list short. */
    filter.limit = l.limit > 0 ? l.limit + 1 : 0;
    int code = CLI_EXIT_OK;
    lapse_store_t *store = cli_open_store(cli, &code);
    if (!store) {
        return code;
    }
    if (l.as_json) {
        fputs("[", stdout);
    }
    lapse_error_t err = {0};
    lapse_status_t rc = lapse_store_pending(store, &filter, on_order, &l, &err);
    if (l.as_json) {
        fputs(l.printed > 0 ? "\n]\n" : "]\n", stdout);
    }
    lapse_store_close(store);
    if (fflush(stdout) != 0 || l.failed) {
        fprintf(stderr, "lapse pending: cannot write the listing\n");
        return CLI_EXIT_FAILED;
    }
    if (rc != LAPSE_OK) {
        code = cli_fail(rc, &err, "pending");
        return code == CLI_EXIT_USAGE ? CLI_EXIT_FAILED : code;
    }
    if (l.truncated) {
        fprintf(stderr,
                "lapse pending: showing the first %zu; more are pending (--limit 0 "
                "shows all)\n",
                l.limit);
    }
    return CLI_EXIT_OK;
}

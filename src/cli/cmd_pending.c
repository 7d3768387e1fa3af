/* SPDX-License-Identifier: MIT
 * lapse pending: pending orders by deadline, from the store (the broker cannot list what
 * waits in its queues). */
#include "cli.h"

#include <lapse/message.h>

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_LIMIT 100
#define ID_WIDTH      24 /* the order id column; longer ids push the line right */

typedef struct listing {
    bool as_json;
    size_t limit; /* what to print; 0: all */
    size_t printed;
    bool truncated;
    int64_t now_ms;
    bool failed; /* stdout or JSON encoding failed */
} listing_t;

/* "in 29m59s" or "overdue 3s", to the second, for a person. */
static void relative(int64_t delta_ms, char *buf, size_t cap) {
    char span[LAPSE_DURATION_DISPLAY_LEN];
    int64_t s = (delta_ms >= 0 ? delta_ms : -delta_ms) / 1000;
    lapse_duration_display(s * 1000, span, sizeof span);
    snprintf(buf, cap, "%s %s", delta_ms >= 0 ? "in" : "overdue", span);
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
    listing_t l = {.limit = DEFAULT_LIMIT,
                   .now_ms = lapse_clock_now_ms(),
                   .as_json = cli_opt(cli, CLI_OPT_JSON) != NULL};
    lapse_pending_filter_t filter;
    lapse_pending_filter_init(&filter);
    filter.with_holds = true;
    const char *limit = cli_opt(cli, CLI_OPT_LIMIT);
    if (limit && parse_limit(limit, &l.limit) != 0) {
        return cli_usage_error("pending", "invalid --limit '%s' (0 = all)", limit);
    }
    const char *due = cli_opt(cli, CLI_OPT_DUE_BEFORE);
    if (due) {
        int64_t ms;
        if (lapse_time_parse_rfc3339(due, &ms) == LAPSE_OK) {
            filter.due_before_ms = ms;
        } else if (lapse_duration_parse(due, &ms) == LAPSE_OK &&
                   ms <= INT64_MAX - l.now_ms) {
            filter.due_before_ms = l.now_ms + ms;
        } else {
            return cli_usage_error("pending",
                                   "invalid --due-before '%s' (RFC 3339 time or a "
                                   "duration from now such as 10m)",
                                   due);
        }
    }
    if (argc != 0) {
        return cli_usage_error("pending", "unexpected argument '%s'", argv[0]);
    }
    /* One more than shown, to tell whether the limit cut the list short. */
    filter.limit = l.limit > 0 ? l.limit + 1 : 0;
    int code = CLI_EXIT_OK;
    lapse_store_t *store = cli_open_store(cli, LAPSE_STORE_MUST_EXIST, &code);
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
    if (l.failed) {
        /* A write error on stdout is reported by main; a JSON one is out of memory. */
        if (!ferror(stdout)) {
            cli_errorf("pending: out of memory");
        }
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

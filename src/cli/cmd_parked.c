/* SPDX-License-Identifier: MIT
 * lapse parked list|replay: look at parked messages, send them back once fixed. */
#include "cli.h"
#include "config_int.h"

#include <lapse/parked.h>

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define LIMIT_MAX 1000000

typedef struct listing {
    json_t *messages; /* --json: the array being built; NULL for text */
    size_t listed;
} listing_t;

static void print_text(const lapse_parked_msg_t *m) {
    char when[LAPSE_RFC3339_LEN] = "-";
    if (m->parked_at_ms >= 0) {
        lapse_time_format_rfc3339(m->parked_at_ms, when);
    }
    /* Both come from a message that may be malformed: no control byte reaches the
     * terminal. */
    char order_id[sizeof m->order_id * 4];
    char reason[sizeof m->reason * 4];
    printf("%-24s %8lld  %-24s  %s\n", when, (long long)m->attempts,
           lapse__escape_ctl(m->order_id, order_id, sizeof order_id),
           m->reason[0] ? lapse__escape_ctl(m->reason, reason, sizeof reason) : "-");
}

static void on_listed(void *opaque, const lapse_parked_msg_t *m) {
    listing_t *l = opaque;
    if (l->listed++ == 0 && !l->messages) {
        printf("%-24s %8s  %-24s  %s\n", "parked at", "attempts", "order id", "reason");
    }
    if (!l->messages) {
        print_text(m);
        return;
    }
    json_t *o =
        json_pack("{s:s, s:o, s:o, s:I, s:o, s:I}", "order_id", m->order_id, "message_id",
                  m->message_id[0] ? json_string(m->message_id) : json_null(), "reason",
                  m->reason[0] ? json_string(m->reason) : json_null(), "attempts",
                  (json_int_t)m->attempts, "parked_at_ms",
                  m->parked_at_ms >= 0 ? json_integer(m->parked_at_ms) : json_null(),
                  "body_bytes", (json_int_t)m->body_len);
    json_array_append_new(l->messages, o);
}

static int parse_limit(const char *text, size_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || *end || text[0] == '-' || v == 0 || v > LIMIT_MAX) {
        return -1;
    }
    *out = (size_t)v;
    return 0;
}

int cmd_parked_list(cli_t *cli, int argc, char **argv) {
    bool as_json = cli_opt(cli, CLI_OPT_JSON) != NULL;
    size_t limit = LAPSE_PARKED_LIST_LIMIT;
    const char *limit_text = cli_opt(cli, CLI_OPT_LIMIT);
    if (limit_text && parse_limit(limit_text, &limit) != 0) {
        return cli_usage_error("parked list",
                               "--limit wants a number from 1 to %d, not '%s'", LIMIT_MAX,
                               limit_text);
    }
    if (argc > 0) {
        return cli_usage_error("parked list", "unexpected argument '%s'", argv[0]);
    }
    listing_t l = {.messages = as_json ? json_array() : NULL};
    size_t more = 0;
    lapse_error_t err = {0};
    lapse_status_t rc = lapse_parked_list(cli->cfg, limit, on_listed, &l, &more, &err);
    if (rc != LAPSE_OK) {
        json_decref(l.messages);
        int code = cli_fail(rc, &err, "parked list");
        return code == CLI_EXIT_USAGE ? CLI_EXIT_FAILED : code;
    }
    if (as_json) {
        json_t *root = json_pack("{s:o, s:I, s:I}", "messages", l.messages, "listed",
                                 (json_int_t)l.listed, "more", (json_int_t)more);
        char *text = root ? json_dumps(root, JSON_COMPACT) : NULL;
        json_decref(root);
        if (!text) {
            fprintf(stderr, "lapse parked list: out of memory\n");
            return CLI_EXIT_FAILED;
        }
        puts(text);
        free(text);
    } else if (l.listed == 0) {
        printf("no parked messages\n");
    } else if (more > 0) {
        printf("\n%zu parked messages listed, %zu more not listed (--limit %zu)\n",
               l.listed, more, limit);
    } else {
        printf("\n%zu parked message%s\n", l.listed, l.listed == 1 ? "" : "s");
    }
    return CLI_EXIT_OK;
}

int cmd_parked_replay(cli_t *cli, int argc, char **argv) {
    bool all = cli_opt(cli, CLI_OPT_ALL) != NULL;
    int n_ids = argc;
    if (all == (n_ids > 0) || n_ids > 1) {
        return cli_usage_error("parked replay", "expected either --all or one ORDER_ID");
    }
    const char *order_id = all ? NULL : argv[0];
    size_t replayed = 0;
    lapse_error_t err = {0};
    lapse_status_t rc =
        lapse_parked_replay(cli->cfg, order_id, NULL, NULL, &replayed, &err);
    if (rc == LAPSE_ERR_INVALID) {
        return cli_usage_error("parked replay", "%s", err.text);
    }
    if (rc == LAPSE_OK && order_id && replayed == 0) {
        cli_say("parked replay", "no parked message for order '%s'", order_id);
        return CLI_EXIT_NOT_FOUND;
    }
    if (rc == LAPSE_OK || replayed > 0) {
        printf("replayed %zu parked message%s to %s.expired\n", replayed,
               replayed == 1 ? "" : "s", lapse_config_get(cli->cfg, "prefix"));
    }
    if (rc != LAPSE_OK) {
        int code = cli_fail(rc, &err, "parked replay");
        return code == CLI_EXIT_USAGE ? CLI_EXIT_FAILED : code;
    }
    return CLI_EXIT_OK;
}

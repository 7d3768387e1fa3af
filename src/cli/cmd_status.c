/* SPDX-License-Identifier: MIT
 * lapse status: queue depths and order counts, or one order. */
#include "cli.h"

#include <lapse/topology.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct queues {
    json_t *json; /* {"<name>":{"messages":N,"consumers":N}} */
    json_t *ttl;  /* {"<name>":ttl_ms}, for the text table */
} queues_t;

static void add_queue(void *opaque, const char *queue, int64_t ttl_ms, int64_t messages,
                      int64_t consumers) {
    queues_t *q = opaque;
    json_object_set_new(q->json, queue,
                        json_pack("{s:I, s:I}", "messages", (json_int_t)messages,
                                  "consumers", (json_int_t)consumers));
    json_object_set_new(q->ttl, queue, json_integer(ttl_ms));
}

static json_t *time_or_null(int64_t ms) {
    return ms < 0 ? json_null() : json_integer(ms);
}

static int print_json(json_t *root) {
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text) {
        return CLI_EXIT_FAILED;
    }
    puts(text);
    free(text);
    return CLI_EXIT_OK;
}

static int order_status(lapse_store_t *store, const char *order_id, int as_json) {
    lapse_order_t order;
    lapse_order_init(&order);
    lapse_error_t err = {0};
    lapse_status_t rc = lapse_store_get(store, order_id, &order, &err);
    if (rc == LAPSE_ERR_STORE_NOT_FOUND) {
        cli_say("status", "%s: no such order", order_id);
        return CLI_EXIT_NOT_FOUND;
    }
    if (rc != LAPSE_OK) {
        return cli_fail(rc, &err, "status");
    }
    int code = CLI_EXIT_OK;
    if (as_json) {
        json_t *holds = json_array();
        for (size_t i = 0; i < order.n_holds; i++) {
            json_array_append_new(holds, json_string(order.holds[i]));
        }
        code = print_json(json_pack(
            "{s:s, s:s, s:I, s:I, s:o, s:o, s:o}", "order_id", order.order_id, "status",
            lapse_order_status_name(order.status), "deadline_ms",
            (json_int_t)order.deadline_ms, "created_at_ms",
            (json_int_t)order.created_at_ms, "paid_at_ms", time_or_null(order.paid_at_ms),
            "cancelled_at_ms", time_or_null(order.cancelled_at_ms), "holds", holds));
    } else {
        char deadline[LAPSE_RFC3339_LEN], created[LAPSE_RFC3339_LEN];
        lapse_time_format_rfc3339(order.deadline_ms, deadline);
        lapse_time_format_rfc3339(order.created_at_ms, created);
        printf("order_id:  %s\nstatus:    %s\ncreated:   %s\ndeadline:  %s\n",
               order.order_id, lapse_order_status_name(order.status), created, deadline);
        int64_t at =
            order.status == LAPSE_ORDER_PAID ? order.paid_at_ms : order.cancelled_at_ms;
        if (at >= 0) {
            char when[LAPSE_RFC3339_LEN];
            lapse_time_format_rfc3339(at, when);
            printf("%-10s %s\n",
                   order.status == LAPSE_ORDER_PAID ? "paid:" : "cancelled:", when);
        }
        printf("scheduled: %s\nholds:    ", order.scheduled ? "yes" : "no");
        for (size_t i = 0; i < order.n_holds; i++) {
            printf(" %s", order.holds[i]);
        }
        printf("%s\n", order.n_holds ? "" : " -");
    }
    lapse_order_clear(&order);
    return code;
}

static int overview(cli_t *cli, lapse_store_t *store, int as_json) {
    lapse_error_t err = {0};
    int64_t counts[3];
    int64_t outbox = 0;
    lapse_status_t rc = lapse_store_count(store, counts, &err);
    if (rc == LAPSE_OK) {
        rc = lapse_store_events_count(store, &outbox, &err);
    }
    if (rc != LAPSE_OK) {
        return cli_fail(rc, &err, "status");
    }
    queues_t q = {.json = json_object(), .ttl = json_object()};
    rc = lapse_topology_inspect(cli->cfg, add_queue, &q, &err);
    if (rc != LAPSE_OK) {
        json_decref(q.json);
        json_decref(q.ttl);
        int code = cli_fail(rc, &err, "status");
        return code == CLI_EXIT_USAGE ? CLI_EXIT_FAILED : code;
    }
    if (as_json) {
        json_decref(q.ttl);
        return print_json(json_pack("{s:o, s:{s:I, s:I, s:I}, s:{s:I}}", "queues", q.json,
                                    "orders", "pending",
                                    (json_int_t)counts[LAPSE_ORDER_PENDING], "paid",
                                    (json_int_t)counts[LAPSE_ORDER_PAID], "cancelled",
                                    (json_int_t)counts[LAPSE_ORDER_CANCELLED], "outbox",
                                    "pending", (json_int_t)outbox));
    }
    printf("%-40s %14s %10s %10s\n", "queue", "holds for", "messages", "consumers");
    const char *name;
    json_t *stat;
    json_object_foreach(q.json, name, stat) {
        char ttl[LAPSE_DURATION_DISPLAY_LEN] = "-";
        json_int_t ttl_ms = json_integer_value(json_object_get(q.ttl, name));
        if (ttl_ms > 0) {
            lapse_duration_display(ttl_ms, ttl, sizeof ttl);
        }
        printf("%-40s %14s %10lld %10lld\n", name, ttl,
               (long long)json_integer_value(json_object_get(stat, "messages")),
               (long long)json_integer_value(json_object_get(stat, "consumers")));
    }
    printf("\norders: pending=%lld paid=%lld cancelled=%lld\n",
           (long long)counts[LAPSE_ORDER_PENDING], (long long)counts[LAPSE_ORDER_PAID],
           (long long)counts[LAPSE_ORDER_CANCELLED]);
    /* Events wait here while no queue is bound to the events exchange, or while the
     * broker is out of reach. */
    printf("outbox: pending=%lld (order.cancelled events not yet taken by a queue)\n",
           (long long)outbox);
    json_decref(q.json);
    json_decref(q.ttl);
    return CLI_EXIT_OK;
}

int cmd_status(cli_t *cli, int argc, char **argv) {
    int as_json = cli_opt(cli, CLI_OPT_JSON) != NULL;
    if (argc > 1) {
        return cli_usage_error("status", "at most one ORDER_ID");
    }
    int code = CLI_EXIT_OK;
    lapse_store_t *store = cli_open_store(cli, LAPSE_STORE_MUST_EXIST, &code);
    if (!store) {
        return code;
    }
    code =
        argc == 1 ? order_status(store, argv[0], as_json) : overview(cli, store, as_json);
    lapse_store_close(store);
    return code;
}

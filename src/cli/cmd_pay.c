/* SPDX-License-Identifier: MIT
 * lapse pay: pending and before its deadline -> paid. */
#include "cli.h"

#include <lapse/message.h>

#include <string.h>
#include <unistd.h>

int cmd_pay(cli_t *cli, int argc, char **argv) {
    if (argc != 1) {
        return cli_usage_error("pay", "expected exactly one ORDER_ID");
    }
    const char *order_id = argv[0];
    if (!lapse_order_id_is_valid(order_id, strlen(order_id))) {
        return cli_usage_error("pay", "invalid order id '%s'", order_id);
    }
    int code = CLI_EXIT_OK;
    /* A payment for a store that is not there is a mistyped store, not an order to
     * create one for. */
    lapse_store_t *store = cli_open_store(cli, LAPSE_STORE_MUST_EXIST, &code);
    if (!store) {
        return code;
    }
    lapse_error_t err = {0};
    lapse_status_t rc;
    /* The payment time is taken once: a retry after a busy store must not turn an
     * on-time payment into a late one, nor a late one into an on-time one. */
    int64_t now = lapse_clock_now_ms();
    for (unsigned attempt = 0;; attempt++) {
        rc = lapse_store_pay(store, order_id, now, &err);
        if (rc != LAPSE_ERR_STORE_BUSY || attempt == 6) {
            break;
        }
        usleep((100u << attempt) * 1000u);
    }
    lapse_order_t order;
    lapse_order_init(&order);
    char when[LAPSE_RFC3339_LEN] = "";
    if (rc != LAPSE_OK && rc != LAPSE_ERR_STORE_NOT_FOUND &&
        lapse_store_get(store, order_id, &order, NULL) == LAPSE_OK) {
        lapse_time_format_rfc3339(rc == LAPSE_ERR_STORE_LAPSED ? order.deadline_ms
                                                               : order.cancelled_at_ms,
                                  when);
    }
    switch (rc) {
        case LAPSE_OK:
            printf("paid order_id=%s\n", order_id);
            break;
        case LAPSE_ERR_STORE_LAPSED:
            cli_say("pay", "%s: payment window lapsed at %s", order_id, when);
            break;
        case LAPSE_ERR_STORE_STATE:
            cli_say("pay", "%s: order was cancelled at %s", order_id, when);
            break;
        case LAPSE_ERR_STORE_NOT_FOUND:
            cli_say("pay", "%s: no such order", order_id);
            break;
        default:
            cli_fail(rc, &err, "pay");
    }
    lapse_order_clear(&order);
    lapse_store_close(store);
    return cli_exit_code(rc);
}

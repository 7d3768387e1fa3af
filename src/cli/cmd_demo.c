/* SPDX-License-Identifier: MIT
 * lapse demo: a handful of orders with short windows, a real consumer, live output. */
#include "cli.h"
#include "config_int.h"

#include <lapse/publisher.h>

#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

typedef struct demo_order {
    const char *name;
    int cls;        /* 0: shortest class, 1: the next */
    int64_t pay_at; /* ms after publishing, relative to the window; -1: never */
    int pay_late;   /* pay_at is after the deadline */
    const char *holds[3];
    lapse_order_status_t expect;
    /* runtime */
    char id[LAPSE_ORDER_ID_MAX + 1];
    int64_t deadline_ms;
    int64_t timeout_ms;
    lapse_order_status_t seen;
    int64_t at_ms;
    int paid_tried;
} demo_order_t;

static void on_published(void *opaque, uint64_t ref, const char *order_id,
                         lapse_status_t rc, const char *reason) {
    int *failed = opaque;
    (void)ref;
    if (rc != LAPSE_OK) {
        cli_say("demo", "publish %s failed: %s", order_id, reason);
        (*failed)++;
    }
}

static int64_t elapsed(int64_t t0) {
    return lapse_clock_now_ms() - t0;
}

static pid_t start_consumer(cli_t *cli) {
    /* The child takes this run's settings through their variables; the URL and the store
     * URI as given, since lapse_config_get shows them without their passwords. */
    for (size_t i = 0; lapse_config_property_name(i); i++) {
        const char *name = lapse_config_property_name(i);
        const char *env = lapse_config_property_env(name);
        if (env) {
            const char *value = strcmp(name, "amqp_url") == 0 ? cli->cfg->amqp_url
                                : strcmp(name, "store") == 0
                                    ? cli->cfg->store
                                    : lapse_config_get(cli->cfg, name);
            setenv(env, value, 1);
        }
    }
    char *argv[] = {(char *)"lapse", (char *)"consume", NULL};
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ) != 0) {
        return -1;
    }
    return pid;
}

static void show_holds(lapse_store_t *store, demo_order_t *o) {
    lapse_order_t order;
    lapse_order_init(&order);
    if (lapse_store_get(store, o->id, &order, NULL) == LAPSE_OK) {
        for (size_t i = 0; i < order.n_holds; i++) {
            printf("%s%s", i ? ", " : " released ", order.holds[i]);
        }
    }
    lapse_order_clear(&order);
}

static void poll_orders(lapse_store_t *store, demo_order_t *orders, size_t n,
                        int64_t t0) {
    for (size_t i = 0; i < n; i++) {
        demo_order_t *o = &orders[i];
        lapse_order_t order;
        lapse_order_init(&order);
        if (lapse_store_get(store, o->id, &order, NULL) == LAPSE_OK &&
            order.status != o->seen) {
            o->seen = order.status;
            if (order.status == LAPSE_ORDER_CANCELLED) {
                o->at_ms = order.cancelled_at_ms;
                printf("[%6.2fs] %-22s LAPSED  cancelled %lld ms after its deadline;",
                       elapsed(t0) / 1000.0, o->name,
                       (long long)(order.cancelled_at_ms - order.deadline_ms));
                show_holds(store, o);
                printf("\n");
            }
        }
        lapse_order_clear(&order);
    }
    fflush(stdout);
}

int cmd_demo(cli_t *cli, int argc, char **argv) {
    if (argc != 0) {
        return cli_usage_error("demo", "unexpected argument '%s'", argv[0]);
    }
    int64_t windows[3]; /* the two classes, and a window that is no class (the ladder) */
    char classes[256];
    snprintf(classes, sizeof classes, "%s", lapse_config_get(cli->cfg, "classes"));
    size_t n_windows = 0;
    for (char *save = NULL, *tok = strtok_r(classes, ",", &save); tok && n_windows < 2;
         tok = strtok_r(NULL, ",", &save)) {
        lapse_duration_parse(tok, &windows[n_windows++]);
    }
    if (n_windows == 1) {
        windows[n_windows++] = windows[0];
    }
    windows[2] = windows[1] + 1500;
    if (windows[1] > 60000) {
        return cli_usage_error("demo",
                               "the demo needs classes of at most 60s (got %s); try "
                               "--classes 5s,8s",
                               lapse_config_get(cli->cfg, "classes"));
    }
    demo_order_t orders[] = {
        {.name = "pizza (paid)",
         .cls = 0,
         .pay_at = 1000,
         .pay_late = 0,
         .holds = {"oven-slot-7"},
         .expect = LAPSE_ORDER_PAID},
        {.name = "pizza (unpaid)",
         .cls = 0,
         .pay_at = -1,
         .pay_late = 0,
         .holds = {"oven-slot-8", "driver-3"},
         .expect = LAPSE_ORDER_CANCELLED},
        {.name = "clinic (paid)",
         .cls = 1,
         .pay_at = 2500,
         .pay_late = 0,
         .holds = {"dr-lee-10:30"},
         .expect = LAPSE_ORDER_PAID},
        {.name = "train (unpaid)",
         .cls = 1,
         .pay_at = -1,
         .pay_late = 0,
         .holds = {"seat-12A", "seat-12B"},
         .expect = LAPSE_ORDER_CANCELLED},
        {.name = "train (paid too late)",
         .cls = 0,
         .pay_at = 1500,
         .pay_late = 1,
         .holds = {"seat-14C"},
         .expect = LAPSE_ORDER_CANCELLED},
        {.name = "hotel (unpaid)",
         .cls = 1,
         .pay_at = -1,
         .pay_late = 0,
         .holds = {"room-204"},
         .expect = LAPSE_ORDER_CANCELLED},
        {.name = "concert (ladder)",
         .cls = 2,
         .pay_at = -1,
         .pay_late = 0,
         .holds = {"row-F-seat-9"},
         .expect = LAPSE_ORDER_CANCELLED},
    };
    size_t n = sizeof orders / sizeof orders[0];

    int code = CLI_EXIT_OK;
    lapse_store_t *store = cli_open_store(cli, 0, &code);
    if (!store) {
        return code;
    }
    pid_t child = start_consumer(cli);
    if (child < 0) {
        cli_say("demo", "cannot start the consumer");
        lapse_store_close(store);
        return CLI_EXIT_FAILED;
    }
    int failed = 0;
    lapse_status_t rc;
    lapse_error_t err = {0};
    lapse_publisher_t *pub =
        lapse_publisher_open(cli->cfg, store, on_published, &failed, &rc, &err);
    if (!pub) {
        code = cli_fail(rc, &err, "demo: connect");
        goto out;
    }
    long run = (long)time(NULL);
    int64_t t0 = lapse_clock_now_ms();
    printf("lapse demo: %zu orders, windows %lld ms and %lld ms; consumer pid %d\n\n", n,
           (long long)windows[0], (long long)windows[1], (int)child);
    for (size_t i = 0; i < n; i++) {
        demo_order_t *o = &orders[i];
        o->timeout_ms = windows[o->cls];
        snprintf(o->id, sizeof o->id, "demo-%ld-%zu", run, i + 1);
        size_t n_holds = 0;
        while (n_holds < 3 && o->holds[n_holds]) {
            n_holds++;
        }
        int64_t now = lapse_clock_now_ms();
        o->deadline_ms = now + o->timeout_ms;
        o->seen = LAPSE_ORDER_PENDING;
        if (o->pay_late) {
            o->pay_at = o->timeout_ms + o->pay_at; /* past the deadline */
        }
        lapse_new_order_t order = {.order_id = o->id,
                                   .deadline_ms = o->deadline_ms,
                                   .created_at_ms = now,
                                   .holds = o->holds,
                                   .n_holds = n_holds};
        /* The last window matches no class: an absolute deadline, down the ladder. */
        rc =
            lapse_publisher_submit(pub, &order, o->cls == 2 ? 0 : o->timeout_ms, i, &err);
    }
    if (rc == LAPSE_OK) {
        rc = lapse_publisher_flush(pub, &err);
    }
    lapse_publisher_close(pub);
    if (rc != LAPSE_OK || failed) {
        code = cli_fail(rc != LAPSE_OK ? rc : LAPSE_ERR_BROKER_CLOSED, &err,
                        "demo: publish");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        printf("[%6.2fs] %-22s PUBLISHED %s window %lld ms, holds %s%s%s\n",
               elapsed(t0) / 1000.0, orders[i].name, orders[i].id,
               (long long)orders[i].timeout_ms, orders[i].holds[0],
               orders[i].holds[1] ? ", " : "",
               orders[i].holds[1] ? orders[i].holds[1] : "");
    }
    int64_t end = windows[2] + 8000;
    int settled = 0;
    while (elapsed(t0) < end && !settled) {
        for (size_t i = 0; i < n; i++) {
            demo_order_t *o = &orders[i];
            if (o->pay_at >= 0 && !o->paid_tried && elapsed(t0) >= o->pay_at) {
                o->paid_tried = 1;
                rc = lapse_store_pay(store, o->id, lapse_clock_now_ms(), &err);
                printf("[%6.2fs] %-22s PAY     %s\n", elapsed(t0) / 1000.0, o->name,
                       rc == LAPSE_OK                 ? "accepted: paid in time"
                       : rc == LAPSE_ERR_STORE_LAPSED ? "refused: the window has lapsed"
                       : rc == LAPSE_ERR_STORE_STATE
                           ? "refused: already cancelled when its window lapsed"
                           : lapse_strerror(rc));
                if (rc == LAPSE_OK) {
                    o->seen = LAPSE_ORDER_PAID;
                }
            }
        }
        poll_orders(store, orders, n, t0);
        settled = 1;
        for (size_t i = 0; i < n; i++) {
            if (orders[i].seen != orders[i].expect ||
                (orders[i].pay_at >= 0 && !orders[i].paid_tried)) {
                settled = 0;
            }
        }
        usleep(50000);
    }
    printf("\n%-22s %-10s %-10s %s\n", "order", "expected", "ended", "");
    int wrong = 0;
    for (size_t i = 0; i < n; i++) {
        lapse_order_t order;
        lapse_order_init(&order);
        lapse_store_get(store, orders[i].id, &order, NULL);
        int ok = order.status == orders[i].expect;
        wrong += !ok;
        printf("%-22s %-10s %-10s %s\n", orders[i].name,
               lapse_order_status_name(orders[i].expect),
               lapse_order_status_name(order.status), ok ? "ok" : "WRONG");
        lapse_order_clear(&order);
    }
    printf("\nsummary: %zu orders, %d as expected, %d wrong\n", n, (int)n - wrong, wrong);
    code = wrong ? CLI_EXIT_FAILED : CLI_EXIT_OK;
out:
    kill(child, SIGTERM);
    int status = 0;
    waitpid(child, &status, 0);
    if (code == CLI_EXIT_OK && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        cli_say("demo", "the consumer did not exit cleanly");
        code = CLI_EXIT_FAILED;
    }
    lapse_store_close(store);
    return code;
}

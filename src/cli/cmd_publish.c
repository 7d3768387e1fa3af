/* SPDX-License-Identifier: MIT
 * lapse publish: one order, or a batch of lines, recorded and published with confirms. */
#include "cli.h"
#include "clock_int.h"
#include "line_reader.h"

#include <lapse/batch.h>
#include <lapse/publisher.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_HOLDS      64
#define CONNECT_TRIES  5
#define PROGRESS_EVERY 200 /* ms between progress lines on a terminal */
#define IDLE_FLUSH_MS  20  /* input paused this long: publish what is held */
#define STOP_CHECK_MS  250 /* idle input: how often the stop flag is looked at */

typedef struct outcome {
    size_t ok;
    size_t failed;
    lapse_status_t last_rc;
    int refused_only;
} outcome_t;

static void on_single(void *opaque, uint64_t ref, const char *order_id, lapse_status_t rc,
                      const char *reason) {
    (void)ref;
    outcome_t *o = opaque;
    o->last_rc = rc;
    if (rc == LAPSE_OK) {
        o->ok++;
    } else {
        o->failed++;
        cli_say("publish", "%s: %s (%s)", order_id, reason, lapse_status_name(rc));
    }
}

static void on_line(void *opaque, uint64_t line, const char *order_id, lapse_status_t rc,
                    const char *reason) {
    outcome_t *o = opaque;
    if (rc == LAPSE_OK) {
        o->ok++;
        return;
    }
    o->failed++;
    o->last_rc = rc;
    cli_say("publish", "line %llu: %s: %s (%s)", (unsigned long long)line, order_id,
            reason, lapse_status_name(rc));
}

static lapse_publisher_t *open_publisher(cli_t *cli, lapse_store_t *store,
                                         lapse_publish_cb cb, outcome_t *o, int *code) {
    lapse_status_t rc = LAPSE_OK;
    lapse_error_t err = {0};
    for (unsigned attempt = 0; attempt < CONNECT_TRIES; attempt++) {
        lapse_publisher_t *pub = lapse_publisher_open(cli->cfg, store, cb, o, &rc, &err);
        if (pub) {
            /* SIGTERM/SIGINT end every wait (a blocked broker, confirms, a reconnect)
             * within about a second; what was not confirmed is reported as failed. */
            lapse_publisher_set_stop(pub, cli_install_stop_handlers());
            return pub;
        }
        if (!lapse_status_is_retriable(rc) || attempt + 1 == CONNECT_TRIES) {
            break;
        }
        unsigned delay = 250u << attempt;
        cli_say("publish", "%s; retrying in %u ms", err.text, delay);
        usleep(delay * 1000u);
    }
    *code = cli_fail(rc, &err, "connect to the broker");
    return NULL;
}

/* The clock a deadline from a timeout starts at: the store's own when it has one
 * (PostgreSQL's server, DESIGN.md "One clock decides"), else this host's. */
static int64_t deciding_now(lapse_store_t *store) {
    int64_t now = lapse_clock_now_ms();
    (void)lapse_store_now(store, &now, NULL); /* unchanged when it fails */
    return now;
}

/* How far a --timeout may land from the shop's deadline and still agree with it: the
 * shop computed its deadline a moment before lapse reads the clock. */
#define TIMEOUT_AGREES_MS 2000

/*
 * With an orders map the shop's row holds the deadline (DESIGN.md, "The shop's own
 * orders table"): *deadline_ms gets it. A deadline the caller gave (given_ms > 0, or a
 * timeout_ms > 0 from now) must agree with it. Returns LAPSE_OK, or the refusal in err:
 * LAPSE_ERR_STORE_NOT_FOUND (no such row), LAPSE_ERR_STORE_STATE (not pending),
 * LAPSE_ERR_INVALID (a contradiction), or a store failure.
 */
static lapse_status_t row_deadline(lapse_store_t *store, const char *order_id,
                                   int64_t timeout_ms, int64_t given_ms, int64_t now,
                                   int64_t *deadline_ms, lapse_error_t *err) {
    lapse_order_t row;
    lapse_order_init(&row);
    lapse_status_t rc = lapse_store_get(store, order_id, &row, err);
    if (rc == LAPSE_ERR_STORE_NOT_FOUND) {
        rc = lapse_error_set(err, rc, "order %s is not in the shop's orders table",
                             order_id);
    } else if (rc == LAPSE_OK && row.status != LAPSE_ORDER_PENDING) {
        rc = lapse_error_set(err, LAPSE_ERR_STORE_STATE,
                             "order %s is %s in the shop's table", order_id,
                             lapse_order_status_name(row.status));
    }
    char at[LAPSE_RFC3339_LEN];
    lapse_time_format_rfc3339(row.deadline_ms, at);
    int64_t off = timeout_ms > 0 ? lapse__time_add(now, timeout_ms) - row.deadline_ms : 0;
    if (rc == LAPSE_OK && given_ms > 0 && timeout_ms == 0 &&
        given_ms != row.deadline_ms) {
        rc = lapse_error_set(err, LAPSE_ERR_INVALID,
                             "--deadline contradicts the shop's row of %s (deadline %s)",
                             order_id, at);
    } else if (rc == LAPSE_OK && (off > TIMEOUT_AGREES_MS || off < -TIMEOUT_AGREES_MS)) {
        rc = lapse_error_set(err, LAPSE_ERR_INVALID,
                             "--timeout contradicts the shop's row of %s (deadline %s)",
                             order_id, at);
    }
    *deadline_ms = row.deadline_ms;
    lapse_order_clear(&row);
    return rc;
}

/* timeout_ms > 0: deadline now + timeout; else deadline_ms as given; with an orders map,
 * the shop's (explicit: the caller gave timeout_ms or deadline_ms; it must agree). */
static int publish_one(cli_t *cli, const char *order_id, int64_t timeout_ms,
                       int64_t deadline_ms, bool explicit, const char **holds,
                       size_t n_holds) {
    int code = CLI_EXIT_OK;
    lapse_store_t *store = cli_open_store(cli, 0, &code);
    if (!store) {
        return code;
    }
    if (lapse_store_orders_mapped(store)) {
        lapse_error_t rerr = {0};
        lapse_status_t rrc =
            n_holds > 0 ? lapse_error_set(&rerr, LAPSE_ERR_INVALID,
                                          "--hold is not used with an orders map "
                                          "(its on_cancel statements release)")
                        : row_deadline(store, order_id, explicit ? timeout_ms : 0,
                                       explicit ? deadline_ms : 0, deciding_now(store),
                                       &deadline_ms, &rerr);
        if (rrc != LAPSE_OK) {
            lapse_store_close(store);
            return rrc == LAPSE_ERR_INVALID ? cli_usage_error("publish", "%s", rerr.text)
                                            : cli_fail(rrc, &rerr, "publish");
        }
        /* The class of an agreeing timeout is still the shortest way; else the ladder. */
        timeout_ms = explicit ? timeout_ms : 0;
    }
    outcome_t o = {0};
    lapse_publisher_t *pub = open_publisher(cli, store, on_single, &o, &code);
    if (pub) {
        int64_t now = deciding_now(store);
        bool from_timeout = timeout_ms > 0 && !lapse_store_orders_mapped(store);
        lapse_new_order_t order = {
            .order_id = order_id,
            .deadline_ms = from_timeout ? lapse__time_add(now, timeout_ms) : deadline_ms,
            .created_at_ms = now,
            .holds = holds,
            .n_holds = n_holds};
        lapse_error_t err = {0};
        lapse_status_t rc = lapse_publisher_submit(pub, &order, timeout_ms, 0, &err);
        if (rc == LAPSE_OK) {
            rc = lapse_publisher_flush(pub, &err);
        }
        if (o.ok == 1) {
            /* The recorded deadline: a retried publish keeps the first one. */
            lapse_order_t stored;
            lapse_order_init(&stored);
            int64_t recorded_ms = order.deadline_ms;
            if (lapse_store_get(store, order_id, &stored, NULL) == LAPSE_OK) {
                recorded_ms = stored.deadline_ms;
            }
            lapse_order_clear(&stored);
            char deadline[LAPSE_RFC3339_LEN];
            lapse_time_format_rfc3339(recorded_ms, deadline);
            printf("published order_id=%s deadline=%s\n", order_id, deadline);
        } else {
            code = cli_exit_code(o.last_rc != LAPSE_OK ? o.last_rc : rc);
        }
        lapse_publisher_close(pub);
    }
    lapse_store_close(store);
    return code;
}

static int publish_batch(cli_t *cli, const char *path) {
    FILE *in = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!in) {
        cli_say("publish", "%s: %s", path, strerror(errno));
        return CLI_EXIT_FAILED;
    }
    int code = CLI_EXIT_OK;
    lapse_store_t *store = cli_open_store(cli, 0, &code);
    outcome_t o = {0};
    lapse_publisher_t *pub =
        store ? open_publisher(cli, store, on_line, &o, &code) : NULL;
    if (!pub) {
        lapse_store_close(store);
        if (in != stdin) {
            fclose(in);
        }
        return code;
    }
    int progress = isatty(STDERR_FILENO);
    int64_t last_progress = 0;
    line_reader_t reader;
    line_reader_init(&reader, fileno(in));
    char *line = NULL;
    ssize_t len;
    uint64_t lineno = 0;
    size_t bad = 0;
    lapse_status_t rc = LAPSE_OK;
    lapse_error_t err = {0};
    volatile sig_atomic_t *stop = cli_install_stop_handlers();
    while (rc == LAPSE_OK && !*stop) {
        /* Orders held back for a full batch go out as soon as the input pauses. */
        bool holding = lapse_publisher_pending(pub) > 0;
        len = line_reader_next(&reader, &line, holding ? IDLE_FLUSH_MS : STOP_CHECK_MS);
        if (len == LINE_READER_WAIT) {
            if (holding) {
                rc = lapse_publisher_flush(pub, &err);
            }
            continue;
        }
        if (len == LINE_READER_END) {
            break;
        }
        lineno++;
        if (len == LINE_READER_TOO_LONG) {
            cli_say("publish", "line %llu: longer than %zu bytes (%zu); skipped",
                    (unsigned long long)lineno, reader.max, reader.skipped);
            bad++;
            continue;
        }
        if (len == 0) {
            continue;
        }
        lapse_batch_line_t bl;
        lapse_error_t lerr = {0};
        int64_t now = deciding_now(store);
        if (lapse_batch_line_parse(line, (size_t)len, now, &bl, &lerr) != LAPSE_OK) {
            cli_say("publish", "line %llu: %s", (unsigned long long)lineno, lerr.text);
            bad++;
            continue;
        }
        if (lapse_store_orders_mapped(store)) {
            lapse_status_t mrc =
                bl.n_holds > 0
                    ? lapse_error_set(&lerr, LAPSE_ERR_INVALID,
                                      "\"holds\" are not used with an orders map")
                    : row_deadline(store, bl.order_id, bl.timeout_ms, bl.deadline_ms, now,
                                   &bl.deadline_ms, &lerr);
            if (mrc != LAPSE_OK) {
                cli_say("publish", "line %llu: %s", (unsigned long long)lineno,
                        lerr.text);
                bad++;
                lapse_batch_line_clear(&bl);
                continue;
            }
        } else if (bl.deadline_ms == 0) {
            cli_say("publish", "line %llu: give \"timeout\" or \"deadline\"",
                    (unsigned long long)lineno);
            bad++;
            lapse_batch_line_clear(&bl);
            continue;
        } else if (lapse_deadline_check(bl.deadline_ms, now, &lerr) != LAPSE_OK) {
            cli_say("publish", "line %llu: %s: %s", (unsigned long long)lineno,
                    bl.order_id, lerr.text);
            bad++;
            lapse_batch_line_clear(&bl);
            continue;
        }
        lapse_new_order_t order = {.order_id = bl.order_id,
                                   .deadline_ms = bl.deadline_ms,
                                   .created_at_ms = now,
                                   .holds = bl.holds,
                                   .n_holds = bl.n_holds};
        rc = lapse_publisher_submit(pub, &order, bl.timeout_ms, lineno, &err);
        lapse_batch_line_clear(&bl);
        if (progress && now - last_progress >= PROGRESS_EVERY) {
            fprintf(stderr, "\rlapse publish: %llu lines read, %zu published, %zu failed",
                    (unsigned long long)lineno, o.ok, o.failed + bad);
            last_progress = now;
        }
    }
    /* Always settle what was submitted, even after a failure, so that every order is
     * reported. */
    lapse_error_t ferr = {0};
    lapse_status_t frc = lapse_publisher_flush(pub, &ferr);
    if (rc == LAPSE_OK && frc != LAPSE_OK) {
        rc = frc;
        err = ferr;
    }
    if (progress) {
        fputc('\n', stderr);
    }
    if (*stop) {
        /* One line that says what the numbers below mean for the orders not published.
         */
        cli_say("publish",
                "stopped by a signal after %llu lines: orders not reported published "
                "stay pending and unscheduled ('lapse sweep' or the same batch again "
                "publishes them)",
                (unsigned long long)lineno);
    } else if (rc != LAPSE_OK) {
        cli_fail(rc, &err, "publish stopped");
    }
    if (reader.error) {
        cli_say("publish", "%s: %s", path, strerror(reader.error));
        rc = LAPSE_ERR_IO;
    }
    line_reader_free(&reader);
    cli_say("publish", "%llu lines, %zu published, %zu failed",
            (unsigned long long)lineno, o.ok, o.failed + bad);
    lapse_publisher_close(pub);
    lapse_store_close(store);
    if (in != stdin) {
        fclose(in);
    }
    if (rc != LAPSE_OK || *stop) {
        return CLI_EXIT_FAILED;
    }
    return o.failed + bad > 0 ? CLI_EXIT_FAILED : CLI_EXIT_OK;
}

int cmd_publish(cli_t *cli, int argc, char **argv) {
    const char *timeout = cli_opt(cli, CLI_OPT_TIMEOUT);
    const char *deadline = cli_opt(cli, CLI_OPT_DEADLINE);
    const char *batch = cli_opt(cli, CLI_OPT_BATCH);
    const char *holds[MAX_HOLDS];
    size_t n_holds = cli_opt_all(cli, CLI_OPT_HOLD, holds, MAX_HOLDS);
    if (n_holds > MAX_HOLDS) {
        return cli_usage_error("publish", "at most %d --hold", MAX_HOLDS);
    }
    if (batch) {
        if (argc != 0 || n_holds > 0 || timeout || deadline) {
            return cli_usage_error("publish", "--batch takes no ORDER_ID, --hold, "
                                              "--timeout or --deadline");
        }
        return publish_batch(cli, batch);
    }
    if (argc != 1) {
        return cli_usage_error("publish", "expected exactly one ORDER_ID");
    }
    const char *order_id = argv[0];
    if (!lapse_order_id_is_valid(order_id, strlen(order_id))) {
        return cli_usage_error(
            "publish", "invalid order id '%s': 1-128 bytes of [A-Za-z0-9._:-]", order_id);
    }
    if (timeout && deadline) {
        return cli_usage_error("publish", "give --timeout or --deadline, not both");
    }
    int64_t timeout_ms = 0;
    int64_t deadline_ms = 0;
    int64_t now = lapse_clock_now_ms();
    lapse_error_t err = {0};
    /* With an orders map, neither means "the shop's deadline" (publish_one). */
    bool explicit = timeout != NULL || deadline != NULL;
    if (deadline) {
        if (lapse_time_parse_rfc3339(deadline, &deadline_ms) != LAPSE_OK) {
            return cli_usage_error("publish",
                                   "invalid --deadline '%s' (RFC 3339, e.g. "
                                   "2026-12-01T18:00:00Z)",
                                   deadline);
        }
    } else {
        if (!timeout) {
            timeout = "30m";
        }
        if (lapse_duration_parse(timeout, &timeout_ms) != LAPSE_OK) {
            return cli_usage_error(
                "publish", "invalid --timeout '%s' (e.g. 90s, 30m, 2h, 400d)", timeout);
        }
        deadline_ms = lapse__time_add(now, timeout_ms);
    }
    if (lapse_deadline_check(deadline_ms, now, &err) != LAPSE_OK) {
        return cli_usage_error("publish", "%s%s",
                               deadline ? "--deadline: " : "--timeout: ", err.text);
    }
    for (size_t i = 0; i < n_holds; i++) {
        size_t hl = strlen(holds[i]);
        if (hl == 0 || hl > 256) {
            return cli_usage_error("publish", "--hold must be 1-256 bytes");
        }
    }
    return publish_one(cli, order_id, timeout_ms, deadline_ms, explicit, holds, n_holds);
}

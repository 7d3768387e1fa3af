/* SPDX-License-Identifier: MIT
 * lapse publish: one order, or a batch of lines, recorded and published with confirms. */
#include "cli.h"

#include <lapse/batch.h>
#include <lapse/publisher.h>

#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_HOLDS      64
#define CONNECT_TRIES  5
#define PROGRESS_EVERY 200 /* ms between progress lines on a terminal */

static const char usage[] =
    "usage: lapse publish ORDER_ID [--timeout DURATION] [--hold RESOURCE]...\n"
    "       lapse publish --batch FILE|-\n"
    "  --timeout D   payment window; must be one of the configured --classes (default "
    "30m)\n"
    "  --hold R      a resource the order holds until paid or cancelled (repeatable)\n"
    "  --batch F     one JSON object a line: {\"order_id\":\"..\",\"timeout\":\"30m\","
    "\"holds\":[..]}\n"
    "Exits 0 once the broker confirmed; 3 if the order exists with another deadline.\n";

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
        fprintf(stderr, "lapse publish: %s: %s (%s)\n", order_id, reason,
                lapse_status_name(rc));
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
    fprintf(stderr, "lapse publish: line %llu: %s: %s (%s)\n", (unsigned long long)line,
            order_id, reason, lapse_status_name(rc));
}

static lapse_publisher_t *open_publisher(cli_t *cli, lapse_store_t *store,
                                         lapse_publish_cb cb, outcome_t *o, int *code) {
    lapse_status_t rc = LAPSE_OK;
    lapse_error_t err = {0};
    for (unsigned attempt = 0; attempt < CONNECT_TRIES; attempt++) {
        lapse_publisher_t *pub = lapse_publisher_open(cli->cfg, store, cb, o, &rc, &err);
        if (pub) {
            return pub;
        }
        if (!lapse_status_is_retriable(rc) || attempt + 1 == CONNECT_TRIES) {
            break;
        }
        unsigned delay = 250u << attempt;
        fprintf(stderr, "lapse publish: %s; retrying in %u ms\n", err.text, delay);
        usleep(delay * 1000u);
    }
    *code = cli_fail(rc, &err, "connect to the broker");
    return NULL;
}

static int publish_one(cli_t *cli, const char *order_id, int64_t timeout_ms,
                       const char **holds, size_t n_holds) {
    int code = CLI_EXIT_OK;
    lapse_store_t *store = cli_open_store(cli, &code);
    if (!store) {
        return code;
    }
    outcome_t o = {0};
    lapse_publisher_t *pub = open_publisher(cli, store, on_single, &o, &code);
    if (pub) {
        int64_t now = lapse_clock_now_ms();
        lapse_new_order_t order = {.order_id = order_id,
                                   .deadline_ms = now + timeout_ms,
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
            int64_t deadline_ms = order.deadline_ms;
            if (lapse_store_get(store, order_id, &stored, NULL) == LAPSE_OK) {
                deadline_ms = stored.deadline_ms;
            }
            lapse_order_clear(&stored);
            char deadline[LAPSE_RFC3339_LEN];
            lapse_time_format_rfc3339(deadline_ms, deadline);
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
        perror(path);
        return CLI_EXIT_FAILED;
    }
    int code = CLI_EXIT_OK;
    lapse_store_t *store = cli_open_store(cli, &code);
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
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    uint64_t lineno = 0;
    size_t bad = 0;
    lapse_status_t rc = LAPSE_OK;
    lapse_error_t err = {0};
    while (rc == LAPSE_OK && (len = getline(&line, &cap, in)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) {
            line[--len] = '\0';
        }
        if (len == 0) {
            continue;
        }
        lapse_batch_line_t bl;
        lapse_error_t lerr = {0};
        int64_t now = lapse_clock_now_ms();
        if (lapse_batch_line_parse(line, (size_t)len, now, &bl, &lerr) != LAPSE_OK) {
            fprintf(stderr, "lapse publish: line %llu: %s\n", (unsigned long long)lineno,
                    lerr.text);
            bad++;
            continue;
        }
        if (bl.timeout_ms == 0) {
            fprintf(stderr,
                    "lapse publish: line %llu: %s: \"deadline\" lines are not supported "
                    "yet; give a \"timeout\" equal to a class\n",
                    (unsigned long long)lineno, bl.order_id);
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
    free(line);
    if (rc == LAPSE_OK) {
        rc = lapse_publisher_flush(pub, &err);
    }
    if (progress) {
        fputc('\n', stderr);
    }
    if (rc != LAPSE_OK) {
        cli_fail(rc, &err, "publish stopped");
    }
    if (ferror(in)) {
        perror(path);
        rc = LAPSE_ERR_IO;
    }
    fprintf(stderr, "lapse publish: %llu lines, %zu published, %zu failed\n",
            (unsigned long long)lineno, o.ok, o.failed + bad);
    lapse_publisher_close(pub);
    lapse_store_close(store);
    if (in != stdin) {
        fclose(in);
    }
    if (rc != LAPSE_OK) {
        return CLI_EXIT_FAILED;
    }
    return o.failed + bad > 0 ? CLI_EXIT_FAILED : CLI_EXIT_OK;
}

int cmd_publish(cli_t *cli, int argc, char **argv) {
    static const struct option opts[] = {{"timeout", required_argument, NULL, 't'},
                                         {"deadline", required_argument, NULL, 'd'},
                                         {"hold", required_argument, NULL, 'H'},
                                         {"batch", required_argument, NULL, 'b'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *timeout = "30m";
    const char *batch = NULL;
    const char *holds[MAX_HOLDS];
    size_t n_holds = 0;
    int opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (opt) {
            case 't':
                timeout = optarg;
                break;
            case 'd':
                return cli_usage_error("publish",
                                       "--deadline is not supported yet: use --timeout "
                                       "with one of the configured classes");
            case 'H':
                if (n_holds == MAX_HOLDS) {
                    return cli_usage_error("publish", "at most %d --hold", MAX_HOLDS);
                }
                holds[n_holds++] = optarg;
                break;
            case 'b':
                batch = optarg;
                break;
            case 'h':
                fputs(usage, stdout);
                return CLI_EXIT_OK;
            default:
                return cli_usage_error("publish", "unknown or incomplete option '%s'",
                                       argv[optind - 1]);
        }
    }
    if (batch) {
        if (optind != argc || n_holds > 0) {
            return cli_usage_error("publish", "--batch takes no ORDER_ID and no --hold");
        }
        return publish_batch(cli, batch);
    }
    if (optind + 1 != argc) {
        return cli_usage_error("publish", "expected exactly one ORDER_ID");
    }
    const char *order_id = argv[optind];
    if (!lapse_order_id_is_valid(order_id, strlen(order_id))) {
        return cli_usage_error(
            "publish", "invalid order id '%s': 1-128 bytes of [A-Za-z0-9._:-]", order_id);
    }
    int64_t timeout_ms;
    if (lapse_duration_parse(timeout, &timeout_ms) != LAPSE_OK) {
        return cli_usage_error("publish", "invalid --timeout '%s' (e.g. 90s, 30m, 2h)",
                               timeout);
    }
    if (!lapse_config_has_class(cli->cfg, timeout_ms)) {
        return cli_usage_error("publish",
                               "--timeout %s matches no configured class (classes: %s); "
                               "add it with --classes",
                               timeout, lapse_config_get(cli->cfg, "classes"));
    }
    for (size_t i = 0; i < n_holds; i++) {
        size_t hl = strlen(holds[i]);
        if (hl == 0 || hl > 256) {
            return cli_usage_error("publish", "--hold must be 1-256 bytes");
        }
    }
    return publish_one(cli, order_id, timeout_ms, holds, n_holds);
}

/* SPDX-License-Identifier: MIT
 * Test f: definitions/ equals `topology export`; an import alone cancels orders. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OUT_CAP 262144

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    char *buf = malloc(OUT_CAP);
    size_t n = buf ? fread(buf, 1, OUT_CAP - 1, f) : 0;
    fclose(f);
    if (buf) {
        buf[n] = '\0';
    }
    return buf;
}

static void chomp(char *s) {
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r')) {
        s[--n] = '\0';
    }
}

static json_t *find_named(json_t *array, const char *key, const char *name) {
    size_t i;
    json_t *item;
    json_array_foreach(array, i, item) {
        const char *v = json_string_value(json_object_get(item, key));
        if (v && strcmp(v, name) == 0) {
            return item;
        }
    }
    return NULL;
}

static const char *arg_str(json_t *obj, const char *key) {
    return json_string_value(json_object_get(json_object_get(obj, "arguments"), key));
}

static json_int_t arg_int(json_t *obj, const char *key) {
    json_t *v = json_object_get(json_object_get(obj, "arguments"), key);
    assert_true(json_is_integer(v));
    return json_integer_value(v);
}

static void assert_binding(json_t *bindings, const char *source, const char *dest,
                           const char *rk) {
    size_t i;
    json_t *b;
    json_array_foreach(bindings, i, b) {
        if (strcmp(json_string_value(json_object_get(b, "source")), source) == 0 &&
            strcmp(json_string_value(json_object_get(b, "destination")), dest) == 0 &&
            strcmp(json_string_value(json_object_get(b, "destination_type")), "queue") ==
                0 &&
            strcmp(json_string_value(json_object_get(b, "routing_key")), rk) == 0) {
            return;
        }
    }
    fail_msg("no binding %s -> %s with key '%s'", source, dest, rk);
}

static void unset_lapse_env(void) {
    unsetenv("LAPSE_AMQP_URL");
    unsetenv("LAPSE_STORE");
    unsetenv("LAPSE_PREFIX");
    unsetenv("LAPSE_CLASSES");
    unsetenv("LAPSE_QUEUE_TYPE");
    unsetenv("LAPSE_EVENTS_QUEUE");
}

static void test_export_equals_definitions_file(void **state) {
    (void)state;
    const char *src = getenv("LAPSE_SOURCE_DIR");
    assert_non_null(src);
    h_ctx_t h;
    h_setup(&h, "defs-export", "30m", false);
    unset_lapse_env();

    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/definitions/definitions.json", src);
    char *file = read_file(path);
    assert_non_null(file);
    chomp(file);

    /* The built-in defaults, and the same given as flags, print exactly the file. */
    char *out = malloc(OUT_CAP);
    assert_non_null(out);
    assert_int_equal(h_run(&h, out, OUT_CAP, "topology", "export", NULL), 0);
    chomp(out);
    assert_string_equal(out, file);
    assert_int_equal(h_run(&h, out, OUT_CAP, "--prefix", "lapse", "--classes", "30m",
                           "topology", "export", NULL),
                     0);
    chomp(out);
    assert_string_equal(out, file);
    /* ...and another class list does not (the comparison can tell them apart). */
    assert_int_equal(
        h_run(&h, out, OUT_CAP, "--classes", "15m,30m", "topology", "export", NULL), 0);
    chomp(out);
    assert_string_not_equal(out, file);

    /* The quorum variant, likewise. */
    char qpath[PATH_MAX];
    snprintf(qpath, sizeof qpath, "%s/definitions/definitions-quorum.json", src);
    char *qfile = read_file(qpath);
    assert_non_null(qfile);
    chomp(qfile);
    assert_int_equal(
        h_run(&h, out, OUT_CAP, "--queue-type", "quorum", "topology", "export", NULL), 0);
    chomp(out);
    assert_string_equal(out, qfile);
    json_t *qroot = json_loads(qfile, 0, NULL);
    assert_non_null(qroot);
    const char *with_dlx[] = {"lapse.hold.30m", "lapse.delay.00", "lapse.delay.27",
                              "lapse.expired"};
    for (size_t i = 0; i < sizeof with_dlx / sizeof with_dlx[0]; i++) {
        json_t *qq = find_named(json_object_get(qroot, "queues"), "name", with_dlx[i]);
        assert_non_null(qq);
        assert_string_equal(arg_str(qq, "x-queue-type"), "quorum");
        assert_string_equal(arg_str(qq, "x-dead-letter-strategy"), "at-least-once");
        assert_string_equal(arg_str(qq, "x-overflow"), "reject-publish");
    }
    json_t *qparked =
        find_named(json_object_get(qroot, "queues"), "name", "lapse.parked");
    assert_string_equal(arg_str(qparked, "x-queue-type"), "quorum");
    json_decref(qroot);
    free(qfile);
    free(out);

    json_error_t jerr;
    json_t *root = json_loads(file, 0, &jerr);
    if (!root) {
        fail_msg("%s: line %d: %s", path, jerr.line, jerr.text);
    }
    json_t *queues = json_object_get(root, "queues");
    json_t *exchanges = json_object_get(root, "exchanges");
    json_t *bindings = json_object_get(root, "bindings");
    assert_true(json_is_array(queues));
    assert_true(json_is_array(exchanges));
    assert_true(json_is_array(bindings));

    json_t *hold = find_named(queues, "name", "lapse.hold.30m");
    assert_non_null(hold);
    assert_int_equal(arg_int(hold, "x-message-ttl"), 1800000);
    assert_string_equal(arg_str(hold, "x-dead-letter-exchange"), "lapse.expired");
    assert_string_equal(arg_str(hold, "x-dead-letter-routing-key"), "order.expired");
    json_t *expired = find_named(queues, "name", "lapse.expired");
    assert_non_null(expired);
    assert_string_equal(arg_str(expired, "x-dead-letter-exchange"), "lapse.parked");
    assert_non_null(find_named(queues, "name", "lapse.parked"));

    size_t i;
    json_t *q;
    json_array_foreach(queues, i, q) {
        const char *name = json_string_value(json_object_get(q, "name"));
        assert_non_null(name);
        assert_true(strncmp(name, "lapse.", 6) == 0);
        assert_true(json_is_true(json_object_get(q, "durable")));
        assert_true(json_is_false(json_object_get(q, "auto_delete")));
        assert_true(json_is_object(json_object_get(q, "arguments")));
        if (json_object_get(json_object_get(q, "arguments"), "x-expires")) {
            fail_msg("queue %s has x-expires", name);
        }
    }

    json_t *x_expired = find_named(exchanges, "name", "lapse.expired");
    assert_non_null(x_expired);
    assert_string_equal(json_string_value(json_object_get(x_expired, "type")), "direct");
    assert_string_equal(arg_str(x_expired, "alternate-exchange"), "lapse.parked");
    json_t *x_hold = find_named(exchanges, "name", "lapse.hold");
    assert_non_null(x_hold);
    assert_string_equal(json_string_value(json_object_get(x_hold, "type")), "direct");
    json_t *x_parked = find_named(exchanges, "name", "lapse.parked");
    assert_non_null(x_parked);
    assert_string_equal(json_string_value(json_object_get(x_parked, "type")), "fanout");
    json_t *x_events = find_named(exchanges, "name", "lapse.events");
    assert_non_null(x_events);
    assert_string_equal(json_string_value(json_object_get(x_events, "type")), "topic");
    json_t *x;
    json_array_foreach(exchanges, i, x) {
        assert_true(json_is_true(json_object_get(x, "durable")));
    }

    assert_binding(bindings, "lapse.hold", "lapse.hold.30m", "30m");
    assert_binding(bindings, "lapse.expired", "lapse.expired", "order.expired");
    assert_binding(bindings, "lapse.parked", "lapse.parked", "");
    json_decref(root);
    free(file);
    h_teardown(&h);
}

/* The items of full's array key that base's lacks (json_equal), as a new array. */
static json_t *added_items(json_t *full, json_t *base, const char *key) {
    json_t *added = json_array();
    size_t i, j;
    json_t *item, *other;
    json_array_foreach(json_object_get(full, key), i, item) {
        bool known = false;
        json_array_foreach(json_object_get(base, key), j, other) {
            known = known || json_equal(item, other);
        }
        if (!known) {
            json_array_append(added, item);
        }
    }
    return added;
}

/* What `topology export` adds with --events-queue (and extra flags), compared against
 * base (the export without it): {"queues":[..],"bindings":[..]}; no exchange is added. */
static json_t *export_addition(h_ctx_t *h, json_t *base, const char *f1, const char *v1) {
    char *out = malloc(OUT_CAP);
    assert_non_null(out);
    int code = f1 ? h_run(h, out, OUT_CAP, f1, v1, "--events-queue",
                          "lapse.events.cancelled", "topology", "export", NULL)
                  : h_run(h, out, OUT_CAP, "--events-queue", "lapse.events.cancelled",
                          "topology", "export", NULL);
    assert_int_equal(code, 0);
    json_t *full = json_loads(out, 0, NULL);
    free(out);
    assert_non_null(full);
    assert_true(json_equal(json_object_get(full, "exchanges"),
                           json_object_get(base, "exchanges")));
    json_t *added = json_pack("{s:o, s:o}", "queues", added_items(full, base, "queues"),
                              "bindings", added_items(full, base, "bindings"));
    json_decref(full);
    return added;
}

static json_t *export_json(h_ctx_t *h, const char *f1, const char *v1) {
    char *out = malloc(OUT_CAP);
    assert_non_null(out);
    int code = f1 ? h_run(h, out, OUT_CAP, f1, v1, "topology", "export", NULL)
                  : h_run(h, out, OUT_CAP, "topology", "export", NULL);
    assert_int_equal(code, 0);
    json_t *root = json_loads(out, 0, NULL);
    free(out);
    assert_non_null(root);
    return root;
}

/* definitions/events-queue.json is exactly what --events-queue adds to the export: one
 * durable queue and its binding to lapse.events for order.cancelled. */
static void test_events_queue_file_equals_export_addition(void **state) {
    (void)state;
    const char *src = getenv("LAPSE_SOURCE_DIR");
    assert_non_null(src);
    h_ctx_t h;
    h_setup(&h, "defs-events", "30m", false);
    unset_lapse_env();
    unsetenv("LAPSE_EVENTS_QUEUE");

    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/definitions/events-queue.json", src);
    char *text = read_file(path);
    assert_non_null(text);
    json_error_t jerr;
    json_t *file = json_loads(text, 0, &jerr);
    if (!file) {
        fail_msg("%s: line %d: %s", path, jerr.line, jerr.text);
    }
    free(text);
    assert_int_equal(json_object_size(file), 2);

    json_t *base = export_json(&h, NULL, NULL);
    json_t *added = export_addition(&h, base, NULL, NULL);
    char *shown = json_dumps(added, JSON_INDENT(2));
    printf("export adds: %s\n", shown);
    free(shown);
    assert_true(json_equal(added, file));
    json_t *queues = json_object_get(added, "queues");
    json_t *bindings = json_object_get(added, "bindings");
    assert_int_equal(json_array_size(queues), 1);
    assert_int_equal(json_array_size(bindings), 1);
    json_t *q = json_array_get(queues, 0);
    assert_string_equal(json_string_value(json_object_get(q, "name")),
                        "lapse.events.cancelled");
    assert_true(json_is_true(json_object_get(q, "durable")));
    assert_int_equal(json_object_size(json_object_get(q, "arguments")), 0);
    assert_binding(bindings, "lapse.events", "lapse.events.cancelled", "order.cancelled");
    json_decref(added);
    json_decref(base);

    /* The queue type follows the topology's: a quorum topology gets a quorum queue, and
     * no dead-lettering arguments (it dead-letters nothing). */
    base = export_json(&h, "--queue-type", "quorum");
    added = export_addition(&h, base, "--queue-type", "quorum");
    q = json_array_get(json_object_get(added, "queues"), 0);
    assert_non_null(q);
    assert_string_equal(arg_str(q, "x-queue-type"), "quorum");
    assert_int_equal(json_object_size(json_object_get(q, "arguments")), 1);
    assert_false(json_equal(added, file));
    json_decref(added);
    json_decref(base);

    /* The environment variable does the same as the flag. */
    setenv("LAPSE_EVENTS_QUEUE", "lapse.events.cancelled", 1);
    base = export_json(&h, NULL, NULL);
    unsetenv("LAPSE_EVENTS_QUEUE");
    json_t *plain = export_json(&h, NULL, NULL);
    json_t *via_env =
        json_pack("{s:o, s:o}", "queues", added_items(base, plain, "queues"), "bindings",
                  added_items(base, plain, "bindings"));
    assert_true(json_equal(via_env, file));
    json_decref(via_env);
    json_decref(plain);
    json_decref(base);
    json_decref(file);
    h_teardown(&h);
}

/* Cleanup that must also happen when an assertion fails mid-test. */
static struct {
    char vhost[96];
    bool vhost_made;
    pid_t consumer;
    h_ctx_t h;
} imp;

static int import_teardown(void **state) {
    (void)state;
    if (imp.consumer > 0) {
        h_stop(imp.consumer, SIGKILL, h_ms(10000));
        imp.consumer = 0;
    }
    if (imp.vhost_made) {
        char path[256];
        snprintf(path, sizeof path, "/api/vhosts/%s", imp.vhost);
        h_http(&imp.h, "DELETE", path, NULL, NULL);
        imp.vhost_made = false;
    }
    return 0;
}

static json_t *get_json(h_ctx_t *h, const char *path) {
    assert_int_equal(h_http(h, "GET", path, NULL, NULL), 200);
    char *body = read_file(h_path(h, "http.out"));
    assert_non_null(body);
    json_t *root = json_loads(body, 0, NULL);
    free(body);
    assert_non_null(root);
    return root;
}

static void test_import_into_fresh_vhost(void **state) {
    (void)state;
    const char *src = getenv("LAPSE_SOURCE_DIR");
    const char *base_url = getenv("LAPSE_TEST_AMQP_URL");
    assert_non_null(src);
    assert_non_null(base_url);
    h_ctx_t *h = &imp.h;
    h_setup(h, "defs-import", "2s", false);
    unset_lapse_env();
    /* The vhost is fresh, so the default names are free to use. */
    snprintf(h->prefix, sizeof h->prefix, "lapse");
    snprintf(imp.vhost, sizeof imp.vhost, "lapse-import-%d", (int)getpid());

    char path[512];
    snprintf(path, sizeof path, "/api/vhosts/%s", imp.vhost);
    int code = h_http(h, "PUT", path, NULL, NULL);
    assert_true(code == 201 || code == 204);
    imp.vhost_made = true;
    snprintf(path, sizeof path, "/api/permissions/%s/guest", imp.vhost);
    code = h_http(h, "PUT", path, NULL,
                  "{\"configure\":\".*\",\"write\":\".*\",\"read\":\".*\"}");
    assert_true(code == 201 || code == 204);

    /* 1. The committed file imports as it is, into the vhost named in the path. */
    char file[PATH_MAX];
    snprintf(file, sizeof file, "%s/definitions/definitions.json", src);
    snprintf(path, sizeof path, "/api/definitions/%s", imp.vhost);
    code = h_http(h, "POST", path, file, NULL);
    assert_true(code == 201 || code == 204);
    snprintf(path, sizeof path, "/api/queues/%s/lapse.hold.30m", imp.vhost);
    json_t *q = get_json(h, path);
    assert_int_equal(arg_int(q, "x-message-ttl"), 1800000);
    assert_string_equal(arg_str(q, "x-dead-letter-exchange"), "lapse.expired");
    assert_true(json_is_true(json_object_get(q, "durable")));
    json_decref(q);
    snprintf(path, sizeof path, "/api/exchanges/%s/lapse.expired", imp.vhost);
    json_t *x = get_json(h, path);
    assert_string_equal(arg_str(x, "alternate-exchange"), "lapse.parked");
    json_decref(x);
    /* The events queue's partial file imports after it. */
    snprintf(file, sizeof file, "%s/definitions/events-queue.json", src);
    snprintf(path, sizeof path, "/api/definitions/%s", imp.vhost);
    code = h_http(h, "POST", path, file, NULL);
    assert_true(code == 201 || code == 204);
    snprintf(path, sizeof path, "/api/queues/%s/lapse.events.cancelled", imp.vhost);
    q = get_json(h, path);
    assert_true(json_is_true(json_object_get(q, "durable")));
    json_decref(q);
    /* Nothing of it went to the file's own vhost "/" (nothing else on this private node
     * uses the default prefix). */
    assert_int_equal(h_http(h, "GET", "/api/queues/%2f/lapse.hold.30m", NULL, NULL), 404);
    assert_int_equal(
        h_http(h, "GET", "/api/queues/%2f/lapse.events.cancelled", NULL, NULL), 404);

    /* 2. A short class, exported and imported the same way: no `topology declare`. */
    char *defs = malloc(OUT_CAP);
    assert_non_null(defs);
    assert_int_equal(h_run(h, defs, OUT_CAP, "--prefix", "lapse", "--classes", "2s",
                           "topology", "export", NULL),
                     0);
    FILE *f = fopen(h_path(h, "defs-2s.json"), "w");
    assert_non_null(f);
    fputs(defs, f);
    fclose(f);
    free(defs);
    snprintf(path, sizeof path, "/api/definitions/%s", imp.vhost);
    code = h_http(h, "POST", path, h_path(h, "defs-2s.json"), NULL);
    assert_true(code == 201 || code == 204);

    /* amqp://guest:guest@127.0.0.1:PORT/%2f -> .../<vhost> */
    snprintf(h->amqp, sizeof h->amqp, "%s", base_url);
    char *slash = strrchr(h->amqp, '/');
    assert_non_null(slash);
    snprintf(slash + 1, sizeof h->amqp - (size_t)(slash + 1 - h->amqp), "%s", imp.vhost);

    imp.consumer = h_spawn_consumer(h, "consumer.log", NULL);
    assert_int_equal(
        h_lapse(h, NULL, 0, "publish", "o1", "--timeout", "2s", "--hold", "seat-1", NULL),
        0);
    assert_int_equal(h_lapse(h, NULL, 0, "publish", "o2", "--timeout", "2s", NULL), 0);
    assert_int_equal(h_lapse(h, NULL, 0, "pay", "o2", NULL), 0);
    assert_int_equal(h_sql_int(h, "SELECT count(*) FROM orders WHERE scheduled = 1"), 2);

    assert_int_equal(h_wait_sql(h, 1, h_ms(20000),
                                "SELECT count(*) FROM orders WHERE order_id='o1' "
                                "AND status='cancelled'"),
                     1);
    /* o2's message arrives too and is acked as a no-op. */
    for (int t = 0;
         t < h_ms(100) && h_count_lines(h, "consumer.log", "decision=noop_paid") < 1;
         t++) {
        usleep(100000);
    }
    assert_int_equal(h_count_lines(h, "consumer.log", "decision=noop_paid"), 1);
    assert_int_equal(h_count_lines(h, "consumer.log", "decision=cancelled"), 1);
    assert_int_equal(h_stop(imp.consumer, SIGTERM, h_ms(10000)), 0);
    imp.consumer = 0;

    assert_int_equal(h_sql_int(h, "SELECT count(*) FROM orders WHERE order_id='o2' AND "
                                  "status='paid'"),
                     1);
    assert_int_equal(h_sql_int(h, "SELECT count(*) FROM orders WHERE order_id='o1' AND "
                                  "cancelled_at_ms >= deadline_ms"),
                     1);
    assert_int_equal(h_sql_int(h, "SELECT count(*) FROM holds WHERE order_id='o1' AND "
                                  "released_at_ms IS NOT NULL"),
                     1);
    assert_int_equal(h_sql_int(h, "SELECT count(*) FROM events"), 1);
    /* Its event went to the imported events queue, and so left the outbox. */
    assert_int_equal(h_sql_int(h, sf_sql_unpublished(h->sf.backend)), 0);
    amqp_connection_state_t vconn = h_amqp_open(h);
    assert_int_equal(h_queue_depth(vconn, "lapse.events.cancelled"), 1);
    h_amqp_close(vconn);

    /* The messages went the broker's way: all queues of the vhost are empty again. */
    char out[4096];
    assert_int_equal(h_lapse(h, out, sizeof out, "status", "--json", NULL), 0);
    json_t *st = json_loads(out, 0, NULL);
    assert_non_null(st);
    const char *names[] = {"lapse.hold.2s", "lapse.delay.00", "lapse.delay.27",
                           "lapse.expired", "lapse.parked"};
    json_t *queues = json_object_get(st, "queues");
    assert_int_equal(json_object_size(queues), 3 + 28);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        assert_non_null(json_object_get(queues, names[i]));
    }
    const char *name;
    json_t *qs;
    json_object_foreach(queues, name, qs) {
        assert_int_equal(json_integer_value(json_object_get(qs, "messages")), 0);
    }
    json_decref(st);

    snprintf(path, sizeof path, "/api/vhosts/%s", imp.vhost);
    assert_int_equal(h_http(h, "DELETE", path, NULL, NULL), 204);
    imp.vhost_made = false;
    assert_int_equal(h_http(h, "GET", path, NULL, NULL), 404);
    h_teardown(h);
}

/* The README's permissions cell for role (its row "| ROLE (..."), column col (0
 * configure, 1 write, 2 read), unescaped (\| is |, the backticks dropped), into out. */
static void readme_cell(const char *readme, const char *role, int col, char *out,
                        size_t cap) {
    char head[64];
    snprintf(head, sizeof head, "\n| %s (", role);
    const char *row = strstr(readme, head);
    assert_non_null(row);
    row++;
    const char *end = strchr(row, '\n');
    assert_non_null(end);
    /* Skip the role's cell: cells are split by a '|' that is not escaped. */
    int cell = -1;
    const char *c = row;
    for (; c < end; c++) {
        if (*c == '|' && (c == row || c[-1] != '\\') && ++cell == col + 1) {
            break;
        }
    }
    assert_true(c < end);
    const char *open = strchr(c, '`');
    assert_true(open && open < end);
    size_t n = 0;
    for (const char *p = open + 1; p < end && *p != '`' && n + 1 < cap; p++) {
        if (*p == '\\' && p[1] == '|') {
            continue;
        }
        out[n++] = *p;
    }
    out[n] = '\0';
}

/* definitions/roles.json is exactly `topology export --roles` for the defaults, and the
 * README's permissions table says the same patterns: one table, three copies, kept equal
 * here. */
static void test_roles_file_equals_export_and_readme(void **state) {
    (void)state;
    const char *src = getenv("LAPSE_SOURCE_DIR");
    assert_non_null(src);
    h_ctx_t h;
    h_setup(&h, "defs-roles", "30m", false);
    unset_lapse_env();
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/definitions/roles.json", src);
    char *file = read_file(path);
    assert_non_null(file);
    chomp(file);
    char *out = malloc(OUT_CAP);
    assert_non_null(out);
    assert_int_equal(h_run(&h, out, OUT_CAP, "topology", "export", "--roles", NULL), 0);
    chomp(out);
    assert_string_equal(out, file);
    assert_int_equal(h_run(&h, out, OUT_CAP, "--prefix", "shop", "topology", "export",
                           "--roles", NULL),
                     0);
    assert_non_null(strstr(out, "\"shop-consumer\""));
    assert_null(strstr(out, "lapse"));
    assert_int_equal(h_run(&h, out, OUT_CAP, "topology", "declare", "--roles", NULL), 2);

    json_t *root = json_loads(file, 0, NULL);
    assert_non_null(root);
    json_t *users = json_object_get(root, "users");
    json_t *perms = json_object_get(root, "permissions");
    assert_int_equal(json_array_size(users), 3);
    assert_int_equal(json_array_size(perms), 3);
    size_t i;
    json_t *u;
    json_array_foreach(users, i, u) {
        /* No password hash ships: the users cannot log in until given a password. */
        assert_string_equal(json_string_value(json_object_get(u, "password_hash")), "");
    }

    snprintf(path, sizeof path, "%s/README.md", src);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *readme = malloc(1 << 20);
    assert_non_null(readme);
    size_t n = fread(readme, 1, (1 << 20) - 1, f);
    fclose(f);
    readme[n] = '\0';
    const char *roles[] = {"publisher", "consumer", "operator"};
    const char *cols[] = {"configure", "write", "read"};
    for (size_t r = 0; r < 3; r++) {
        char user[64];
        snprintf(user, sizeof user, "lapse-%s", roles[r]);
        json_t *p = find_named(perms, "user", user);
        assert_non_null(p);
        for (int col = 0; col < 3; col++) {
            char cell[256];
            readme_cell(readme, roles[r], col, cell, sizeof cell);
            printf("%s %s: README %s, roles.json %s\n", roles[r], cols[col], cell,
                   json_string_value(json_object_get(p, cols[col])));
            assert_string_equal(cell, json_string_value(json_object_get(p, cols[col])));
        }
    }
    free(readme);
    json_decref(root);
    free(out);
    free(file);
    h_teardown(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_export_equals_definitions_file),
        cmocka_unit_test(test_events_queue_file_equals_export_addition),
        cmocka_unit_test(test_roles_file_equals_export_and_readme),
        cmocka_unit_test_teardown(test_import_into_fresh_vhost, import_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: MIT
 * The topology table: the optional events queue (config events_queue) is one more durable
 * queue of the topology's queue type, bound to <prefix>.events for order.cancelled, and
 * shows up in the export; without it nothing changes. Pure: no broker. */
#include "topology_int.h"

#include <lapse/message.h>

#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static const lapse__queue_def_t *find_queue(const lapse__topology_t *t,
                                            const char *name) {
    for (size_t i = 0; i < t->n_queues; i++) {
        if (strcmp(t->queues[i].name, name) == 0) {
            return &t->queues[i];
        }
    }
    return NULL;
}

static size_t bindings_to(const lapse__topology_t *t, const char *dest) {
    size_t n = 0;
    for (size_t i = 0; i < t->n_bindings; i++) {
        n += strcmp(t->bindings[i].destination, dest) == 0;
    }
    return n;
}

static void test_no_events_queue_by_default(void **state) {
    (void)state;
    lapse_config_t *cfg = lapse_config_new();
    assert_non_null(cfg);
    assert_int_equal(lapse_config_set(cfg, "prefix", "shop", NULL), LAPSE_OK);
    lapse__topology_t *t = malloc(sizeof *t);
    assert_non_null(t);
    lapse__topology_build(cfg, t);
    assert_string_equal(t->events_queue, "");
    assert_string_equal(t->events_exchange, "shop.events");
    /* classes (1), rungs (28), expired, parked */
    assert_int_equal(t->n_queues, 1 + LAPSE__LADDER_RUNGS + 2);
    assert_int_equal(bindings_to(t, "shop.events"), 0);
    free(t);
    lapse_config_free(cfg);
}

static void test_events_queue_is_one_queue_and_one_binding(void **state) {
    (void)state;
    lapse_config_t *cfg = lapse_config_new();
    assert_non_null(cfg);
    lapse__topology_t *base = malloc(sizeof *base);
    lapse__topology_t *t = malloc(sizeof *t);
    assert_non_null(base);
    assert_non_null(t);
    /* The most queues and bindings a topology can have, plus the events queue. */
    assert_int_equal(
        lapse_config_set(cfg, "classes",
                         "1s,2s,3s,4s,5s,6s,7s,8s,9s,10s,11s,12s,13s,14s,15s,16s", NULL),
        LAPSE_OK);
    lapse__topology_build(cfg, base);
    assert_int_equal(
        lapse_config_set(cfg, "events_queue", "lapse.events.cancelled", NULL), LAPSE_OK);
    lapse__topology_build(cfg, t);
    assert_int_equal(t->n_queues, base->n_queues + 1);
    assert_int_equal(t->n_bindings, base->n_bindings + 1);
    assert_int_equal(t->n_exchanges, base->n_exchanges);
    assert_string_equal(t->events_queue, "lapse.events.cancelled");
    const lapse__queue_def_t *q = find_queue(t, "lapse.events.cancelled");
    assert_non_null(q);
    /* Kept until read: no TTL, no dead-lettering. */
    assert_int_equal(q->ttl_ms, 0);
    assert_string_equal(q->dlx, "");
    const lapse__binding_def_t *b = &t->bindings[t->n_bindings - 1];
    assert_string_equal(b->source, "lapse.events");
    assert_string_equal(b->destination, "lapse.events.cancelled");
    assert_false(b->to_exchange);
    assert_string_equal(b->routing_key, LAPSE_EVENT_CANCELLED);
    free(base);
    free(t);
    lapse_config_free(cfg);
}

static json_t *export_json(const lapse_config_t *cfg) {
    char *text = lapse_topology_export(cfg);
    assert_non_null(text);
    json_t *root = json_loads(text, 0, NULL);
    free(text);
    assert_non_null(root);
    return root;
}

static json_t *named(json_t *array, const char *name) {
    size_t i;
    json_t *item;
    json_array_foreach(array, i, item) {
        const char *v = json_string_value(json_object_get(item, "name"));
        if (v && strcmp(v, name) == 0) {
            return item;
        }
    }
    return NULL;
}

static void test_export_follows_the_queue_type(void **state) {
    (void)state;
    lapse_config_t *cfg = lapse_config_new();
    assert_non_null(cfg);
    assert_int_equal(lapse_config_set(cfg, "events_queue", "ev", NULL), LAPSE_OK);
    json_t *root = export_json(cfg);
    json_t *q = named(json_object_get(root, "queues"), "ev");
    assert_non_null(q);
    assert_true(json_is_true(json_object_get(q, "durable")));
    assert_true(json_is_false(json_object_get(q, "auto_delete")));
    assert_int_equal(json_object_size(json_object_get(q, "arguments")), 0);
    json_decref(root);

    assert_int_equal(lapse_config_set(cfg, "queue_type", "quorum", NULL), LAPSE_OK);
    root = export_json(cfg);
    q = named(json_object_get(root, "queues"), "ev");
    assert_non_null(q);
    json_t *args = json_object_get(q, "arguments");
    assert_string_equal(json_string_value(json_object_get(args, "x-queue-type")),
                        "quorum");
    /* It dead-letters nothing, so it gets none of the dead-lettering arguments. */
    assert_int_equal(json_object_size(args), 1);
    json_decref(root);

    /* Unset again: gone from the export. */
    assert_int_equal(lapse_config_set(cfg, "events_queue", "", NULL), LAPSE_OK);
    root = export_json(cfg);
    assert_null(named(json_object_get(root, "queues"), "ev"));
    json_decref(root);
    lapse_config_free(cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_events_queue_by_default),
        cmocka_unit_test(test_events_queue_is_one_queue_and_one_binding),
        cmocka_unit_test(test_export_follows_the_queue_type),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

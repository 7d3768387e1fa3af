/* SPDX-License-Identifier: MIT
 * The orders map's JSON: a full map, the short forms, and one clear error per mistake. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orders_map_int.h"

static lapse_status_t parse(const char *json, lapse__orders_map_t *map,
                            lapse_error_t *err) {
    lapse_status_t rc = lapse__orders_map_parse(json, strlen(json), map, err);
    return rc;
}

static void test_full_map(void **state) {
    (void)state;
    lapse__orders_map_t map;
    lapse_error_t err;
    const char *json =
        "{\"table\": \"shop.orders\", \"id\": \"id\", \"status\": \"status\","
        " \"pending\": [\"unpaid\", \"awaiting_payment\"], \"paid\": \"paid\","
        " \"cancelled\": \"cancelled\", \"cancelled_at\": \"cancelled_at\","
        " \"deadline\": \"pay_deadline\","
        " \"on_cancel\": [\"UPDATE shop.seats SET held_by = NULL WHERE held_by = $1\","
        " \"DELETE FROM shop.holds WHERE order_id = $1\"]}";
    assert_int_equal(parse(json, &map, &err), LAPSE_OK);
    assert_string_equal(map.table_schema, "shop");
    assert_string_equal(map.table, "orders");
    assert_string_equal(map.id, "id");
    assert_string_equal(map.status, "status");
    assert_int_equal(map.n_pending, 2);
    assert_string_equal(map.pending[1], "awaiting_payment");
    assert_string_equal(map.paid, "paid");
    assert_string_equal(map.cancelled, "cancelled");
    assert_string_equal(map.cancelled_at, "cancelled_at");
    assert_string_equal(map.deadline, "pay_deadline");
    assert_int_equal(map.window_ms, 0);
    assert_int_equal(map.n_on_cancel, 2);
    assert_string_equal(map.on_cancel[1], "DELETE FROM shop.holds WHERE order_id = $1");
    lapse__orders_map_free(&map);
    assert_int_equal(map.n_on_cancel, 0);
}

static void test_short_forms(void **state) {
    (void)state;
    lapse__orders_map_t map;
    lapse_error_t err;
    const char *json =
        "{\"table\": \"orders\", \"id\": \"order_no\", \"status\": \"state\","
        " \"pending\": \"new\", \"paid\": \"paid\", \"cancelled\": \"void\","
        " \"deadline\": {\"column\": \"created_at\", \"window\": \"30m\"}}";
    assert_int_equal(parse(json, &map, &err), LAPSE_OK);
    assert_string_equal(map.table_schema, "");
    assert_string_equal(map.table, "orders");
    assert_int_equal(map.n_pending, 1);
    assert_string_equal(map.pending[0], "new");
    assert_string_equal(map.cancelled_at, "");
    assert_string_equal(map.deadline, "created_at");
    assert_int_equal(map.window_ms, 30 * 60 * 1000);
    assert_int_equal(map.n_on_cancel, 0);
    lapse__orders_map_free(&map);
}

/* Each mistake, and a part of the one line that must name it. */
static const struct {
    const char *json;
    const char *says;
} MISTAKES[] = {
    {"{\"table\": ", "not JSON"},
    {"[1]", "JSON object"},
    {"{\"tabel\": \"orders\"}", "unknown key \"tabel\""},
    {"{\"id\": \"id\"}", "\"table\" is missing"},
    {"{\"table\": \"a.b.c\", \"id\": \"id\"}", "TABLE or SCHEMA.TABLE"},
    {"{\"table\": \"o\", \"status\": \"s\"}", "\"id\" is missing"},
    {"{\"table\": \"o\", \"id\": \"i\"}", "\"status\" is missing"},
    {"{\"table\": \"o\", \"id\": \"i\", \"status\": \"s\"}", "\"pending\" is missing"},
    {"{\"table\": \"o\", \"id\": \"i\", \"status\": \"s\", \"pending\": []}",
     "\"pending\" must be"},
    {"{\"table\": \"o\", \"id\": \"i\", \"status\": \"s\", \"pending\": [\"\"]}",
     "\"pending\" must be a non-empty string"},
    {"{\"table\": \"o\", \"id\": \"i\", \"status\": \"s\", \"pending\": \"u\"}",
     "\"paid\" is missing"},
    {"{\"table\": \"o\", \"id\": \"i\", \"status\": \"s\", \"pending\": \"u\", \"paid\": "
     "\"p\"}",
     "\"cancelled\" is missing"},
    {"{\"table\": \"o\", \"id\": \"i\", \"status\": \"s\", \"pending\": \"u\", \"paid\": "
     "\"p\", \"cancelled\": \"c\"}",
     "\"deadline\" is missing"},
    {"{\"table\": \"o\", \"id\": \"i\", \"status\": \"s\", \"pending\": \"u\", \"paid\": "
     "\"p\", \"cancelled\": \"c\", \"deadline\": {\"column\": \"t\"}}",
     "needs a \"column\" and a \"window\""},
    {"{\"table\": \"o\", \"id\": \"i\", \"status\": \"s\", \"pending\": \"u\", \"paid\": "
     "\"p\", \"cancelled\": \"c\", \"deadline\": {\"column\": \"t\", \"window\": "
     "\"soon\"}}",
     "duration such as \"30m\", not \"soon\""},
    {"{\"table\": \"o\", \"id\": \"i\", \"status\": \"s\", \"pending\": \"u\", \"paid\": "
     "\"p\", \"cancelled\": \"c\", \"deadline\": {\"column\": \"t\", \"window\": \"1h\", "
     "\"at\": 1}}",
     "unknown key \"deadline.at\""},
    {"{\"table\": \"o\", \"id\": \"i\", \"status\": \"s\", \"pending\": \"u\", \"paid\": "
     "\"p\", \"cancelled\": \"c\", \"deadline\": \"d\", \"on_cancel\": \"DELETE\"}",
     "\"on_cancel\" must be an array"},
    {"{\"table\": \"o\", \"id\": \"i\", \"status\": \"s\", \"pending\": [\"u\", \"p\"], "
     "\"paid\": \"p\", \"cancelled\": \"c\", \"deadline\": \"d\"}",
     "pending value \"p\" is also paid or cancelled"},
    {"{\"table\": \"o\", \"id\": \"i\", \"status\": \"s\", \"pending\": \"u\", \"paid\": "
     "\"x\", \"cancelled\": \"x\", \"deadline\": \"d\"}",
     "paid and cancelled are the same value"},
    {"{\"table\": \"o\", \"id\": "
     "\"a_name_that_is_much_longer_than_the_sixty_three_bytes_postgres_allows\"}",
     "\"id\" is longer than 63 bytes"},
    {"{\"table\": \"o\", \"table\": \"p\"}", "not JSON"},
};

static void test_mistakes_are_one_clear_line(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof MISTAKES / sizeof MISTAKES[0]; i++) {
        lapse__orders_map_t map;
        lapse_error_t err;
        lapse_status_t rc = parse(MISTAKES[i].json, &map, &err);
        if (rc != LAPSE_ERR_CONFIG_MAP || strstr(err.text, MISTAKES[i].says) == NULL ||
            strchr(err.text, '\n') != NULL) {
            fail_msg("case %zu: %s -> %d \"%s\", wanted \"%s\"", i, MISTAKES[i].json, rc,
                     err.text, MISTAKES[i].says);
        }
        lapse__orders_map_free(&map);
    }
}

static void test_load_names_the_file(void **state) {
    (void)state;
    lapse__orders_map_t map;
    lapse_error_t err;
    assert_int_equal(lapse__orders_map_load("/nonexistent/map.json", &map, &err),
                     LAPSE_ERR_CONFIG_MAP);
    assert_non_null(strstr(err.text, "/nonexistent/map.json"));
    char path[] = "/tmp/lapse-test-map-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("{\"table\": \"o\", \"id\": \"i\", \"status\": \"s\", \"pending\": \"u\","
          " \"paid\": \"p\", \"cancelled\": \"c\", \"deadline\": \"d\"}",
          f);
    fclose(f);
    assert_int_equal(lapse__orders_map_load(path, &map, &err), LAPSE_OK);
    assert_string_equal(map.deadline, "d");
    lapse__orders_map_free(&map);
    remove(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_map),
        cmocka_unit_test(test_short_forms),
        cmocka_unit_test(test_mistakes_are_one_clear_line),
        cmocka_unit_test(test_load_names_the_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

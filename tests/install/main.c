/* SPDX-License-Identifier: MIT
 * A program that embeds the installed library (tests/integration/test_install.c builds
 * it through pkg-config and through the CMake package): it publishes one order through
 * the public API, configured from the environment like the lapse binary
 * (LAPSE_AMQP_URL, LAPSE_STORE, LAPSE_PREFIX, LAPSE_CLASSES), with a 30-minute payment
 * window. Usage: publish-order ORDER_ID. Exits 0 once the broker confirmed it. */
#include <lapse/lapse.h>
#include <lapse/publisher.h>

#include <stdio.h>
#include <string.h>
#include <time.h>

#define WINDOW_MS (30 * 60 * 1000)

static void on_published(void *opaque, uint64_t ref, const char *order_id,
                         lapse_status_t rc, const char *reason) {
    (void)ref;
    *(lapse_status_t *)opaque = rc;
    if (rc != LAPSE_OK) {
        fprintf(stderr, "publish-order: %s: %s (%s)\n", order_id, lapse_strerror(rc),
                reason ? reason : "");
    }
}

static int fail(const char *what, lapse_status_t rc, const lapse_error_t *err) {
    fprintf(stderr, "publish-order: %s: %s: %s\n", what, lapse_strerror(rc), err->text);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: publish-order ORDER_ID\n");
        return 2;
    }
    /* The headers it was compiled with and the library it runs with agree. */
    if (strcmp(lapse_version(), LAPSE_VERSION) != 0) {
        fprintf(stderr, "publish-order: library %s, headers %s\n", lapse_version(),
                LAPSE_VERSION);
        return 1;
    }
    printf("lapse %s\n", lapse_version());

    lapse_error_t err = {0};
    lapse_status_t rc = LAPSE_OK;
    int code = 1;
    lapse_config_t *cfg = lapse_config_new();
    lapse_store_t *store = NULL;
    lapse_publisher_t *pub = NULL;
    lapse_status_t outcome = LAPSE_ERR_INVALID; /* until the callback says otherwise */
    if (!cfg) {
        fprintf(stderr, "publish-order: out of memory\n");
        return 1;
    }
    if ((rc = lapse_config_from_env(cfg, &err)) != LAPSE_OK) {
        code = fail("configuration", rc, &err);
        goto out;
    }
    store = lapse_store_open_config(cfg, 0, &rc, &err);
    if (!store) {
        code = fail("store", rc, &err);
        goto out;
    }
    pub = lapse_publisher_open(cfg, store, on_published, &outcome, &rc, &err);
    if (!pub) {
        code = fail("broker", rc, &err);
        goto out;
    }
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    int64_t now_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    const char *holds[] = {"seat-1"};
    lapse_new_order_t order = {.order_id = argv[1],
                               .deadline_ms = now_ms + WINDOW_MS,
                               .created_at_ms = now_ms,
                               .holds = holds,
                               .n_holds = 1};
    if ((rc = lapse_publisher_submit(pub, &order, WINDOW_MS, 1, &err)) != LAPSE_OK ||
        (rc = lapse_publisher_flush(pub, &err)) != LAPSE_OK) {
        code = fail("publish", rc, &err);
        goto out;
    }
    if (outcome == LAPSE_OK) {
        printf("%s published\n", argv[1]);
        code = 0;
    }
out:
    lapse_publisher_close(pub);
    lapse_store_close(store);
    lapse_config_free(cfg);
    return code;
}

/* SPDX-License-Identifier: MIT
 * The store's side of a cancel, alone: lapse_store_cancel_batch on a SQLite file (WAL,
 * synchronous=FULL as lapse opens it) full of due pending orders, in batches, with no
 * broker. Prints wall and CPU time per cancelled order and how many SQLite statements
 * (sqlite3_reset: every use of a statement ends with one) and steps each order cost.
 *
 *   bench_cancel PATH [ORDERS=100000] [BATCH=500] [HOLDS=1] [EVENTS_EVERY=0]
 *
 * EVENTS_EVERY = K > 0 adds the consumer's outbox work: after every K batches, the events
 * those batches wrote are read back (lapse_store_events_pending with their seqs) and
 * marked published, as the consumer does once their confirms are in; the three parts'
 * CPU is printed apart.
 *
 * PATH and its -wal and -shm files are replaced. Counting works by substitution: lapse
 * calls libsqlite3 through its table of loaded functions (src/sqlite_api_int.h), and once
 * the store is open this program puts counting sqlite3_step and sqlite3_reset in it. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <lapse/store.h>

#include "sqlite_api_int.h"

static unsigned long long n_steps, n_resets;
static int (*real_step)(sqlite3_stmt *);
static int (*real_reset)(sqlite3_stmt *);

static int counting_step(sqlite3_stmt *st) {
    n_steps++;
    return real_step(st);
}

static int counting_reset(sqlite3_stmt *st) {
    n_resets++;
    return real_reset(st);
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

typedef struct owed {
    int64_t *seqs;
    size_t n;
    size_t read;
} owed_t;

static int count_event(void *opaque, const lapse_event_t *ev) {
    owed_t *o = opaque;
    o->read += ev->body[0] != '\0';
    return 0;
}

static int die(const char *what, const lapse_error_t *err) {
    fprintf(stderr, "bench_cancel: %s: %s\n", what, err->text);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_cancel PATH [ORDERS] [BATCH] [HOLDS]\n");
        return 2;
    }
    const char *path = argv[1];
    size_t n = argc > 2 ? strtoul(argv[2], NULL, 10) : 100000;
    size_t batch = argc > 3 ? strtoul(argv[3], NULL, 10) : 500;
    size_t n_holds = argc > 4 ? strtoul(argv[4], NULL, 10) : 1;
    size_t every = argc > 5 ? strtoul(argv[5], NULL, 10) : 0;
    if (n == 0 || batch == 0 || n_holds > 16 || every > 64) {
        fprintf(stderr, "bench_cancel: ORDERS and BATCH > 0, HOLDS <= 16, "
                        "EVENTS_EVERY <= 64\n");
        return 2;
    }
    char uri[4096], side[4200];
    snprintf(uri, sizeof uri, "sqlite:%s", path);
    unlink(path);
    snprintf(side, sizeof side, "%s-wal", path);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", path);
    unlink(side);

    lapse_status_t rc;
    lapse_error_t err;
    lapse_store_t *store = lapse_store_open(uri, &rc, &err);
    if (store == NULL) {
        return die("open", &err);
    }
    real_step = lapse__sq.sqlite3_step;
    real_reset = lapse__sq.sqlite3_reset;
    lapse__sq.sqlite3_step = counting_step;
    lapse__sq.sqlite3_reset = counting_reset;
    char(*ids)[32] = calloc(batch, sizeof *ids);
    char(*holds)[16][40] = calloc(batch, sizeof *holds);
    const char *(*hold_ptrs)[16] = calloc(batch, sizeof *hold_ptrs);
    lapse_new_order_t *orders = calloc(batch, sizeof *orders);
    lapse_status_t *results = calloc(batch, sizeof *results);
    lapse_cancel_item_t *items = calloc(batch, sizeof *items);
    owed_t owed = {.seqs = calloc(batch * (every ? every : 1), sizeof(int64_t))};
    if (!ids || !holds || !hold_ptrs || !orders || !results || !items || !owed.seqs) {
        fprintf(stderr, "bench_cancel: out of memory\n");
        return 1;
    }
    int64_t deadline = lapse_clock_now_ms() - 3600 * 1000;
    for (size_t done = 0; done < n; done += batch) {
        size_t k = n - done < batch ? n - done : batch;
        for (size_t i = 0; i < k; i++) {
            snprintf(ids[i], sizeof ids[i], "ord-%09zu", done + i);
            for (size_t h = 0; h < n_holds; h++) {
                snprintf(holds[i][h], sizeof holds[i][h], "seat-%zu-%zu", done + i, h);
                hold_ptrs[i][h] = holds[i][h];
            }
            orders[i] = (lapse_new_order_t){.order_id = ids[i],
                                            .deadline_ms = deadline,
                                            .created_at_ms = deadline - 1000,
                                            .holds = hold_ptrs[i],
                                            .n_holds = n_holds};
        }
        if (lapse_store_insert_orders(store, orders, k, results, &err) != LAPSE_OK) {
            return die("insert", &err);
        }
        const char *marks[batch];
        for (size_t i = 0; i < k; i++) {
            marks[i] = ids[i];
        }
        if (lapse_store_mark_scheduled(store, marks, k, &err) != LAPSE_OK) {
            return die("mark_scheduled", &err);
        }
    }

    unsigned long long steps0 = n_steps, resets0 = n_resets;
    double wall0 = mono_s(), cpu0 = cpu_s(), cpu_read = 0, cpu_mark = 0;
    size_t batches = 0, events_read = 0;
    for (size_t done = 0; done < n; done += batch) {
        size_t k = n - done < batch ? n - done : batch;
        for (size_t i = 0; i < k; i++) {
            snprintf(ids[i], sizeof ids[i], "ord-%09zu", done + i);
            items[i] = (lapse_cancel_item_t){.order_id = ids[i]};
        }
        if (lapse_store_cancel_batch(store, items, k, lapse_clock_now_ms(), &err) !=
            LAPSE_OK) {
            return die("cancel_batch", &err);
        }
        for (size_t i = 0; i < k; i++) {
            if (items[i].outcome != LAPSE_CANCEL_DONE || items[i].event_seq <= 0 ||
                items[i].deadline_ms != deadline) {
                fprintf(stderr, "bench_cancel: %s: %s, seq %" PRId64 "\n", ids[i],
                        lapse_cancel_outcome_name(items[i].outcome), items[i].event_seq);
                return 1;
            }
            owed.seqs[owed.n++] = items[i].event_seq;
        }
        if (every == 0) {
            owed.n = 0;
        } else if (++batches % every == 0 || done + k >= n) {
            double t0 = cpu_s();
            owed.read = 0;
            if (lapse_store_events_pending(store, owed.n, owed.seqs, owed.n, count_event,
                                           &owed, &err) != LAPSE_OK) {
                return die("events_pending", &err);
            }
            double t1 = cpu_s();
            if (lapse_store_events_mark_published(
                    store, owed.seqs, owed.n, lapse_clock_now_ms(), &err) != LAPSE_OK) {
                return die("events_mark_published", &err);
            }
            cpu_read += t1 - t0;
            cpu_mark += cpu_s() - t1;
            events_read += owed.read;
            owed.n = 0;
        }
    }
    double wall = mono_s() - wall0, cpu = cpu_s() - cpu0;
    if (every > 0 && events_read != n) {
        fprintf(stderr, "bench_cancel: %zu events read back, want %zu\n", events_read, n);
        return 1;
    }
    double steps = (double)(n_steps - steps0), stmts = (double)(n_resets - resets0);
    int64_t counts[3] = {0};
    if (lapse_store_count(store, counts, &err) != LAPSE_OK ||
        counts[LAPSE_ORDER_CANCELLED] != (int64_t)n) {
        fprintf(stderr, "bench_cancel: %" PRId64 " cancelled, want %zu\n",
                counts[LAPSE_ORDER_CANCELLED], n);
        return 1;
    }
    printf("orders=%zu batch=%zu holds=%zu wall_us_per_order=%.2f cpu_us_per_order=%.2f"
           " statements_per_order=%.3f steps_per_order=%.3f statements_per_batch=%.1f\n",
           n, batch, n_holds, wall * 1e6 / (double)n, cpu * 1e6 / (double)n,
           stmts / (double)n, steps / (double)n,
           stmts / (double)((n + batch - 1) / batch));
    if (every > 0) {
        printf("events_every=%zu cancel_cpu_us=%.2f read_cpu_us=%.2f mark_cpu_us=%.2f\n",
               every, (cpu - cpu_read - cpu_mark) * 1e6 / (double)n,
               cpu_read * 1e6 / (double)n, cpu_mark * 1e6 / (double)n);
    }
    int64_t unpublished = -1;
    if (every > 0 && (lapse_store_events_count(store, &unpublished, &err) != LAPSE_OK ||
                      unpublished != 0)) {
        fprintf(stderr, "bench_cancel: %" PRId64 " events unpublished, want 0\n",
                unpublished);
        return 1;
    }
    lapse_store_close(store);
    free(owed.seqs);
    free(ids);
    free(holds);
    free(hold_ptrs);
    free(orders);
    free(results);
    free(items);
    return 0;
}

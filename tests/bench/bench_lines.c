/* SPDX-License-Identifier: MIT
 * bench_lines: write `lapse publish --batch` lines, as fast as possible or at a steady
 * rate (the pacer for the lag measurements).
 *
 * usage: bench_lines N PREFIX TIMEOUT [RATE]
 * Writes N lines {"order_id":"PREFIX-<i>","timeout":"TIMEOUT"} to stdout. With RATE > 0,
 * line i is written no earlier than i/RATE seconds after the start, flushed as it is due,
 * so the reader sees a steady stream. Exits 0 when done, 1 when stdout fails. */
#include "bench_common.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5) {
        fputs("usage: bench_lines N PREFIX TIMEOUT [RATE]\n", stderr);
        return 2;
    }
    size_t n = bench_count(argv[1], "N");
    const char *prefix = argv[2];
    const char *timeout = argv[3];
    double rate = argc > 4 ? (double)bench_count(argv[4], "RATE") : 0.0;
    signal(SIGPIPE, SIG_IGN);

    double t0 = bench_now();
    size_t i = 0;
    while (i < n) {
        size_t due = n;
        if (rate > 0) {
            due = (size_t)((bench_now() - t0) * rate) + 1;
            due = due < n ? due : n;
        }
        for (; i < due; i++) {
            if (printf("{\"order_id\":\"%s-%zu\",\"timeout\":\"%s\"}\n", prefix, i,
                       timeout) < 0) {
                fprintf(stderr, "bench_lines: write: %s\n", strerror(errno));
                return 1;
            }
        }
        if (rate > 0) {
            if (fflush(stdout) != 0) {
                fprintf(stderr, "bench_lines: write: %s\n", strerror(errno));
                return 1;
            }
            nanosleep(&(struct timespec){.tv_nsec = 1000 * 1000}, NULL);
        }
    }
    return fflush(stdout) == 0 ? 0 : 1;
}

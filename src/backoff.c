/* SPDX-License-Identifier: MIT
 * Backoff with jitter for reconnects and store retries, and an interruptible sleep. */
#include "backoff_int.h"

#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int64_t lapse__backoff_ms(unsigned attempt, int64_t base_ms, int64_t cap_ms) {
    int64_t ceiling = base_ms;
    for (unsigned i = 0; i < attempt && ceiling < cap_ms; i++) {
        ceiling *= 2;
    }
    if (ceiling > cap_ms) {
        ceiling = cap_ms;
    }
    static bool seeded;
    if (!seeded) {
        /* Per process, or every consumer would draw the same "random" delays. */
        srandom((unsigned)time(NULL) ^ (unsigned)getpid() << 16);
        seeded = true;
    }
    /* Full jitter keeps competing consumers from reconnecting in lock-step; the floor of
     * base_ms keeps a retry from turning into a busy loop. */
    int64_t span = ceiling - base_ms;
    return base_ms + (span > 0 ? (int64_t)(random() % (span + 1)) : 0);
}

bool lapse__sleep_ms(int64_t ms, const volatile sig_atomic_t *stop) {
    while (ms > 0) {
        if (stop && *stop) {
            return false;
        }
        int64_t step = ms < 100 ? ms : 100;
        struct timespec ts = {.tv_sec = step / 1000, .tv_nsec = (step % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        ms -= step;
    }
    return !(stop && *stop);
}

/* SPDX-License-Identifier: MIT
 * Internal: backoff with jitter and an interruptible sleep, for every retry loop. */
#ifndef LAPSE_BACKOFF_INT_H
#define LAPSE_BACKOFF_INT_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

/** Sleep for ms, returning early (false) when *stop becomes non-zero. stop may be NULL.
 */
bool lapse__sleep_ms(int64_t ms, const volatile sig_atomic_t *stop);

/** Exponential backoff with full jitter: attempt 0,1,2.. -> [base, min(cap, base*2^n)].
 */
int64_t lapse__backoff_ms(unsigned attempt, int64_t base_ms, int64_t cap_ms);

#endif

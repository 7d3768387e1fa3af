/* SPDX-License-Identifier: MIT
 * Internal: the monotonic clock, for every interval, timeout and sample age (a step of
 * the wall clock must neither stretch nor shorten a wait), and time sums that cannot
 * overflow. */
#ifndef LAPSE_CLOCK_INT_H
#define LAPSE_CLOCK_INT_H

#include <stdint.h>

/** CLOCK_MONOTONIC in ms (an arbitrary origin; only differences mean anything). */
int64_t lapse__mono_ms(void);

/** Overflow-checked a + b for times and durations: saturates at INT64_MIN/INT64_MAX. */
int64_t lapse__time_add(int64_t a, int64_t b);

#endif

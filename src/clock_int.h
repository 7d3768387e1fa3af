/* SPDX-License-Identifier: MIT
 * Internal: the monotonic clock, for every interval, timeout and sample age (a step of
 * the wall clock must neither stretch nor shorten a wait). */
#ifndef LAPSE_CLOCK_INT_H
#define LAPSE_CLOCK_INT_H

#include <stdint.h>

/** CLOCK_MONOTONIC in ms (an arbitrary origin; only differences mean anything). */
int64_t lapse__mono_ms(void);

#endif

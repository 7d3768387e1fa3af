/* SPDX-License-Identifier: MIT
 * One line of `lapse publish --batch`: {"order_id":..,"timeout":"30m"|"deadline":..,
 * "holds":[..]}. */
#ifndef LAPSE_BATCH_H
#define LAPSE_BATCH_H

#include <lapse/message.h>

typedef struct lapse_batch_line {
    char order_id[LAPSE_ORDER_ID_MAX + 1];
    int64_t timeout_ms;  /* > 0 when the line gave "timeout" */
    int64_t deadline_ms; /* now + timeout, or the line's "deadline"; 0 when the line
                            gave neither (the store has it: an orders map) */
    const char **holds;  /* borrowed from the line; valid until _clear */
    size_t n_holds;
    void *priv_; /* owns what holds point into */
} lapse_batch_line_t;

/**
 * Parse one line (borrowed; need not be NUL-terminated). At most one of "timeout" and
 * "deadline" (neither: the caller takes the deadline from the store); "holds" optional,
 * an array of 1..256-byte strings. Unknown keys are refused so that typos don't pass
 * silently.
 * @param out  on LAPSE_OK filled; release with lapse_batch_line_clear().
 * @return LAPSE_OK or LAPSE_ERR_MSG_* / LAPSE_ERR_CONFIG_DURATION with err->text.
 */
LAPSE_API lapse_status_t lapse_batch_line_parse(const char *line, size_t len,
                                                int64_t now_ms, lapse_batch_line_t *out,
                                                lapse_error_t *err);

/** Release what a successful parse holds; accepts a zeroed struct. */
LAPSE_API void lapse_batch_line_clear(lapse_batch_line_t *line);

#endif

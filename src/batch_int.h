/* SPDX-License-Identifier: MIT
 * Internal: the two readers behind lapse_batch_line_parse(), apart for the fuzzer, which
 * checks that they agree on every line the plain one decides. */
#ifndef LAPSE_BATCH_INT_H
#define LAPSE_BATCH_INT_H

#include <lapse/batch.h>

#include <stdbool.h>

/**
 * The general reader: jansson, any JSON. Same contract as lapse_batch_line_parse()
 * except that it does not check the line's length.
 */
lapse_status_t lapse__batch_line_parse_json(const char *line, size_t len, int64_t now_ms,
                                            lapse_batch_line_t *out, lapse_error_t *err);

/**
 * The plain reader: decides only a line that is one JSON object of the members
 * "order_id" (required), "timeout" and "deadline", each once, each a string of printable
 * ASCII without escapes, with JSON whitespace anywhere between tokens. Such a line gets
 * exactly the verdict, fields and error text the general reader gives it: true, with the
 * verdict in *rc. Any other line (holds, escapes, other bytes, other keys or value types,
 * a key given twice, anything malformed) is not decided: false, *out zeroed, err and
 * *rc untouched, and the caller hands the line to the general reader.
 */
bool lapse__batch_line_parse_plain(const char *line, size_t len, int64_t now_ms,
                                   lapse_batch_line_t *out, lapse_error_t *err,
                                   lapse_status_t *rc);

#endif

/* SPDX-License-Identifier: MIT
 * Internal: the expiry message decoder's JSON path, for the tests that hold the fast
 * path (message.c, decode_canonical) to it. */
#ifndef LAPSE_MESSAGE_INT_H
#define LAPSE_MESSAGE_INT_H

#include <lapse/message.h>

/** lapse_expiry_msg_decode without its fast path for the canonical form: every body
 *  through jansson. Same contract, same verdicts and reasons. */
lapse_status_t lapse__expiry_msg_decode_json(const void *body, size_t len,
                                             lapse_expiry_msg_t *out, lapse_error_t *err);

#endif

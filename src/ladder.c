/* SPDX-License-Identifier: MIT
 * The delay ladder: a delay as the rungs it waits in, spelled as a routing key. */
#include "ladder_int.h"

#include <string.h>

/* Word i of a key (0 = leftmost) stands for rung RUNGS-1-i. */
static void spell(char *buf, int rung_of_interest, int bit, int64_t seconds) {
    for (int i = 0; i < LAPSE__LADDER_RUNGS; i++) {
        int rung = LAPSE__LADDER_RUNGS - 1 - i;
        char c;
        if (rung_of_interest >= 0) {
            c = rung == rung_of_interest ? (char)('0' + bit) : '*';
        } else {
            c = (char)('0' + ((seconds >> rung) & 1));
        }
        buf[2 * i] = c;
        buf[2 * i + 1] = i + 1 < LAPSE__LADDER_RUNGS ? '.' : '\0';
    }
}

lapse_status_t lapse__ladder_route(int64_t delay_ms, lapse__ladder_route_t *out) {
    int64_t seconds = 1;
    if (delay_ms > 1000) {
        if (delay_ms > LAPSE__LADDER_MAX_MS) {
            return LAPSE_ERR_INVALID;
        }
        seconds = delay_ms / 1000 + (delay_ms % 1000 != 0);
    }
    out->seconds = seconds;
    out->hops = 0;
    out->top = 0;
    for (int k = 0; k < LAPSE__LADDER_RUNGS; k++) {
        if ((seconds >> k) & 1) {
            out->hops++;
            out->top = k;
        }
    }
    spell(out->routing_key, -1, 0, seconds);
    return LAPSE_OK;
}

int64_t lapse__ladder_parse_key(const char *routing_key) {
    if (strlen(routing_key) != LAPSE__LADDER_RK_LEN - 1) {
        return -1;
    }
    int64_t seconds = 0;
    for (int i = 0; i < LAPSE__LADDER_RUNGS; i++) {
        char c = routing_key[2 * i];
        char sep = routing_key[2 * i + 1];
        if ((c != '0' && c != '1') || (i + 1 < LAPSE__LADDER_RUNGS && sep != '.')) {
            return -1;
        }
        seconds = seconds << 1 | (c - '0');
    }
    return seconds;
}

void lapse__ladder_pattern(int rung, int bit, char *buf) {
    spell(buf, rung, bit, 0);
}

/* SPDX-License-Identifier: MIT
 * Library logging: format one line and hand it to the sink set on the config. */
#include "config_int.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

void lapse__log(const lapse_config_t *cfg, lapse_log_level_t level, const char *fmt,
                ...) {
    /* The level is checked first: a filtered line costs a compare, not a format (the
     * consumer's decision lines come at up to ~16k/s). */
    if (cfg == NULL || cfg->log_cb == NULL || fmt == NULL || level > cfg->log_level) {
        return;
    }
    char raw[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    if (n < 0) {
        return;
    }
    /* The sink is promised one line; broker reply texts, message fields and file paths
     * can carry control characters that would split or forge log lines, or drive the
     * terminal that shows them. */
    char line[sizeof raw * 2];
    cfg->log_cb(cfg->log_opaque, level, lapse__escape_ctl(raw, line, sizeof line));
}

void lapse__log_burst(const lapse_config_t *cfg, bool begin) {
    if (cfg != NULL && cfg->log_cb != NULL && cfg->log_burst_cb != NULL) {
        cfg->log_burst_cb(cfg->log_opaque, begin);
    }
}

char *lapse__escape_ctl(const char *in, char *out, size_t cap) {
    static const char hex[] = "0123456789abcdef";
    size_t used = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p != '\0'; p++) {
        bool ctl = *p < 0x20 || *p == 0x7f;
        size_t need = ctl ? 4 : 1;
        if (used + need >= cap) {
            break;
        }
        if (ctl) {
            out[used++] = '\\';
            out[used++] = 'x';
            out[used++] = hex[*p >> 4];
            out[used++] = hex[*p & 0xf];
        } else {
            out[used++] = (char)*p;
        }
    }
    if (cap > 0) {
        out[used] = '\0';
    }
    return out;
}

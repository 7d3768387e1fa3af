/* SPDX-License-Identifier: MIT
 * Library logging: format one line and hand it to the sink set on the config. */
#include "config_int.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* The longest line lapse__log formats; a longer one is cut. */
#define LAPSE__LOG_LINE_MAX 1024

/* The bytes at the start of s that need no escape: a line usually has nothing to
 * escape, and is then handed on as it is (the consumer logs one per order). */
static size_t clean_span(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    while (*p >= 0x20 && *p != 0x7f) {
        p++;
    }
    return (size_t)(p - (const unsigned char *)s);
}

bool lapse__log_wants(const lapse_config_t *cfg, lapse_log_level_t level) {
    return cfg != NULL && cfg->log_cb != NULL && level <= cfg->log_level;
}

void lapse__log_text(const lapse_config_t *cfg, lapse_log_level_t level,
                     const char *line) {
    if (!lapse__log_wants(cfg, level) || line == NULL) {
        return;
    }
    /* The sink is promised one line; broker reply texts, message fields and file paths
     * can carry control characters that would split or forge log lines, or drive the
     * terminal that shows them. A line with none, the usual one, goes as it is. */
    size_t clean = clean_span(line);
    if (line[clean] == '\0') {
        cfg->log_cb(cfg->log_opaque, level, line);
        return;
    }
    char safe[LAPSE__LOG_LINE_MAX * 2];
    cfg->log_cb(cfg->log_opaque, level, lapse__escape_ctl(line, safe, sizeof safe));
}

void lapse__log(const lapse_config_t *cfg, lapse_log_level_t level, const char *fmt,
                ...) {
    /* The level is checked first: a filtered line costs a compare, not a format (the
     * consumer's decision lines come at up to ~16k/s). */
    if (!lapse__log_wants(cfg, level) || fmt == NULL) {
        return;
    }
    char raw[LAPSE__LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    if (n >= 0) {
        lapse__log_text(cfg, level, raw);
    }
}

void lapse__log_burst(const lapse_config_t *cfg, bool begin) {
    if (cfg != NULL && cfg->log_cb != NULL && cfg->log_burst_cb != NULL) {
        cfg->log_burst_cb(cfg->log_opaque, begin);
    }
}

char *lapse__escape_ctl(const char *in, char *out, size_t cap) {
    static const char hex[] = "0123456789abcdef";
    if (cap == 0) {
        return out;
    }
    size_t used = 0;
    const char *p = in;
    while (*p != '\0') {
        /* A run that needs no escape goes in one copy, cut where the room ends. */
        size_t run = clean_span(p);
        size_t fits = run < cap - 1 - used ? run : cap - 1 - used;
        memcpy(out + used, p, fits);
        used += fits;
        p += fits;
        if (fits < run || *p == '\0' || used + 4 >= cap) {
            break;
        }
        unsigned char ctl = (unsigned char)*p++;
        out[used++] = '\\';
        out[used++] = 'x';
        out[used++] = hex[ctl >> 4];
        out[used++] = hex[ctl & 0xf];
    }
    out[used] = '\0';
    return out;
}

/* SPDX-License-Identifier: MIT
 * Library logging: format one line and hand it to the sink set on the config. */
#include "config_int.h"

#include <stdarg.h>
#include <stdio.h>

void lapse__log(const lapse_config_t *cfg, lapse_log_level_t level, const char *fmt,
                ...) {
    if (cfg == NULL || cfg->log_cb == NULL || fmt == NULL) {
        return;
    }
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) {
        return;
    }
    /* The sink is promised one line; broker reply texts and file paths can carry control
     * characters that would split or forge log lines. */
    for (char *p = line; *p != '\0'; p++) {
        if (*p == '\n' || *p == '\r') {
            *p = ' ';
        }
    }
    cfg->log_cb(cfg->log_opaque, level, line);
}

/* SPDX-License-Identifier: MIT
 * Status codes: names, messages and retry classes generated from LAPSE_STATUS_MAP. */
#include <lapse/lapse.h>

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *lapse_version(void) {
    return LAPSE_VERSION;
}

/* Each function is a switch generated from the one table, so a duplicated value in the
 * map is a compile error (duplicate case label) rather than a silently shadowed entry. */

const char *lapse_strerror(lapse_status_t rc) {
    switch (rc) {
#define LAPSE_STATUS_MSG_(name, value, retriable, msg)                                   \
    case LAPSE_##name:                                                                   \
        return msg;
        LAPSE_STATUS_MAP(LAPSE_STATUS_MSG_)
#undef LAPSE_STATUS_MSG_
    }
    return "unknown status";
}

const char *lapse_status_name(lapse_status_t rc) {
    switch (rc) {
#define LAPSE_STATUS_NAME_(name, value, retriable, msg)                                  \
    case LAPSE_##name:                                                                   \
        return #name;
        LAPSE_STATUS_MAP(LAPSE_STATUS_NAME_)
#undef LAPSE_STATUS_NAME_
    }
    return "UNKNOWN";
}

bool lapse_status_is_retriable(lapse_status_t rc) {
    switch (rc) {
#define LAPSE_STATUS_RETRY_(name, value, retriable, msg)                                 \
    case LAPSE_##name:                                                                   \
        return (retriable) != 0;
        LAPSE_STATUS_MAP(LAPSE_STATUS_RETRY_)
#undef LAPSE_STATUS_RETRY_
    }
    /* An unknown code cannot be promised to heal itself; parking is the safe side. */
    return false;
}

/* Cut a truncated text back to the start of a UTF-8 sequence, so a reason that ends up in
 * an AMQP header or a log line never carries half a character. */
static void trim_partial_utf8(char *text, size_t len) {
    size_t end = len;
    while (end > 0 && ((unsigned char)text[end - 1] & 0xC0) == 0x80) {
        end--;
    }
    if (end > 0 && ((unsigned char)text[end - 1] & 0x80) != 0) {
        /* text[end - 1] is a lead byte; keep it only if its sequence is complete. */
        unsigned char lead = (unsigned char)text[end - 1];
        size_t need = (lead & 0xE0) == 0xC0   ? 2
                      : (lead & 0xF0) == 0xE0 ? 3
                      : (lead & 0xF8) == 0xF0 ? 4
                                              : 1;
        if (len - (end - 1) < need) {
            text[end - 1] = '\0';
        }
    }
}

lapse_status_t lapse_error_set(lapse_error_t *err, lapse_status_t code, const char *fmt,
                               ...) {
    if (err == NULL) {
        return code;
    }
    /* Format into a local buffer first: callers may pass err->text itself as an argument
     * to prefix a reason ("LAPSE_CLASSES: %s"), and vsnprintf must not overlap. */
    char text[sizeof err->text] = "";
    if (fmt != NULL) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(text, sizeof text, fmt, ap);
        va_end(ap);
        if (n < 0) {
            text[0] = '\0';
        } else if ((size_t)n >= sizeof text) {
            trim_partial_utf8(text, sizeof text - 1);
        }
    }
    err->code = code;
    memcpy(err->text, text, sizeof text);
    return code;
}

void lapse_error_clear(lapse_error_t *err) {
    if (err == NULL) {
        return;
    }
    err->code = LAPSE_OK;
    err->text[0] = '\0';
}

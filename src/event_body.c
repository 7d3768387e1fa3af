/* SPDX-License-Identifier: MIT
 * The order.cancelled event body, written straight into one buffer: what jansson's
 * compact dump of the same object gives, byte for byte (tests/unit/test_event_body.c
 * compares the two on random input), without building the object first. */
#include "store_int.h"

#include <lapse/message.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* The length of the UTF-8 sequence s starts, as jansson accepts it (no overlong forms,
 * no surrogates, nothing past U+10FFFF), or 0 when it is not one. */
static size_t utf8_len(const unsigned char *s) {
    unsigned char c = s[0];
    if (c < 0x80) {
        return 1;
    }
    size_t n;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
        cp = c & 0x1fu;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        cp = c & 0x0fu;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        cp = c & 0x07u;
    } else {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            return 0;
        }
        cp = (cp << 6) | (s[i] & 0x3fu);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
        return 0;
    }
    return n;
}

/* A byte JSON writes as it is and that starts no multi-byte sequence: printable ASCII
 * but the quote and the backslash. */
static bool plain(unsigned char c) {
    return c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
}

size_t lapse__json_string_size(const char *s) {
    size_t size = 2;
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        if (plain(*p)) { /* the common case, without the UTF-8 decoder's call */
            size++;
            p++;
            continue;
        }
        size_t n = utf8_len(p);
        if (n == 0) {
            return 0;
        }
        if (*p == '"' || *p == '\\' || *p == '\b' || *p == '\f' || *p == '\n' ||
            *p == '\r' || *p == '\t') {
            size += 2;
        } else if (*p < 0x20) {
            size += 6;
        } else {
            size += n;
        }
        p += n;
    }
    return size;
}

char *lapse__json_put_string(char *out, const char *s) {
    static const char hex[] = "0123456789ABCDEF";
    *out++ = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (plain(*p) || *p >= 0x80) {
            *out++ = (char)*p;
            continue;
        }
        const char *esc = NULL;
        switch (*p) {
            case '"':
                esc = "\\\"";
                break;
            case '\\':
                esc = "\\\\";
                break;
            case '\b':
                esc = "\\b";
                break;
            case '\f':
                esc = "\\f";
                break;
            case '\n':
                esc = "\\n";
                break;
            case '\r':
                esc = "\\r";
                break;
            case '\t':
                esc = "\\t";
                break;
            default:
                break;
        }
        if (esc != NULL) {
            *out++ = esc[0];
            *out++ = esc[1];
        } else { /* another control character */
            memcpy(out, "\\u00", 4);
            out[4] = hex[*p >> 4];
            out[5] = hex[*p & 0xf];
            out += 6;
        }
    }
    *out++ = '"';
    return out;
}

static char *put(char *out, const char *s) {
    size_t n = strlen(s);
    memcpy(out, s, n);
    return out + n;
}

/* A string that needs no escape, in quotes. */
static char *put_quoted(char *out, const char *s, size_t n) {
    *out++ = '"';
    memcpy(out, s, n);
    out[n] = '"';
    return out + n + 1;
}

char *lapse__event_body(const char *order_id, int64_t deadline_ms,
                        int64_t cancelled_at_ms, char *const *holds, size_t n_holds) {
    char deadline[LAPSE_RFC3339_LEN];
    char cancelled_at[LAPSE_RFC3339_LEN];
    lapse_time_format_rfc3339(deadline_ms, deadline);
    lapse_time_format_rfc3339(cancelled_at_ms, cancelled_at);
    static const char head[] = "{\"event\":";
    static const char id_key[] = ",\"order_id\":";
    static const char deadline_key[] = ",\"deadline\":";
    static const char at_key[] = ",\"cancelled_at\":";
    static const char holds_key[] = ",\"holds\":[";
    /* The event's name and the two times need no escape (the times are the formatter's
     * digits and "-:.TZ"): they are copied as they are, quoted. Only the order id and
     * the holds are scanned. */
    size_t id_size = lapse__json_string_size(order_id);
    if (id_size == 0) {
        return NULL;
    }
    size_t size = sizeof head + sizeof id_key + sizeof deadline_key + sizeof at_key +
                  sizeof holds_key + 2 /* "]}" and the NUL, with room to spare */ +
                  sizeof LAPSE_EVENT_CANCELLED + 1 + 2 * (LAPSE_RFC3339_LEN + 1) +
                  id_size;
    for (size_t h = 0; h < n_holds; h++) {
        size_t n = lapse__json_string_size(holds[h]);
        if (n == 0) {
            return NULL; /* jansson refuses it too: no body, as before */
        }
        size += n + 1;
    }
    char *text = malloc(size);
    if (text == NULL) {
        return NULL;
    }
    char *out = put(text, head);
    out = put_quoted(out, LAPSE_EVENT_CANCELLED, sizeof LAPSE_EVENT_CANCELLED - 1);
    out = lapse__json_put_string(put(out, id_key), order_id);
    out = put_quoted(put(out, deadline_key), deadline, LAPSE_RFC3339_LEN - 1);
    out = put_quoted(put(out, at_key), cancelled_at, LAPSE_RFC3339_LEN - 1);
    out = put(out, holds_key);
    for (size_t h = 0; h < n_holds; h++) {
        if (h > 0) {
            *out++ = ',';
        }
        out = lapse__json_put_string(out, holds[h]);
    }
    *out++ = ']';
    *out++ = '}';
    *out = '\0';
    return text;
}

/* SPDX-License-Identifier: MIT
 * Lines from a file descriptor (see line_reader.h). */
#include "line_reader.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK 65536

void line_reader_init(line_reader_t *r, int fd) {
    memset(r, 0, sizeof *r);
    r->fd = fd;
    r->max = LINE_READER_MAX;
}

void line_reader_free(line_reader_t *r) {
    free(r->buf);
    r->buf = NULL;
}

/* Read more input after what is buffered; false at the end, on error or on timeout. */
static bool fill(line_reader_t *r, int wait_ms, bool *timed_out) {
    if (r->start > 0) { /* keep the unread part at the front */
        memmove(r->buf, r->buf + r->start, r->end - r->start);
        r->end -= r->start;
        r->start = 0;
    }
    if (r->cap - r->end < CHUNK) {
        size_t cap = r->cap ? r->cap * 2 : 2 * CHUNK;
        char *buf = realloc(r->buf, cap);
        if (!buf) {
            r->error = ENOMEM;
            return false;
        }
        r->buf = buf;
        r->cap = cap;
    }
    if (wait_ms >= 0) {
        struct pollfd p = {.fd = r->fd, .events = POLLIN};
        int n;
        do {
            n = poll(&p, 1, wait_ms);
        } while (n < 0 && errno == EINTR);
        if (n == 0) {
            *timed_out = true;
            return false;
        }
    }
    ssize_t got;
    do {
        got = read(r->fd, r->buf + r->end, r->cap - r->end - 1);
    } while (got < 0 && errno == EINTR);
    if (got < 0) {
        r->error = errno;
        return false;
    }
    if (got == 0) {
        r->eof = true;
        return false;
    }
    r->end += (size_t)got;
    return true;
}

/* Drop the unread bytes of an over-long line up to nl (or all of them when nl is NULL).
 */
static void skip(line_reader_t *r, const char *nl) {
    size_t upto = nl ? (size_t)(nl - r->buf) : r->end;
    r->skipped += upto - r->start;
    r->start = nl ? upto + 1 : upto;
}

ssize_t line_reader_next(line_reader_t *r, char **line, int wait_ms) {
    for (;;) {
        char *nl =
            r->end > r->start ? memchr(r->buf + r->start, '\n', r->end - r->start) : NULL;
        if (!r->skipping && !nl && r->end - r->start > r->max) {
            r->skipping = true;
            r->skipped = 0;
        }
        if (r->skipping) {
            skip(r, nl);
            if (nl || r->eof || r->error) {
                r->skipping = false;
                return LINE_READER_TOO_LONG;
            }
            bool timed_out = false;
            if (!fill(r, wait_ms, &timed_out) && timed_out) {
                return LINE_READER_WAIT;
            }
            continue;
        }
        if (!nl && (r->eof || r->error) && r->end > r->start) {
            nl = r->buf + r->end; /* a last line without '\n' */
            r->end++;             /* room was kept for the NUL */
        }
        if (nl && (size_t)(nl - (r->buf + r->start)) > r->max) {
            r->skipped = 0; /* whole in the buffer, yet too long all the same */
            skip(r, nl);
            return LINE_READER_TOO_LONG;
        }
        if (nl) {
            char *begin = r->buf + r->start;
            *nl = '\0';
            size_t len = (size_t)(nl - begin);
            r->start = (size_t)(nl - r->buf) + 1;
            while (len > 0 && begin[len - 1] == '\r') {
                begin[--len] = '\0';
            }
            *line = begin;
            return (ssize_t)len;
        }
        if (r->eof || r->error) {
            return LINE_READER_END;
        }
        bool timed_out = false;
        if (!fill(r, wait_ms, &timed_out) && timed_out) {
            return LINE_READER_WAIT;
        }
    }
}

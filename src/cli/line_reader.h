/* SPDX-License-Identifier: MIT
 * Lines from a file descriptor, with a way to ask "is a line ready without waiting?", so
 * that a batch reading a slow pipe can publish what it holds instead of waiting. */
#ifndef LAPSE_CLI_LINE_READER_H
#define LAPSE_CLI_LINE_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The longest line kept: a longer one is read past and reported, never buffered whole
 * (a batch line is one small JSON object; a file without newlines must not take all the
 * memory there is). */
#define LINE_READER_MAX 65536

/* line_reader_next's results besides a length. */
enum { LINE_READER_END = -1, LINE_READER_WAIT = -2, LINE_READER_TOO_LONG = -3 };

typedef struct line_reader {
    int fd;    /* borrowed */
    char *buf; /* owned */
    size_t cap;
    size_t start; /* first unread byte */
    size_t end;   /* one past the last byte read */
    bool eof;
    int error;      /* errno of a failed read, 0 if none */
    size_t max;     /* LINE_READER_MAX unless changed after init */
    bool skipping;  /* inside a line longer than max */
    size_t skipped; /* bytes of that line so far (its length when reported) */
} line_reader_t;

void line_reader_init(line_reader_t *r, int fd);
void line_reader_free(line_reader_t *r);

/**
 * The next line without its '\n' (and '\r'), NUL-terminated, in *line (borrowed until
 * the next call). wait_ms < 0 blocks; otherwise waits at most wait_ms for input.
 * @return its length; LINE_READER_END at the end of input or on a read error (r->error);
 *         LINE_READER_WAIT when no whole line came within wait_ms; LINE_READER_TOO_LONG
 *         for a line longer than r->max, whose r->skipped bytes were read and dropped (it
 *         counts as a line). Memory stays within about r->max plus 128 KiB.
 */
ssize_t line_reader_next(line_reader_t *r, char **line, int wait_ms);

#endif

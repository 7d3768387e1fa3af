/* SPDX-License-Identifier: MIT
 * Lines from a file descriptor, with a way to ask "is a line ready without waiting?", so
 * that a batch reading a slow pipe can publish what it holds instead of waiting. */
#ifndef LAPSE_CLI_LINE_READER_H
#define LAPSE_CLI_LINE_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct line_reader {
    int fd;    /* borrowed */
    char *buf; /* owned */
    size_t cap;
    size_t start; /* first unread byte */
    size_t end;   /* one past the last byte read */
    bool eof;
    int error; /* errno of a failed read, 0 if none */
} line_reader_t;

void line_reader_init(line_reader_t *r, int fd);
void line_reader_free(line_reader_t *r);

/**
 * The next line without its '\n' (and '\r'), NUL-terminated, in *line (borrowed until
 * the next call). wait_ms < 0 blocks; otherwise waits at most wait_ms for input.
 * @return its length; -1 at the end of input or on a read error (r->error); -2 when
 *         no whole line came within wait_ms.
 */
ssize_t line_reader_next(line_reader_t *r, char **line, int wait_ms);

#endif

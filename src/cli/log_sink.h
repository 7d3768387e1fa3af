/* SPDX-License-Identifier: MIT
 * The executable's log sink: the library's key=value lines to stderr as text or JSON,
 * with the journal's priority prefix when stderr is the journal. */
#ifndef LAPSE_CLI_LOG_SINK_H
#define LAPSE_CLI_LOG_SINK_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <lapse/config.h>

typedef struct cli_log {
    bool json;    /* one JSON object a line instead of "<ts> level=<l> <line>" */
    bool journal; /* stderr is journald's stream: each line starts with "<N>" */
    /* In a burst (cli_log_burst), whole lines wait here and go out in writes of at most
     * PIPE_BUF bytes: atomic on a pipe, so lines of processes sharing the stream (lapse
     * demo) still never interleave. */
    bool in_burst;
    size_t n_held;
    char held[PIPE_BUF];
} cli_log_t;

/** Fill log from cfg's log_format and from JOURNAL_STREAM (checked against stderr). */
void cli_log_setup(cli_log_t *log, const lapse_config_t *cfg);

/** True when journal_stream ("DEV:INODE", the value of JOURNAL_STREAM) names the file
 *  open on fd: systemd sets it for a service whose stderr goes to the journal, and it is
 *  inherited by anything the service starts, so the descriptor itself is compared
 *  (sd_journal_stream_fd(3)). NULL or malformed: false. */
bool cli_log_is_journal(const char *journal_stream, int fd);

/** The syslog priority journald reads from a "<N>" line prefix: 3 err, 4 warning,
 *  6 info, 7 debug. */
int cli_log_priority(lapse_log_level_t level);

/**
 * One log line as the sink writes it, with its newline. text: "<RFC 3339 ts> level=<l>
 * <line>"; json: {"ts":..,"level":..,"event":..,...}, each key=value of line a string
 * field in order (a "quoted value" without its quotes; a word without '=' goes to
 * "msg"), escaped by jansson; bytes that are not UTF-8 are written \xHH. Passwords in
 * URLs are redacted first, in either format. With log->journal, "<N>" comes first.
 * @return new, free() it; NULL on OOM.
 */
char *cli_log_format(const cli_log_t *log, int64_t ts_ms, lapse_log_level_t level,
                     const char *line);

/**
 * One of the executable's own error lines (text: "lapse: ..." as the CLI wrote it,
 * already redacted) as the sink would write it: as it is in text; in JSON
 * {"ts":..,"level":"error","event":"error","msg":text}; with log->journal, "<3>" first.
 * With its newline. @return new, free() it; NULL on OOM.
 */
char *cli_log_format_error(const cli_log_t *log, int64_t ts_ms, const char *text);

/** lapse_log_cb writing cli_log_format's line to stderr in one write, or, in a burst,
 *  holding it for a write of several; opaque is a borrowed cli_log_t (NULL: text, no
 *  prefix, no bursts) that must outlive the config's use. */
void cli_log_sink(void *opaque, lapse_log_level_t level, const char *line);

/** lapse_log_burst_cb for cli_log_sink: a burst's end writes what it held. */
void cli_log_burst(void *opaque, bool begin);

#endif

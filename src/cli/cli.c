/* SPDX-License-Identifier: MIT
 * Shared pieces of the lapse executable: exit codes, errors, logging, signals. */
#include "cli.h"
#include "config_int.h"
#include "log_sink.h"

#include <lapse/message.h>

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int cli_exit_code(lapse_status_t rc) {
    switch (rc) {
        case LAPSE_OK:
            return CLI_EXIT_OK;
        case LAPSE_ERR_INVALID:
        case LAPSE_ERR_CONFIG_URL:
        case LAPSE_ERR_CONFIG_DURATION:
        case LAPSE_ERR_CONFIG_CLASS:
        case LAPSE_ERR_CONFIG_PREFIX:
        case LAPSE_ERR_CONFIG_STORE:
        case LAPSE_ERR_CONFIG_UNKNOWN:
        case LAPSE_ERR_CONFIG_VALUE:
        case LAPSE_ERR_CONFIG_MAP:
            return CLI_EXIT_USAGE;
        case LAPSE_ERR_STORE_CONFLICT:
        case LAPSE_ERR_STORE_STATE:
        case LAPSE_ERR_STORE_LAPSED:
            return CLI_EXIT_REFUSED;
        case LAPSE_ERR_STORE_NOT_FOUND:
            return CLI_EXIT_NOT_FOUND;
        default:
            return CLI_EXIT_FAILED;
    }
}

char *cli_redact(const char *text, char *buf, size_t cap) {
    if (cap == 0) {
        return buf;
    }
    size_t used = 0;
    const char *p = text;
    /* scheme://user:password@host...: the password ends at the last '@' of the
     * authority, which ends at '/', '?' or '#' (a password must percent-encode those).
     * More than a password may be hidden that way, never less. */
    for (const char *sep = strstr(p, "://"); sep != NULL; sep = strstr(p, "://")) {
        const char *user = sep + 3;
        size_t authority = strcspn(user, "/?#\n");
        const char *at = NULL;
        for (const char *q = user; q < user + authority; q++) {
            at = *q == '@' ? q : at;
        }
        const char *colon = at ? memchr(user, ':', (size_t)(at - user)) : NULL;
        /* "user:password@" is how a usage text spells the form; it stays readable. */
        bool secret =
            colon && at > colon + 1 &&
            !(at - colon - 1 == 8 && strncasecmp(colon + 1, "password", 8) == 0);
        const char *resume = secret ? at : user;
        const char *keep_to = secret ? colon + 1 : user;
        int n = snprintf(buf + used, cap - used, "%.*s%s", (int)(keep_to - p), p,
                         secret ? "***" : "");
        used += n > 0 ? (size_t)n : 0;
        if (used >= cap) {
            buf[cap - 1] = '\0';
            return buf;
        }
        p = resume;
    }
    /* The rest as it is (no printf: the consumer's decision lines come through here). */
    size_t rest = strlen(p);
    size_t fits = rest < cap - 1 - used ? rest : cap - 1 - used;
    memcpy(buf + used, p, fits);
    buf[used + fits] = '\0';
    return buf;
}

/* One line to stderr, passwords redacted: every error of the CLI goes through here. The
 * whole text is redacted before it is cut to a line's length, so a cut can never leave
 * the start of a password behind. */
static void error_line(const char *lead, const char *fmt, va_list ap, const char *tail)
    __attribute__((format(printf, 2, 0)));

/* Where error lines go once the settings are known: the log sink's format and journald
 * prefix (cli_set_error_log); NULL: plain text. */
static const cli_log_t *error_log;

void cli_set_error_log(const cli_log_t *log) {
    error_log = log;
}

static void error_line(const char *lead, const char *fmt, va_list ap, const char *tail) {
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, again);
    va_end(again);
    size_t len = n > 0 ? (size_t)n : 0;
    /* "***" replaces passwords of any length, so the redacted text may be longer. */
    char *text = malloc(len + 1);
    char *safe = malloc(2 * len + 4);
    if (!text || !safe) {
        fprintf(stderr, "%sout of memory while reporting an error%s\n", lead, tail);
    } else {
        vsnprintf(text, len + 1, fmt, ap);
        /* One line, as docs/design.md ("The command line") asks of every error. */
        text[strcspn(text, "\n")] = '\0';
        char line[1200];
        snprintf(line, sizeof line, "%s%.1000s%s", lead,
                 cli_redact(text, safe, 2 * len + 4), tail);
        char *out = error_log != NULL
                        ? cli_log_format_error(error_log, lapse_clock_now_ms(), line)
                        : NULL;
        if (out != NULL) {
            fputs(out, stderr);
            free(out);
        } else {
            fprintf(stderr, "%s\n", line);
        }
    }
    free(text);
    free(safe);
}

void cli_errorf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_line("lapse: ", fmt, ap, "");
    va_end(ap);
}

void cli_say(const char *cmd, const char *fmt, ...) {
    char lead[64];
    snprintf(lead, sizeof lead, "lapse %s: ", cmd);
    va_list ap;
    va_start(ap, fmt);
    error_line(lead, fmt, ap, "");
    va_end(ap);
}

int cli_fail(lapse_status_t rc, const lapse_error_t *err, const char *what) {
    const char *detail = err && err->text[0] ? err->text : lapse_strerror(rc);
    cli_errorf("%s: %s (%s)", what, detail, lapse_status_name(rc));
    return cli_exit_code(rc);
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    char lead[64], tail[64];
    snprintf(lead, sizeof lead, "lapse%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    /* The usage is one --help away. */
    snprintf(tail, sizeof tail, " (see 'lapse%s%s --help')", cmd ? " " : "",
             cmd ? cmd : "");
    va_list ap;
    va_start(ap, fmt);
    error_line(lead, fmt, ap, tail);
    va_end(ap);
    return CLI_EXIT_USAGE;
}

static volatile sig_atomic_t stop_flag;

static void on_stop_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

volatile sig_atomic_t *cli_install_stop_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return &stop_flag;
}

lapse_store_t *cli_try_store(cli_t *cli, unsigned flags, lapse_status_t *rc,
                             lapse_error_t *err) {
    /* A command that installed the stop handlers stops waiting for a locked file at
     * SIGTERM; for the others the flag never rises (the signal ends them). */
    lapse_store_options_t opts;
    lapse_store_options_from_config(cli->cfg, flags, &opts);
    opts.stop = &stop_flag;
    lapse_store_t *store = lapse_store_open_opts(cli->cfg->store, &opts, rc, err);
    const char *warning = lapse_store_warning(store);
    if (warning != NULL) {
        fprintf(stderr, "lapse: warning: %s\n", warning);
    }
    return store;
}

lapse_store_t *cli_open_store(cli_t *cli, unsigned flags, int *exit_code) {
    lapse_status_t rc;
    lapse_error_t err = {0};
    lapse_store_t *store = cli_try_store(cli, flags, &rc, &err);
    if (!store) {
        *exit_code = cli_fail(rc, &err, "open store");
    }
    return store;
}

int64_t cli_setting_ms(const cli_t *cli, const char *property) {
    const char *text = lapse_config_get(cli->cfg, property);
    int64_t ms = 0;
    if (text && strcmp(text, "0") != 0) {
        lapse_duration_parse(text, &ms);
    }
    return ms;
}

void cli_buffer_stdout(void) {
    /* Whole outputs (a topology export is ~30 KB) wait in the buffer for the final
     * flush, so a write error is found there with its errno; a write that fails earlier
     * still leaves ferror set, but glibc may not keep errno until the end. A terminal
     * keeps its line buffering. */
    static char buf[1 << 16];
    if (!isatty(STDOUT_FILENO)) {
        setvbuf(stdout, buf, _IOFBF, sizeof buf);
    }
}

int cli_finish_stdout(int code) {
    errno = 0;
    bool failed = fflush(stdout) != 0;
    int e = failed ? errno : 0;
    failed = ferror(stdout) || failed;
    if (!failed) {
        return code;
    }
    if (e) {
        cli_errorf("write error on stdout: %s", strerror(e));
    } else {
        cli_errorf("write error on stdout");
    }
    return code == CLI_EXIT_OK ? CLI_EXIT_FAILED : code;
}

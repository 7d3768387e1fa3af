/* SPDX-License-Identifier: MIT
 * The executable's log sink. The library hands over one key=value line per event
 * (docs/design.md, "Logging"); this file alone decides how it is written: the text form
 * operators grep, or JSON for log shippers, made from the same line by one parser so
 * that no call site knows about formats. */
#include "log_sink.h"

#include "cli.h"

#include <lapse/message.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const level_names[] = {"error", "warn", "info", "debug"};

bool cli_log_is_journal(const char *journal_stream, int fd) {
    if (journal_stream == NULL) {
        return false;
    }
    unsigned long long dev = 0, ino = 0;
    int used = 0;
    if (sscanf(journal_stream, "%llu:%llu%n", &dev, &ino, &used) != 2 ||
        journal_stream[used] != '\0') {
        return false;
    }
    struct stat st;
    return fstat(fd, &st) == 0 && (unsigned long long)st.st_dev == dev &&
           (unsigned long long)st.st_ino == ino;
}

void cli_log_setup(cli_log_t *log, const lapse_config_t *cfg) {
    const char *format = lapse_config_get(cfg, "log_format");
    log->json = format != NULL && strcmp(format, "json") == 0;
    log->journal = cli_log_is_journal(getenv("JOURNAL_STREAM"), STDERR_FILENO);
}

int cli_log_priority(lapse_log_level_t level) {
    static const int prio[] = {3, 4, 6,
                               7}; /* LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG */
    return prio[level];
}

/* The length of the UTF-8 sequence at p (at most left bytes), 0 when it is not one:
 * jansson refuses such strings, and a message or broker text may carry any bytes. */
static size_t utf8_len(const unsigned char *p, size_t left) {
    size_t n = p[0] < 0x80                    ? 1
               : p[0] >= 0xc2 && p[0] <= 0xdf ? 2
               : (p[0] & 0xf0) == 0xe0        ? 3
               : p[0] >= 0xf0 && p[0] <= 0xf4 ? 4
                                              : 0;
    if (n == 0 || n > left) {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            return 0;
        }
    }
    /* Overlong three- and four-byte forms, surrogates and code points past U+10FFFF. */
    if ((n == 3 && p[0] == 0xe0 && p[1] < 0xa0) ||
        (n == 3 && p[0] == 0xed && p[1] > 0x9f) ||
        (n == 4 && p[0] == 0xf0 && p[1] < 0x90) ||
        (n == 4 && p[0] == 0xf4 && p[1] > 0x8f)) {
        return 0;
    }
    return n;
}

/* A JSON string of len bytes at text, any byte that is not UTF-8 written \xHH. */
static json_t *string_of(const char *text, size_t len) {
    char *buf = malloc(len * 4 + 1);
    if (buf == NULL) {
        return NULL;
    }
    size_t used = 0;
    const unsigned char *p = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        size_t n = utf8_len(p + i, len - i);
        if (n == 0) {
            used += (size_t)snprintf(buf + used, 5, "\\x%02x", p[i]);
            i++;
        } else {
            memcpy(buf + used, p + i, n);
            used += n;
            i += n;
        }
    }
    json_t *s = json_stringn(buf, used);
    free(buf);
    return s;
}

/* Whether a closing quote followed by p ends a quoted value: at the end of the line, or
 * before the next key ("<spaces>name=", name of [A-Za-z0-9_]), so that a quote inside
 * the text does not end it. */
static bool ends_value(const char *p) {
    if (*p == '\0') {
        return true;
    }
    if (*p != ' ') {
        return false;
    }
    while (*p == ' ') {
        p++;
    }
    const char *name = p;
    while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
           (*p >= '0' && *p <= '9') || *p == '_') {
        p++;
    }
    return *p == '\0' || (p > name && *p == '=');
}

/* Add the key=value pairs of line to obj, in order. A value is a word, or a "quoted
 * text" that ends at the quote before the next key or the end of the line (quotes inside
 * it stay); words without '=' are joined into "msg". */
static bool add_fields(json_t *obj, const char *line) {
    size_t cap = strlen(line) + 1;
    char *msg = malloc(cap);
    if (msg == NULL) {
        return false;
    }
    size_t msg_len = 0;
    const char *p = line;
    bool ok = true;
    while (ok && *p != '\0') {
        size_t word = strcspn(p, " ");
        if (word == 0) {
            p++;
            continue;
        }
        const char *key = p;
        const char *eq = memchr(p, '=', word);
        if (eq == NULL || eq == key) {
            msg_len += (size_t)snprintf(msg + msg_len, cap - msg_len, "%s%.*s",
                                        msg_len ? " " : "", (int)word, p);
            p += word;
            continue;
        }
        const char *value = eq + 1;
        size_t len;
        if (*value == '"') {
            value++;
            const char *end = value;
            while (*end != '\0' && !(*end == '"' && ends_value(end + 1))) {
                end++;
            }
            len = (size_t)(end - value);
            p = *end == '"' ? end + 1 : end;
        } else {
            len = (size_t)(key + word - value);
            p = key + word;
        }
        /* ts and level are the sink's own; a line's field of that name is kept as
         * line_ts, line_level. */
        size_t klen = (size_t)(eq - key);
        bool own = (klen == 2 && strncmp(key, "ts", 2) == 0) ||
                   (klen == 5 && strncmp(key, "level", 5) == 0);
        char name[128];
        snprintf(name, sizeof name, "%s%.*s", own ? "line_" : "", (int)klen, key);
        json_t *v = string_of(value, len);
        ok = v != NULL && json_object_set_new(obj, name, v) == 0;
    }
    if (ok && msg_len > 0) {
        ok = json_object_set_new(obj, "msg", string_of(msg, msg_len)) == 0;
    }
    free(msg);
    return ok;
}

static char *format_json(int64_t ts_ms, lapse_log_level_t level, const char *line) {
    char ts[LAPSE_RFC3339_LEN];
    lapse_time_format_rfc3339(ts_ms, ts);
    json_t *obj = json_object();
    char *out = NULL;
    if (obj != NULL && json_object_set_new(obj, "ts", json_string(ts)) == 0 &&
        json_object_set_new(obj, "level", json_string(level_names[level])) == 0 &&
        add_fields(obj, line)) {
        out = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    }
    json_decref(obj);
    return out;
}

char *cli_log_format_error(const cli_log_t *log, int64_t ts_ms, const char *text) {
    char *body = NULL;
    if (log != NULL && log->json) {
        char ts[LAPSE_RFC3339_LEN];
        lapse_time_format_rfc3339(ts_ms, ts);
        json_t *obj = json_pack("{s:s, s:s, s:s, s:s?}", "ts", ts, "level", "error",
                                "event", "error", "msg", text);
        body = obj != NULL ? json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(obj);
    } else {
        body = strdup(text);
    }
    if (body == NULL) {
        return NULL;
    }
    size_t n = strlen(body) + 8;
    char *out = malloc(n);
    if (out != NULL) {
        snprintf(out, n, "%s%s\n", log != NULL && log->journal ? "<3>" : "", body);
    }
    free(body);
    return out;
}

/* The pieces of a line, put one after the other; returns the byte after them. */
static char *put(char *out, const char *s, size_t n) {
    memcpy(out, s, n);
    return out + n;
}

char *cli_log_format(const cli_log_t *log, int64_t ts_ms, lapse_log_level_t level,
                     const char *line) {
    if (level > LAPSE_LOG_DEBUG) {
        level = LAPSE_LOG_DEBUG;
    }
    /* "***" replaces passwords of any length: the redacted line may be longer. The text
     * form is written in the same buffer, after the room its head takes: one allocation
     * and no printf per line (the consumer writes one per order). */
    static const size_t head_room = 8 + LAPSE_RFC3339_LEN + 16; /* <p>, ts, " level=x " */
    size_t cap = head_room + 2 * strlen(line) + 8;
    char *buf = malloc(cap);
    if (buf == NULL) {
        return NULL;
    }
    char *safe = buf + head_room;
    cli_redact(line, safe, cap - head_room);
    char prefix[8] = "";
    if (log != NULL && log->journal) {
        snprintf(prefix, sizeof prefix, "<%d>", cli_log_priority(level));
    }
    if (log == NULL || !log->json) {
        char ts[LAPSE_RFC3339_LEN];
        lapse_time_format_rfc3339(ts_ms, ts);
        size_t n_safe = strlen(safe);
        /* The head fits before safe (head_room), so safe moves only once, to meet it. */
        char *out = put(buf, prefix, strlen(prefix));
        out = put(out, ts, strlen(ts));
        out = put(out, " level=", 7);
        out = put(out, level_names[level], strlen(level_names[level]));
        *out++ = ' ';
        memmove(out, safe, n_safe);
        out += n_safe;
        *out++ = '\n';
        *out = '\0';
        return buf;
    }
    char *body = format_json(ts_ms, level, safe);
    free(buf);
    if (body == NULL) {
        return NULL;
    }
    size_t n = strlen(prefix) + strlen(body) + 2;
    char *out = malloc(n);
    if (out != NULL) {
        snprintf(out, n, "%s%s\n", prefix, body);
    }
    free(body);
    return out;
}

static void write_held(cli_log_t *log) {
    if (log->n_held > 0) {
        fwrite(log->held, 1, log->n_held, stderr);
        log->n_held = 0;
    }
}

void cli_log_sink(void *opaque, lapse_log_level_t level, const char *line) {
    cli_log_t *log = opaque;
    char *out = cli_log_format(log, lapse_clock_now_ms(), level, line);
    if (out == NULL) {
        fputs("lapse: out of memory while logging\n", stderr);
        return;
    }
    size_t len = strlen(out);
    if (log != NULL && log->in_burst && len <= sizeof log->held) {
        if (log->n_held + len > sizeof log->held) {
            write_held(log);
        }
        memcpy(log->held + log->n_held, out, len);
        log->n_held += len;
    } else {
        /* One write, so that lines of processes sharing the stream (lapse demo) never
         * interleave; held lines go first, to keep the order. */
        if (log != NULL) {
            write_held(log);
        }
        fwrite(out, 1, len, stderr);
    }
    free(out);
}

void cli_log_burst(void *opaque, bool begin) {
    cli_log_t *log = opaque;
    if (log == NULL) {
        return;
    }
    if (!begin) {
        write_held(log);
    }
    log->in_burst = begin;
}

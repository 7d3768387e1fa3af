/* SPDX-License-Identifier: MIT
 * The broker password: the URL's, or a password file's content, which keeps it off the
 * command line and out of the environment (docs/design.md, "Connections"). */
#include "secret_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void lapse__secret_wipe(void *p, size_t n) {
    /* A volatile pointer: the stores cannot be dropped as dead. */
    volatile unsigned char *b = p;
    while (n-- > 0) {
        *b++ = 0;
    }
}

bool lapse__secret_from_text(const char *text, size_t len, char *out, size_t cap,
                             const char **why) {
    /* Editors and `echo` end a file with a newline; it is never part of the password. */
    if (len > 0 && text[len - 1] == '\n') {
        len--;
        if (len > 0 && text[len - 1] == '\r') {
            len--;
        }
    }
    if (len == 0) {
        *why = "it is empty";
        return false;
    }
    if (memchr(text, '\0', len) != NULL || memchr(text, '\n', len) != NULL ||
        memchr(text, '\r', len) != NULL) {
        *why = "it holds more than one line (or a NUL byte)";
        return false;
    }
    if (len >= cap) {
        *why = "it is longer than 127 bytes";
        return false;
    }
    memcpy(out, text, len);
    out[len] = '\0';
    return true;
}

lapse_status_t lapse__secret_password(const lapse_config_t *cfg, char *out, size_t cap,
                                      lapse_error_t *err) {
    const char *path = cfg->amqp_password_file;
    if (path[0] == '\0') {
        snprintf(out, cap, "%s", cfg->password);
        return LAPSE_OK;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return lapse_error_set(err, LAPSE_ERR_IO, "amqp password file %s: %s", path,
                               strerror(errno));
    }
    /* One byte more than a password and its line break may take, to see a longer one. */
    char text[LAPSE__PASSWORD_MAX + 2];
    size_t len = 0;
    int e = 0;
    while (len < sizeof text) {
        ssize_t n = read(fd, text + len, sizeof text - len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            e = errno;
            break;
        }
        if (n == 0) {
            break;
        }
        len += (size_t)n;
    }
    close(fd);
    lapse_status_t rc = LAPSE_OK;
    const char *why = NULL;
    if (e != 0) {
        rc = lapse_error_set(err, LAPSE_ERR_IO, "amqp password file %s: %s", path,
                             strerror(e));
    } else if (!lapse__secret_from_text(text, len, out, cap, &why)) {
        rc = lapse_error_set(err, LAPSE_ERR_IO, "amqp password file %s: %s", path, why);
    }
    lapse__secret_wipe(text, sizeof text);
    return rc;
}

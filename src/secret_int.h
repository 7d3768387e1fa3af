/* SPDX-License-Identifier: MIT
 * Internal: the broker password in effect, from the URL or from a password file
 * (systemd credentials, Docker secrets). */
#ifndef LAPSE_SECRET_INT_H
#define LAPSE_SECRET_INT_H

#include "config_int.h"

/** The longest password, with its NUL (the URL's field). */
#define LAPSE__PASSWORD_MAX 128

/**
 * The password to log in with into out (cap bytes, at least LAPSE__PASSWORD_MAX): the
 * content of cfg's amqp_password_file when one is set, else the URL's password. The
 * caller wipes out with lapse__secret_wipe() after use. On failure (the file cannot be
 * read, is empty, too long, or holds a NUL or a line break before its end) LAPSE_ERR_IO
 * (exit 1; final for the consumer), with err naming the file and the reason, never its
 * content.
 */
lapse_status_t lapse__secret_password(const lapse_config_t *cfg, char *out, size_t cap,
                                      lapse_error_t *err);

/**
 * Pure part of the above: the password held by a file's len bytes in text (borrowed),
 * i.e. without one trailing "\n" or "\r\n", copied into out (cap bytes). Returns false,
 * with *why a static reason, when it is empty, holds a NUL or another line break, or
 * does not fit.
 */
bool lapse__secret_from_text(const char *text, size_t len, char *out, size_t cap,
                             const char **why);

/** Overwrite n bytes at p with zeros in a way the compiler keeps. */
void lapse__secret_wipe(void *p, size_t n);

#endif

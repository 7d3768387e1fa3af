/* SPDX-License-Identifier: MIT
 * Internal: a shared library that lapse loads on its first use (dlopen), not when the
 * process starts (docs/design.md, "Libraries loaded on first use"). A consumer on SQLite
 * never touches libpq and its Kerberos/LDAP chain; one without --metrics-listen never
 * touches libmicrohttpd and GnuTLS; one outside systemd never touches libsystemd.
 * Their pages stay out of the process (about 4 MB of RSS of 11 MB idle). */
#ifndef LAPSE_DYNLIB_INT_H
#define LAPSE_DYNLIB_INT_H

#include <lapse/lapse.h>

#include <pthread.h>

/* One symbol to resolve: its name and where its address goes. */
typedef struct lapse__dynsym {
    const char *name;
    void **slot; /* a function pointer of the library's own prototype, as void * */
} lapse__dynsym_t;

/* A library and its symbols; a static object of the file that owns the table, with
 * LAPSE__DYNLIB_INIT. The handle is never closed: the symbols stay valid for the whole
 * process. */
typedef struct lapse__dynlib {
    const char *soname; /* what dlopen asks for: the SONAME the build found */
    const lapse__dynsym_t *syms;
    size_t n_syms;
    pthread_mutex_t lock;
    bool tried;
    lapse_status_t rc;
    char why[sizeof((lapse_error_t *)0)->text];
} lapse__dynlib_t;

#define LAPSE__DYNLIB_INIT(soname_, syms_)                                               \
    {                                                                                    \
        .soname = (soname_), .syms = (syms_),                                            \
        .n_syms = sizeof(syms_) / sizeof((syms_)[0]), .lock = PTHREAD_MUTEX_INITIALIZER  \
    }

/* A library's table from one X-macro list of its function names, LIST(X, arg) calling
 * X(arg, name) for each: LIST(LAPSE__DYNSYM_FIELD, _) inside a struct declares one
 * pointer of the function's own prototype per name (so every call is compiler-checked
 * as a direct one); LIST(LAPSE__DYNSYM_ENTRY, table) inside a lapse__dynsym_t array
 * names each and points at table's field. */
#define LAPSE__DYNSYM_FIELD(unused, name) __typeof__(&name) name;
#define LAPSE__DYNSYM_ENTRY(table, name)  {#name, (void **)&(table).name},

/**
 * Load lib and resolve every one of its symbols, once per process: later calls return
 * the first call's outcome (a library that could not be loaded is not tried again).
 * @return LAPSE_OK, or fail (the caller's code for "this feature cannot start") with the
 *         reason in err: the library or one of its symbols missing, and the Debian
 * package that has it. Thread-safety: safe; callers may race on the first call.
 */
lapse_status_t lapse__dynlib_load(lapse__dynlib_t *lib, lapse_status_t fail,
                                  lapse_error_t *err);

#endif

/* SPDX-License-Identifier: MIT
 * Libraries loaded on first use: dlopen by SONAME, every symbol resolved up front, so a
 * missing or mismatched library is one clear error when the feature starts, never a
 * crash in the middle of its work. */
#include "dynlib_int.h"

#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* Debian's name for the package of a SONAME: libpq.so.5 is in libpq5, and a name that
 * ends in a digit takes a hyphen (libfoo2.so.1 is in libfoo2-1). */
static void package_of(const char *soname, char *out, size_t cap) {
    const char *so = strstr(soname, ".so.");
    if (so == NULL) {
        snprintf(out, cap, "%s", soname);
        return;
    }
    int base = (int)(so - soname);
    bool hyphen = base > 0 && isdigit((unsigned char)soname[base - 1]);
    snprintf(out, cap, "%.*s%s%s", base, soname, hyphen ? "-" : "", so + 4);
}

static void load(lapse__dynlib_t *lib) {
    char package[64];
    package_of(lib->soname, package, sizeof package);
    /* RTLD_LOCAL: the library's symbols serve lapse's table, not later dlopens. */
    void *handle = dlopen(lib->soname, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        const char *why = dlerror();
        snprintf(lib->why, sizeof lib->why, "cannot load %s (Debian package %s): %s",
                 lib->soname, package, why != NULL ? why : "unknown error");
        return;
    }
    for (size_t i = 0; i < lib->n_syms; i++) {
        dlerror();
        void *sym = dlsym(handle, lib->syms[i].name);
        if (sym == NULL) {
            snprintf(lib->why, sizeof lib->why, "%s has no symbol %s (Debian package %s)",
                     lib->soname, lib->syms[i].name, package);
            /* Some of the table may be set: none of it is used (rc says failed). */
            return;
        }
        *lib->syms[i].slot = sym;
    }
    lib->rc = LAPSE_OK;
}

lapse_status_t lapse__dynlib_load(lapse__dynlib_t *lib, lapse_status_t fail,
                                  lapse_error_t *err) {
    pthread_mutex_lock(&lib->lock);
    if (!lib->tried) {
        lib->tried = true;
        lib->rc = LAPSE_ERR_IO; /* until load() says otherwise */
        load(lib);
    }
    lapse_status_t rc = lib->rc;
    pthread_mutex_unlock(&lib->lock);
    if (rc == LAPSE_OK) {
        return LAPSE_OK;
    }
    return lapse_error_set(err, fail, "%s", lib->why);
}

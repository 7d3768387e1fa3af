/* SPDX-License-Identifier: MIT
 * The SQLite store's VFS: SQLite's default one, with the writes appended to a WAL file
 * gathered into one pwrite (sqlite_vfs_int.h). */
#include "sqlite_vfs_int.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* The most bytes gathered before they are written: about 15 WAL frames of 4 KiB pages.
 * A commit of a consumer's batch is 40-50 frames, so 3-4 writes instead of 80-100; a
 * larger buffer would save a few more system calls for more resident memory. */
#define GATHER_MAX (64 * 1024)

typedef struct gather_file {
    sqlite3_file base;  /* pMethods: &gather_io, or NULL when the open failed */
    sqlite3_file *real; /* the default VFS's file, in the same allocation, after this */
    unsigned char *buf; /* NULL until the first gathered write; GATHER_MAX bytes */
    size_t len;         /* bytes gathered, to be written at off */
    sqlite3_int64 off;
} gather_file_t;

static sqlite3_vfs *base_vfs; /* SQLite's default VFS, set once at registration */

/* Write what is gathered. On failure it is dropped all the same: the error reaches
 * SQLite through the call that asked for the flush (a sync, a read, ...), which fails
 * the transaction, and SQLite writes its frames again if it tries again. */
static int flush(gather_file_t *g) {
    if (g->len == 0) {
        return SQLITE_OK;
    }
    int rc = g->real->pMethods->xWrite(g->real, g->buf, (int)g->len, g->off);
    g->len = 0;
    return rc;
}

static int g_close(sqlite3_file *f) {
    gather_file_t *g = (gather_file_t *)f;
    int rc = flush(g);
    int rc2 = g->real->pMethods->xClose(g->real);
    free(g->buf);
    g->buf = NULL;
    return rc != SQLITE_OK ? rc : rc2;
}

static int g_read(sqlite3_file *f, void *p, int n, sqlite3_int64 off) {
    gather_file_t *g = (gather_file_t *)f;
    int rc = flush(g);
    return rc != SQLITE_OK ? rc : g->real->pMethods->xRead(g->real, p, n, off);
}

static int g_write(sqlite3_file *f, const void *p, int n, sqlite3_int64 off) {
    gather_file_t *g = (gather_file_t *)f;
    /* Only a write that continues the gathered bytes joins them. */
    if (g->len > 0 &&
        (off != g->off + (sqlite3_int64)g->len || g->len + (size_t)n > GATHER_MAX)) {
        int rc = flush(g);
        if (rc != SQLITE_OK) {
            return rc;
        }
    }
    if ((size_t)n > GATHER_MAX / 2) {
        return g->real->pMethods->xWrite(g->real, p, n, off);
    }
    if (g->buf == NULL && (g->buf = malloc(GATHER_MAX)) == NULL) {
        return g->real->pMethods->xWrite(g->real, p, n, off);
    }
    if (g->len == 0) {
        g->off = off;
    }
    memcpy(g->buf + g->len, p, (size_t)n);
    g->len += (size_t)n;
    return SQLITE_OK;
}

static int g_truncate(sqlite3_file *f, sqlite3_int64 size) {
    gather_file_t *g = (gather_file_t *)f;
    int rc = flush(g);
    return rc != SQLITE_OK ? rc : g->real->pMethods->xTruncate(g->real, size);
}

static int g_sync(sqlite3_file *f, int flags) {
    gather_file_t *g = (gather_file_t *)f;
    int rc = flush(g);
    return rc != SQLITE_OK ? rc : g->real->pMethods->xSync(g->real, flags);
}

static int g_file_size(sqlite3_file *f, sqlite3_int64 *size) {
    gather_file_t *g = (gather_file_t *)f;
    int rc = flush(g);
    return rc != SQLITE_OK ? rc : g->real->pMethods->xFileSize(g->real, size);
}

static int g_lock(sqlite3_file *f, int level) {
    gather_file_t *g = (gather_file_t *)f;
    return g->real->pMethods->xLock(g->real, level);
}

static int g_unlock(sqlite3_file *f, int level) {
    gather_file_t *g = (gather_file_t *)f;
    int rc = flush(g);
    int rc2 = g->real->pMethods->xUnlock(g->real, level);
    return rc != SQLITE_OK ? rc : rc2;
}

static int g_check_reserved(sqlite3_file *f, int *out) {
    gather_file_t *g = (gather_file_t *)f;
    return g->real->pMethods->xCheckReservedLock(g->real, out);
}

static int g_file_control(sqlite3_file *f, int op, void *arg) {
    gather_file_t *g = (gather_file_t *)f;
    int rc = flush(g);
    return rc != SQLITE_OK ? rc : g->real->pMethods->xFileControl(g->real, op, arg);
}

static int g_sector_size(sqlite3_file *f) {
    gather_file_t *g = (gather_file_t *)f;
    return g->real->pMethods->xSectorSize(g->real);
}

static int g_device(sqlite3_file *f) {
    gather_file_t *g = (gather_file_t *)f;
    return g->real->pMethods->xDeviceCharacteristics(g->real);
}

static int g_shm_map(sqlite3_file *f, int page, int size, int extend, void volatile **p) {
    gather_file_t *g = (gather_file_t *)f;
    return g->real->pMethods->xShmMap(g->real, page, size, extend, p);
}

static int g_shm_lock(sqlite3_file *f, int offset, int n, int flags) {
    gather_file_t *g = (gather_file_t *)f;
    return g->real->pMethods->xShmLock(g->real, offset, n, flags);
}

static void g_shm_barrier(sqlite3_file *f) {
    gather_file_t *g = (gather_file_t *)f;
    g->real->pMethods->xShmBarrier(g->real);
}

static int g_shm_unmap(sqlite3_file *f, int delete_flag) {
    gather_file_t *g = (gather_file_t *)f;
    return g->real->pMethods->xShmUnmap(g->real, delete_flag);
}

static int g_fetch(sqlite3_file *f, sqlite3_int64 off, int n, void **p) {
    gather_file_t *g = (gather_file_t *)f;
    int rc = flush(g);
    return rc != SQLITE_OK ? rc : g->real->pMethods->xFetch(g->real, off, n, p);
}

static int g_unfetch(sqlite3_file *f, sqlite3_int64 off, void *p) {
    gather_file_t *g = (gather_file_t *)f;
    return g->real->pMethods->xUnfetch(g->real, off, p);
}

/* Version 3, as the unix VFS's WAL files: their shared-memory and fetch methods are
 * passed on (a WAL file is never mapped, but the table must be complete). */
static const sqlite3_io_methods gather_io = {
    .iVersion = 3,
    .xClose = g_close,
    .xRead = g_read,
    .xWrite = g_write,
    .xTruncate = g_truncate,
    .xSync = g_sync,
    .xFileSize = g_file_size,
    .xLock = g_lock,
    .xUnlock = g_unlock,
    .xCheckReservedLock = g_check_reserved,
    .xFileControl = g_file_control,
    .xSectorSize = g_sector_size,
    .xDeviceCharacteristics = g_device,
    .xShmMap = g_shm_map,
    .xShmLock = g_shm_lock,
    .xShmBarrier = g_shm_barrier,
    .xShmUnmap = g_shm_unmap,
    .xFetch = g_fetch,
    .xUnfetch = g_unfetch,
};

/* A WAL file is wrapped; every other file is the default VFS's own, its methods
 * untouched (the wrapper's room in the allocation unused). */
static int v_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags,
                  int *out_flags) {
    (void)vfs;
    gather_file_t *g = (gather_file_t *)f;
    if ((flags & SQLITE_OPEN_WAL) == 0) {
        return base_vfs->xOpen(base_vfs, name, f, flags, out_flags);
    }
    g->real = (sqlite3_file *)(g + 1);
    g->buf = NULL;
    g->len = 0;
    g->base.pMethods = NULL;
    int rc = base_vfs->xOpen(base_vfs, name, g->real, flags, out_flags);
    if (rc == SQLITE_OK) {
        if (g->real->pMethods == NULL || g->real->pMethods->iVersion < 3) {
            /* Not the VFS this was written for: pass it through unwrapped. */
            g->real->pMethods->xClose(g->real);
            return base_vfs->xOpen(base_vfs, name, f, flags, out_flags);
        }
        g->base.pMethods = &gather_io;
    }
    return rc;
}

static int v_delete(sqlite3_vfs *vfs, const char *name, int sync_dir) {
    (void)vfs;
    return base_vfs->xDelete(base_vfs, name, sync_dir);
}

static int v_access(sqlite3_vfs *vfs, const char *name, int flags, int *out) {
    (void)vfs;
    return base_vfs->xAccess(base_vfs, name, flags, out);
}

static int v_full_pathname(sqlite3_vfs *vfs, const char *name, int n, char *out) {
    (void)vfs;
    return base_vfs->xFullPathname(base_vfs, name, n, out);
}

static void *v_dl_open(sqlite3_vfs *vfs, const char *name) {
    (void)vfs;
    return base_vfs->xDlOpen(base_vfs, name);
}

static void v_dl_error(sqlite3_vfs *vfs, int n, char *out) {
    (void)vfs;
    base_vfs->xDlError(base_vfs, n, out);
}

static void (*v_dl_sym(sqlite3_vfs *vfs, void *h, const char *sym))(void) {
    (void)vfs;
    return base_vfs->xDlSym(base_vfs, h, sym);
}

static void v_dl_close(sqlite3_vfs *vfs, void *h) {
    (void)vfs;
    base_vfs->xDlClose(base_vfs, h);
}

static int v_randomness(sqlite3_vfs *vfs, int n, char *out) {
    (void)vfs;
    return base_vfs->xRandomness(base_vfs, n, out);
}

static int v_sleep(sqlite3_vfs *vfs, int us) {
    (void)vfs;
    return base_vfs->xSleep(base_vfs, us);
}

static int v_current_time(sqlite3_vfs *vfs, double *out) {
    (void)vfs;
    return base_vfs->xCurrentTime(base_vfs, out);
}

static int v_last_error(sqlite3_vfs *vfs, int n, char *out) {
    (void)vfs;
    return base_vfs->xGetLastError(base_vfs, n, out);
}

static int v_current_time_int64(sqlite3_vfs *vfs, sqlite3_int64 *out) {
    (void)vfs;
    return base_vfs->xCurrentTimeInt64(base_vfs, out);
}

static sqlite3_vfs gather_vfs = {
    .iVersion = 2,
    .zName = LAPSE__SQLITE_VFS,
    .xOpen = v_open,
    .xDelete = v_delete,
    .xAccess = v_access,
    .xFullPathname = v_full_pathname,
    .xDlOpen = v_dl_open,
    .xDlError = v_dl_error,
    .xDlSym = v_dl_sym,
    .xDlClose = v_dl_close,
    .xRandomness = v_randomness,
    .xSleep = v_sleep,
    .xCurrentTime = v_current_time,
    .xGetLastError = v_last_error,
    .xCurrentTimeInt64 = v_current_time_int64,
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int register_rc = SQLITE_ERROR;

static void register_once(void) {
    base_vfs = lapse__sq.sqlite3_vfs_find(NULL);
    if (base_vfs == NULL || base_vfs->iVersion < 2 ||
        base_vfs->xCurrentTimeInt64 == NULL) {
        return;
    }
    gather_vfs.szOsFile = (int)sizeof(gather_file_t) + base_vfs->szOsFile;
    gather_vfs.mxPathname = base_vfs->mxPathname;
    register_rc = lapse__sq.sqlite3_vfs_register(&gather_vfs, 0);
}

const char *lapse__sqlite_vfs(void) {
    pthread_once(&once, register_once);
    return register_rc == SQLITE_OK ? LAPSE__SQLITE_VFS : NULL;
}

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

/* A main database file or a WAL file. Only a WAL file gathers; a database file passes
 * everything on and, before the WAL's write lock is released through it, has its WAL
 * file write what it gathered (g_shm_lock). */
typedef struct gather_file {
    sqlite3_file base;  /* pMethods: &gather_io, or NULL when the open failed */
    sqlite3_file *real; /* the default VFS's file, in the same allocation, after */
    bool is_wal;
    struct gather_file *link; /* a database file's WAL file, a WAL file's database
                                 file, while both are open; or NULL */
    unsigned char *buf;       /* WAL: NULL until the first gathered write; GATHER_MAX */
    size_t len;               /* bytes gathered, to be written at off */
    sqlite3_int64 off;
} gather_file_t;

static const sqlite3_io_methods gather_io;
static sqlite3_vfs *base_vfs; /* SQLite's default VFS, set once at registration */

/* Write what is gathered. On failure it stays gathered and the error goes to the call
 * that asked (a sync, a read, ...): no commit succeeds before it is written, since the
 * commit's sync asks again. */
static int flush(gather_file_t *g) {
    if (g->len == 0) {
        return SQLITE_OK;
    }
    int rc = g->real->pMethods->xWrite(g->real, g->buf, (int)g->len, g->off);
    if (rc == SQLITE_OK) {
        g->len = 0;
    }
    return rc;
}

/* Write what is gathered, or drop it when that fails: for the moments after which
 * SQLite has no use for frames not yet committed (the write lock released, the file
 * closed). A committed frame is never among them: its commit's sync wrote it. */
static int flush_or_drop(gather_file_t *g) {
    int rc = flush(g);
    g->len = 0;
    return rc;
}

static int g_close(sqlite3_file *f) {
    gather_file_t *g = (gather_file_t *)f;
    int rc = flush_or_drop(g);
    if (g->link != NULL) {
        g->link->link = NULL;
        g->link = NULL;
    }
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
    if (!g->is_wal) {
        return g->real->pMethods->xWrite(g->real, p, n, off);
    }
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
    return g->real->pMethods->xUnlock(g->real, level);
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

/* The WAL's write lock is lock 0 of the database file's shared memory (wal.c's
 * WAL_WRITE_LOCK). Before it is released, all its holder wrote to the WAL is on the
 * file, as with the default VFS: frames that a transaction spilled (SQLite writes pages
 * of a large transaction before its commit) and then rolled back must not be written
 * later, over the frames the next writer committed at the same offsets. */
static int g_shm_lock(sqlite3_file *f, int offset, int n, int flags) {
    gather_file_t *g = (gather_file_t *)f;
    if ((flags & SQLITE_SHM_UNLOCK) != 0 && offset == 0 && g->link != NULL) {
        flush_or_drop(g->link);
    }
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

/* Version 3, as the unix VFS's files: the shared-memory methods (called on the database
 * file) and the fetch methods are passed on. */
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

/* A main database file and a WAL file are wrapped; every other file is the default
 * VFS's own, its methods untouched (the wrapper's room in the allocation unused). A WAL
 * file gathers only when its database file is wrapped (so that the release of the write
 * lock reaches it) and when the device may overwrite a sector's neighbour without harm
 * (SQLITE_IOCAP_POWERSAFE_OVERWRITE, the default: with psow=0 SQLite pads a commit to a
 * sector and syncs in the middle of its last frame, which must be on the file then). */
static int v_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags,
                  int *out_flags) {
    (void)vfs;
    gather_file_t *g = (gather_file_t *)f;
    bool is_wal = (flags & SQLITE_OPEN_WAL) != 0;
    if (!is_wal && (flags & SQLITE_OPEN_MAIN_DB) == 0) {
        return base_vfs->xOpen(base_vfs, name, f, flags, out_flags);
    }
    *g = (gather_file_t){.real = (sqlite3_file *)(g + 1), .is_wal = is_wal};
    int rc = base_vfs->xOpen(base_vfs, name, g->real, flags, out_flags);
    if (rc != SQLITE_OK || g->real->pMethods == NULL) {
        return rc;
    }
    gather_file_t *db = NULL;
    if (is_wal) {
        sqlite3_file *main = lapse__sq.sqlite3_database_file_object(name);
        db = main != NULL && main->pMethods == &gather_io ? (gather_file_t *)main : NULL;
    }
    bool wrap = g->real->pMethods->iVersion >= 3;
    if (wrap && is_wal) {
        /* wal.c asks the database file, as here. */
        int dc = db != NULL ? db->real->pMethods->xDeviceCharacteristics(db->real) : 0;
        wrap = db != NULL && db->link == NULL &&
               (dc & SQLITE_IOCAP_POWERSAFE_OVERWRITE) != 0;
    }
    if (!wrap) {
        /* Not a case this was written for: the default VFS's file as it is. */
        g->real->pMethods->xClose(g->real);
        return base_vfs->xOpen(base_vfs, name, f, flags, out_flags);
    }
    if (db != NULL) {
        db->link = g;
        g->link = db;
    }
    g->base.pMethods = &gather_io;
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

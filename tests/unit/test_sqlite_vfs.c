/* SPDX-License-Identifier: MIT
 * The SQLite store's VFS (src/sqlite_vfs.c): the writes of a WAL commit reach the file
 * in a few calls instead of two per frame, every one of them before the WAL is synced,
 * and the file SQLite's own default VFS then reads holds exactly what the store wrote.
 * The test puts a counting VFS of its own under lapse's: registered as the default
 * before the first store opens, it is the one lapse's wraps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lapse/store.h>

#include "sqlite_api_int.h"
#include "sqlite_vfs_int.h"

/* ---- the counting VFS: unix, with the WAL file's writes and syncs counted ---- */

typedef struct count_file {
    sqlite3_file base;
    sqlite3_file *real;
    int is_wal;
} count_file_t;

static sqlite3_vfs *unix_vfs;
static struct {
    int writes;               /* xWrite calls on WAL files */
    int64_t bytes;            /* bytes they wrote */
    int syncs;                /* xSync calls on WAL files */
    int64_t end;              /* the furthest byte written to the WAL so far */
    int64_t end_at_last_sync; /* end when the WAL was last synced */
} seen;

#define REAL(f) (((count_file_t *)(f))->real)

static int c_close(sqlite3_file *f) {
    return REAL(f)->pMethods->xClose(REAL(f));
}
static int c_read(sqlite3_file *f, void *p, int n, sqlite3_int64 off) {
    return REAL(f)->pMethods->xRead(REAL(f), p, n, off);
}
static int c_write(sqlite3_file *f, const void *p, int n, sqlite3_int64 off) {
    if (((count_file_t *)f)->is_wal) {
        seen.writes++;
        seen.bytes += n;
        if (off + n > seen.end) {
            seen.end = off + n;
        }
    }
    return REAL(f)->pMethods->xWrite(REAL(f), p, n, off);
}
static int c_truncate(sqlite3_file *f, sqlite3_int64 size) {
    return REAL(f)->pMethods->xTruncate(REAL(f), size);
}
static int c_sync(sqlite3_file *f, int flags) {
    if (((count_file_t *)f)->is_wal) {
        seen.syncs++;
        seen.end_at_last_sync = seen.end;
    }
    return REAL(f)->pMethods->xSync(REAL(f), flags);
}
static int c_file_size(sqlite3_file *f, sqlite3_int64 *size) {
    return REAL(f)->pMethods->xFileSize(REAL(f), size);
}
static int c_lock(sqlite3_file *f, int level) {
    return REAL(f)->pMethods->xLock(REAL(f), level);
}
static int c_unlock(sqlite3_file *f, int level) {
    return REAL(f)->pMethods->xUnlock(REAL(f), level);
}
static int c_reserved(sqlite3_file *f, int *out) {
    return REAL(f)->pMethods->xCheckReservedLock(REAL(f), out);
}
static int c_fcntl(sqlite3_file *f, int op, void *arg) {
    return REAL(f)->pMethods->xFileControl(REAL(f), op, arg);
}
static int c_sector(sqlite3_file *f) {
    return REAL(f)->pMethods->xSectorSize(REAL(f));
}
static int c_device(sqlite3_file *f) {
    return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f));
}
static int c_shm_map(sqlite3_file *f, int pg, int sz, int ext, void volatile **p) {
    return REAL(f)->pMethods->xShmMap(REAL(f), pg, sz, ext, p);
}
static int c_shm_lock(sqlite3_file *f, int off, int n, int flags) {
    return REAL(f)->pMethods->xShmLock(REAL(f), off, n, flags);
}
static void c_shm_barrier(sqlite3_file *f) {
    REAL(f)->pMethods->xShmBarrier(REAL(f));
}
static int c_shm_unmap(sqlite3_file *f, int del) {
    return REAL(f)->pMethods->xShmUnmap(REAL(f), del);
}
static int c_fetch(sqlite3_file *f, sqlite3_int64 off, int n, void **p) {
    return REAL(f)->pMethods->xFetch(REAL(f), off, n, p);
}
static int c_unfetch(sqlite3_file *f, sqlite3_int64 off, void *p) {
    return REAL(f)->pMethods->xUnfetch(REAL(f), off, p);
}

static const sqlite3_io_methods count_io = {
    3,          c_close,       c_read,      c_write, c_truncate, c_sync,   c_file_size,
    c_lock,     c_unlock,      c_reserved,  c_fcntl, c_sector,   c_device, c_shm_map,
    c_shm_lock, c_shm_barrier, c_shm_unmap, c_fetch, c_unfetch};

static int c_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags,
                  int *out) {
    (void)vfs;
    count_file_t *c = (count_file_t *)f;
    c->real = (sqlite3_file *)(c + 1);
    c->is_wal = (flags & SQLITE_OPEN_WAL) != 0;
    f->pMethods = NULL;
    int rc = unix_vfs->xOpen(unix_vfs, name, c->real, flags, out);
    if (rc == SQLITE_OK) {
        f->pMethods = &count_io;
    }
    return rc;
}

static sqlite3_vfs count_vfs;

static void install_counting_vfs(void) {
    lapse_error_t err;
    assert_int_equal(lapse__sqlite_load(&err), LAPSE_OK);
    unix_vfs = sqlite3_vfs_find("unix");
    assert_non_null(unix_vfs);
    count_vfs = *unix_vfs;
    count_vfs.pNext = NULL;
    count_vfs.zName = "lapse-test-count";
    count_vfs.szOsFile = (int)sizeof(count_file_t) + unix_vfs->szOsFile;
    count_vfs.xOpen = c_open;
    assert_int_equal(sqlite3_vfs_register(&count_vfs, 1), SQLITE_OK);
}

/* ---- the test ---- */

/* Remove the database file path, its -wal and -shm files, and dir. */
static void remove_db(const char *dir, const char *path) {
    static const char *const suffix[] = {"-wal", "-shm", ""};
    for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++) {
        char file[PATH_MAX + 8];
        snprintf(file, sizeof file, "%s%s", path, suffix[i]);
        unlink(file);
    }
    rmdir(dir);
}

/* Open path read-only through SQLite's default VFS, run sql (two counts, then
 * integrity_check's verdict) and check that it reads want0, want1 and "ok". */
static void check_read(const char *path, const char *sql, int want0, int want1) {
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, "unix"), SQLITE_OK);
    sqlite3_stmt *q = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &q, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(q, 0), want0);
    assert_int_equal(sqlite3_column_int(q, 1), want1);
    assert_string_equal((const char *)sqlite3_column_text(q, 2), "ok");
    sqlite3_finalize(q);
    sqlite3_close(db);
}

#define N 2000

static void test_a_commit_is_a_few_writes_all_before_the_sync(void **state) {
    (void)state;
    install_counting_vfs();
    assert_string_equal(lapse__sqlite_vfs(), LAPSE__SQLITE_VFS);

    char dir[] = "/tmp/lapse-test-vfs-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[sizeof dir + 16], uri[sizeof path + 8], wal[sizeof path + 8];
    snprintf(path, sizeof path, "%s/store.db", dir);
    snprintf(uri, sizeof uri, "sqlite:%s", path);
    snprintf(wal, sizeof wal, "%s-wal", path);
    lapse_status_t rc;
    lapse_error_t err;
    lapse_store_t *store = lapse_store_open(uri, &rc, &err);
    assert_non_null(store);

    /* N orders in one transaction, due at once; then all of them cancelled in one. */
    static char ids[N][16];
    static lapse_new_order_t orders[N];
    static lapse_status_t results[N];
    static lapse_cancel_item_t items[N];
    for (int i = 0; i < N; i++) {
        snprintf(ids[i], sizeof ids[i], "vfs-%05d", i);
        orders[i] = (lapse_new_order_t){.order_id = ids[i],
                                        .deadline_ms = INT64_C(1800000000000) + i,
                                        .created_at_ms = INT64_C(1790000000000)};
        items[i] = (lapse_cancel_item_t){.order_id = ids[i]};
    }
    memset(&seen, 0, sizeof seen);
    assert_int_equal(lapse_store_insert_orders(store, orders, N, results, &err),
                     LAPSE_OK);
    for (int i = 0; i < N; i++) {
        assert_int_equal(results[i], LAPSE_OK);
    }
    assert_int_equal(
        lapse_store_cancel_batch(store, items, N, INT64_C(1800000010000), &err),
        LAPSE_OK);
    for (int i = 0; i < N; i++) {
        assert_int_equal(items[i].outcome, LAPSE_CANCEL_DONE);
    }
    /* The two commits wrote many frames (a page and a 24-byte header each, written as
     * two calls by SQLite), in few calls: a frame is about 4 KiB. */
    int64_t frames = seen.bytes / (4096 + 24);
    print_message("WAL: %lld bytes (%lld frames) in %d writes, %d syncs\n",
                  (long long)seen.bytes, (long long)frames, seen.writes, seen.syncs);
    assert_true(frames >= 40);
    assert_true(seen.writes * 5 < frames);
    assert_true(seen.syncs >= 2);
    /* Every byte of the WAL was written before its last sync: nothing of a commit was
     * still gathered when SQLite was told it was on disk. */
    struct stat st;
    assert_int_equal(stat(wal, &st), 0);
    assert_int_equal(seen.end_at_last_sync, seen.end);
    assert_int_equal((int64_t)st.st_size, seen.end);

    /* What SQLite's default VFS reads, while the store is still open (its WAL not
     * checkpointed): every order cancelled, the file sound. */
    check_read(path,
               "SELECT (SELECT count(*) FROM orders WHERE status = 'cancelled'),"
               " (SELECT count(*) FROM events),"
               " (SELECT integrity_check FROM pragma_integrity_check)",
               N, N);

    lapse_store_close(store);
    remove_db(dir, path);
}

static void exec_ok(sqlite3 *db, const char *sql) {
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        fail_msg("%s: %s", sql, msg != NULL ? msg : "?");
    }
}

/* A large transaction spills frames to the WAL before its commit and is rolled back;
 * another connection then commits more frames at the same offsets. What the first one
 * had gathered must not be written after that (at its next read or its close), over the
 * other's committed frames: it is written before the write lock is released. */
static void test_rolled_back_frames_never_land_on_committed_ones(void **state) {
    (void)state;
    assert_string_equal(lapse__sqlite_vfs(), LAPSE__SQLITE_VFS);
    char dir[] = "/tmp/lapse-test-vfs-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[sizeof dir + 16];
    snprintf(path, sizeof path, "%s/spill.db", dir);
    sqlite3 *x = NULL, *y = NULL;
    int rw = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    assert_int_equal(sqlite3_open_v2(path, &x, rw, LAPSE__SQLITE_VFS), SQLITE_OK);
    exec_ok(x, "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;"
               " PRAGMA cache_size = 10;"
               " CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)");
    /* 300 rows of 2 KB in a cache of 10 pages: most of them spilled, the last ones
     * still gathered when the transaction is rolled back. The WAL is empty first, so
     * the rollback reads no page back from it (which would write what is gathered). */
    exec_ok(x, "PRAGMA wal_checkpoint(TRUNCATE)");
    memset(&seen, 0, sizeof seen);
    exec_ok(x, "BEGIN; WITH RECURSIVE g (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g"
               " WHERE i < 300) INSERT INTO t SELECT i, printf('x%02000d', i) FROM g");
    print_message("spilled before the rollback: %lld bytes\n", (long long)seen.bytes);
    assert_true(seen.bytes > 64 * 1024);
    exec_ok(x, "ROLLBACK");
    /* Another connection, on SQLite's default VFS, commits 600 such rows. */
    assert_int_equal(sqlite3_open_v2(path, &y, SQLITE_OPEN_READWRITE, "unix"), SQLITE_OK);
    exec_ok(y, "PRAGMA synchronous = FULL; BEGIN IMMEDIATE;"
               " WITH RECURSIVE g (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g"
               " WHERE i < 600) INSERT INTO t SELECT i, printf('y%02000d', i) FROM g;"
               " COMMIT");
    /* The first connection reads, then closes. */
    sqlite3_stmt *q = NULL;
    assert_int_equal(sqlite3_prepare_v2(x, "SELECT count(*) FROM t", -1, &q, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(q, 0), 600);
    sqlite3_finalize(q);
    assert_int_equal(sqlite3_close(x), SQLITE_OK);
    /* A third connection finds every row the second one committed, intact. */
    check_read(path,
               "SELECT count(*), sum(v = printf('y%02000d', k)),"
               " (SELECT integrity_check FROM pragma_integrity_check) FROM t",
               600, 600);
    sqlite3_close(y);
    remove_db(dir, path);
}

/* With psow=0 SQLite pads a commit to a sector and syncs in the middle of its last
 * frame: that WAL is not gathered (each frame is SQLite's two writes, as without the
 * VFS). */
static void test_no_gathering_without_powersafe_overwrite(void **state) {
    (void)state;
    assert_string_equal(lapse__sqlite_vfs(), LAPSE__SQLITE_VFS);
    char dir[] = "/tmp/lapse-test-vfs-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[sizeof dir + 16], uri[sizeof path + 32];
    snprintf(path, sizeof path, "%s/psow.db", dir);
    snprintf(uri, sizeof uri, "file:%s?psow=0", path);
    sqlite3 *x = NULL;
    assert_int_equal(
        sqlite3_open_v2(uri, &x,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_URI,
                        LAPSE__SQLITE_VFS),
        SQLITE_OK);
    exec_ok(x, "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;"
               " CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)");
    memset(&seen, 0, sizeof seen);
    exec_ok(x, "WITH RECURSIVE g (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g"
               " WHERE i < 100) INSERT INTO t SELECT i, printf('p%02000d', i) FROM g");
    int64_t frames = seen.bytes / (4096 + 24);
    print_message("psow=0: %lld bytes (%lld frames) in %d writes\n",
                  (long long)seen.bytes, (long long)frames, seen.writes);
    assert_true(frames >= 40);
    assert_true(seen.writes >= 2 * frames);
    assert_int_equal(sqlite3_close(x), SQLITE_OK);
    remove_db(dir, path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_commit_is_a_few_writes_all_before_the_sync),
        cmocka_unit_test(test_rolled_back_frames_never_land_on_committed_ones),
        cmocka_unit_test(test_no_gathering_without_powersafe_overwrite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

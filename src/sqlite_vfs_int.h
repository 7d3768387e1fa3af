/* SPDX-License-Identifier: MIT
 * Internal: the VFS the SQLite store opens its files with. It is SQLite's default VFS
 * (unix), except that writes appended to a WAL file are gathered and written in one
 * pwrite when they stop being contiguous, reach 64 KiB, or before anything else touches
 * the file (a read, a sync, its size, a truncate, a file control, the close) and before
 * the WAL's write lock is released. SQLite writes a WAL frame as two writes (its 24-byte
 * header, then the page), so a commit of 45 frames was 90 system calls; on this
 * project's paravirtualized machines a pwrite costs about 1.5 us of CPU whatever its
 * size (issue 14).
 * Why nothing reaches a reader late: with synchronous = FULL every commit syncs the WAL
 * before SQLite publishes the commit in the WAL index, and the sync writes what was
 * gathered first (the store opens every connection with FULL; NORMAL would publish
 * commits whose frames may still be gathered, so it must not be used with this VFS).
 * Frames a large transaction spilled before its commit and then rolled back are
 * written before the write lock goes, as the default VFS would have written them, not
 * later over frames the next writer committed at the same offsets. A WAL whose
 * database does not declare SQLITE_IOCAP_POWERSAFE_OVERWRITE (a psow=0 URI), where
 * SQLite syncs in the middle of a commit's last frame, is not gathered. Frames gathered
 * and lost in a crash were never committed, as if the crash had come before SQLite
 * wrote them. Other processes (the sqlite3 shell, a second lapse) see the same files and
 * locks as with the default VFS. tests/unit/test_sqlite_vfs.c checks each of these. */
#ifndef LAPSE_SQLITE_VFS_INT_H
#define LAPSE_SQLITE_VFS_INT_H

#include "sqlite_api_int.h"

#define LAPSE__SQLITE_VFS "lapse-gather"

/**
 * The VFS's name for sqlite3_open_v2, registered on the first call (after
 * lapse__sqlite_load); NULL when SQLite's default VFS is not one it can wrap (then the
 * default is used as it is). Thread-safety: safe.
 */
const char *lapse__sqlite_vfs(void);

#endif

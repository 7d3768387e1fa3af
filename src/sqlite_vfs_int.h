/* SPDX-License-Identifier: MIT
 * Internal: the VFS the SQLite store opens its files with. It is SQLite's default VFS
 * (unix), except that writes appended to a WAL file are gathered and written in one
 * pwrite when they stop being contiguous, reach 64 KiB, or before anything else touches
 * the file (a read, a sync, its size, a truncate, a file control, the close). SQLite
 * writes a WAL frame as two writes (its 24-byte header, then the page), so a commit of
 * 45 frames was 90 system calls; on this project's paravirtualized machines a pwrite
 * costs about 1.5 us of CPU whatever its size (issue 14). Nothing is held across a
 * commit: with synchronous = FULL every commit syncs the WAL, and the sync writes what
 * was gathered first, before SQLite publishes the commit in the WAL index (the store
 * opens every connection with FULL; NORMAL would publish commits whose frames may still
 * be gathered, so it must not be used with this VFS); frames gathered and lost in a crash
 * were never committed, as if the crash had come before SQLite wrote them. Other
 * processes (the sqlite3 shell, a second lapse) see the same files and locks as with the
 * default VFS. */
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

/* SPDX-License-Identifier: MIT
 * Internal: the SQLite store's schema and its statements, as data (one X-macro table
 * gives each statement an id, its SQL and a name for error messages). Included by
 * store_sqlite.c only. */
#ifndef LAPSE_STORE_SQLITE_SQL_H
#define LAPSE_STORE_SQLITE_SQL_H

#include <lapse/message.h>

#define SCHEMA_VERSION 8 /* PRAGMA user_version; SCHEMA_SQL sets it */

/* The orders table's columns, for SCHEMA_SQL and for the version 4 rebuild alike. The
 * status CHECK is three comparisons, not `status IN ('pending', 'paid', 'cancelled')`:
 * SQLite codes a constant IN list of more than two values as an ephemeral B-tree, built
 * again for every row an INSERT or a status UPDATE checks. That was an open, a clear and
 * a page of memset per order, about a tenth of a consumer's CPU and more of a
 * publisher's (issue 14). Both forms admit exactly the same rows. */
#define ORDERS_COLUMNS                                                                   \
    " (order_id TEXT NOT NULL PRIMARY KEY,"                                              \
    " status TEXT NOT NULL"                                                              \
    " CHECK (status = 'pending' OR status = 'paid' OR status = 'cancelled'),"            \
    " deadline_ms INTEGER NOT NULL,"                                                     \
    " created_at_ms INTEGER NOT NULL,"                                                   \
    " paid_at_ms INTEGER,"                                                               \
    " cancelled_at_ms INTEGER,"                                                          \
    " scheduled INTEGER NOT NULL DEFAULT 0 CHECK (scheduled IN (0, 1)))"

/* The events table's columns, for SCHEMA_SQL and for the version 5 rebuild alike (the
 * last one, deadline_ms, is version 6's: MIGRATE_V6_SQL adds it to a file of version 5,
 * where ALTER TABLE puts it last too). Up to
 * version 4 event_id was UNIQUE: a guard against a second event for one order, should a
 * second cancellation ever get past the compare-and-set. The compare-and-set is what
 * prevents that (ORDERS_CANCEL changes only a pending row, under the write lock that
 * BEGIN IMMEDIATE takes), and the guard's index, a text key of about 30 bytes inserted
 * for every event, was 7-8 % of a draining consumer's CPU (issue 14: 9.2 against 8.5 us
 * per cancelled order, three hand drains of 100k each). PostgreSQL keeps its UNIQUE. */
#define EVENTS_COLUMNS                                                                   \
    " (seq INTEGER PRIMARY KEY AUTOINCREMENT,"                                           \
    " event_id TEXT NOT NULL,"                                                           \
    " order_id TEXT NOT NULL,"                                                           \
    " body TEXT NOT NULL,"                                                               \
    " created_at_ms INTEGER NOT NULL,"                                                   \
    " published_at_ms INTEGER,"                                                          \
    " deadline_ms INTEGER)"

/* Applied in one write transaction when user_version is behind, to a new file or to one
 * of an older version alike: every statement is IF NOT EXISTS, which also makes a race
 * between two processes creating the same file harmless. Version 2 added the two partial
 * indexes that walk pending orders by deadline (lapse pending, the sweeper) without
 * reading paid and cancelled ones. Version 3 added the two that find what
 * lapse_store_prune() deletes: settled orders by deadline, published events by time.
 * Version 4 dropped orders_status_deadline (status, deadline_ms), which only `lapse
 * status`'s count by status read, while every insert and every cancel paid a B-tree
 * insert and delete for it; and wrote the status CHECK as ORDERS_COLUMNS says
 * (MIGRATE_V4_SQL rebuilds an older file's orders table for it). Version 5 dropped
 * events' UNIQUE (event_id), as EVENTS_COLUMNS says (MIGRATE_V5_SQL rebuilds the table),
 * and the index events_published (published_at_ms), which only PRUNE_EVENTS read while
 * every published mark paid an insert into it: 2.1k of 54k instructions per order of a
 * draining consumer (issue 14). Version 6 added events.deadline_ms (MIGRATE_V6_SQL): an
 * event of an order that held nothing is stored without its body (see
 * EVENT_BODY_DERIVED). Version 7 dropped the partial index events_unpublished (seq)
 * WHERE published_at_ms IS NULL for the one-row table events_published_below: every
 * event whose seq is below its seq is published (see EVENTS_BELOW_ADVANCE). The index
 * cost each event an insert when it was written and a delete when it was marked
 * published, the mark's UPDATE more than the row's own change: 997.5 -> 882.5 million
 * instructions for a consumer draining 20k orders (issue 14). What read it (the outbox's
 * backlog walk, its count, the prune's check) reads the events from that seq on instead,
 * by rowid: what was written since the oldest unpublished event. A file of version 6
 * gets the table with the seq of its oldest unpublished event before the index goes.
 * Version 8 changed no table, only what a row says: an event below that seq is published
 * whatever its published_at_ms (NULL when a mark moved the seq past it,
 * EVENTS_BELOW_JUMP, instead of writing its row); a lapse of version 7 would take such an
 * event for unpublished when asked for it by seq, and never prune it, so it refuses the
 * file.
 */
static const char SCHEMA_SQL[] =
    "CREATE TABLE IF NOT EXISTS orders" ORDERS_COLUMNS ";"
    "CREATE INDEX IF NOT EXISTS orders_pending_deadline ON orders (deadline_ms, order_id)"
    " WHERE status = 'pending';"
    "CREATE INDEX IF NOT EXISTS orders_unscheduled_deadline"
    " ON orders (deadline_ms, order_id) WHERE status = 'pending' AND scheduled = 0;"
    "CREATE TABLE IF NOT EXISTS holds ("
    " order_id TEXT NOT NULL REFERENCES orders (order_id),"
    " resource TEXT NOT NULL,"
    " released_at_ms INTEGER,"
    " PRIMARY KEY (order_id, resource));"
    "CREATE TABLE IF NOT EXISTS events" EVENTS_COLUMNS ";"
    "CREATE TABLE IF NOT EXISTS events_published_below ("
    " id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL);"
    "INSERT OR IGNORE INTO events_published_below (id, seq) SELECT 1,"
    " coalesce((SELECT min(seq) FROM events WHERE published_at_ms IS NULL),"
    " (SELECT max(seq) FROM events) + 1, 1);"
    "DROP INDEX IF EXISTS events_unpublished;"
    "CREATE INDEX IF NOT EXISTS orders_settled_deadline ON orders (deadline_ms)"
    " WHERE status <> 'pending';"
    "PRAGMA user_version = 8;";

/* Before SCHEMA_SQL, on a file of versions 1 to 3 only: the rebuild that SQLite's
 * documentation gives for a change ALTER TABLE cannot make (lang_altertable.html, section
 * 7): a new table, the rows copied, the old one dropped (its indexes with it: SCHEMA_SQL
 * then creates them again) and the new one renamed to its name. apply_schema runs it
 * with foreign keys off, as that procedure requires (holds references orders), and has
 * PRAGMA foreign_key_check find nothing before it commits. */
static const char MIGRATE_V4_SQL[] =
    "CREATE TABLE orders_v4" ORDERS_COLUMNS ";"
    "INSERT INTO orders_v4 (order_id, status, deadline_ms, created_at_ms, paid_at_ms,"
    " cancelled_at_ms, scheduled) SELECT order_id, status, deadline_ms, created_at_ms,"
    " paid_at_ms, cancelled_at_ms, scheduled FROM orders;"
    "DROP TABLE orders;"
    "ALTER TABLE orders_v4 RENAME TO orders;";

/* Before SCHEMA_SQL, on a file of versions 1 to 4: the same rebuild for events, whose
 * UNIQUE constraint no ALTER TABLE can drop. Its seqs are copied as they are, and so is
 * AUTOINCREMENT's high-water mark: dropping a table deletes its sqlite_sequence row, and
 * a seq once handed out (to an event pruned since) must not come back. The new table's
 * row is set to the larger of the old row and the highest seq copied before the old
 * table goes; RENAME renames it with the table. The old table's indexes go with it
 * (events_published, and events_unpublished, which version 7 no longer has). */
static const char MIGRATE_V5_SQL[] =
    "CREATE TABLE events_v5" EVENTS_COLUMNS ";"
    "INSERT INTO events_v5 (seq, event_id, order_id, body, created_at_ms,"
    " published_at_ms) SELECT seq, event_id, order_id, body, created_at_ms,"
    " published_at_ms FROM events;"
    "DELETE FROM sqlite_sequence WHERE name = 'events_v5';"
    "INSERT INTO sqlite_sequence (name, seq) SELECT 'events_v5',"
    " max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0),"
    " coalesce((SELECT max(seq) FROM events), 0));"
    "DROP TABLE events;"
    "ALTER TABLE events_v5 RENAME TO events;";

/* Before SCHEMA_SQL, on a file of version 5 only (the version 5 rebuild of an older file
 * already has the column, from EVENTS_COLUMNS). A column added with no default changes no
 * row: the events written before it keep their bodies. */
static const char MIGRATE_V6_SQL[] = "ALTER TABLE events ADD COLUMN deadline_ms INTEGER;";

/* An event of an order cancelled with no holds is stored with an empty body (never a
 * JSON text) and its order's deadline in deadline_ms: its body is lapse__event_body's of
 * (order_id, deadline_ms, created_at_ms, no holds), built again when it is read
 * (collect_events), byte for byte what the cancel would have stored. The body was about
 * 135 of an event row's 210 bytes, and the row is written twice (the cancel's INSERT,
 * the published mark's UPDATE): a draining consumer wrote about three times the WAL
 * frames for the outbox that it now does (issue 14). An event with holds keeps its body,
 * and so does every event written before version 6. */
#define EVENT_BODY_DERIVED ""

/* Every statement the backend runs; prepared at open, reset after each use. Statements
 * over a set of orders (a cancel batch, a mark-scheduled batch) take it as one JSON array
 * bound to a parameter and read it with json_each: one statement per batch instead of
 * one per order (a set of event seqs that is one run, seq, seq + 1, ..., goes in as the
 * range of it instead: EVENTS_BY_RANGE, EVENTS_PUBLISHED_RANGE). The array holds each
 * id once (ids_json). A cancel batch reads its orders first (ORDERS_LOOK: the array
 * joined to orders, CROSS JOIN keeping the array the outer loop, each order found by
 * id), decides in C, and changes the due pending ones by rowid (ORDERS_CANCEL, its
 * guards checking again; the lookups are gone); the holds of the cancelled the same way
 * (HOLDS_LOOK, HOLDS_RELEASE). One UPDATE ... FROM json_each ... RETURNING did each,
 * at the price of two ephemeral tables (the join's rows, then RETURNING's): 18.9k
 * against 16.1k instructions per order inside sqlite3_step for the orders (and a
 * SELECT for the orders it did not cancel), 10.4k against 8.3k for one hold each, 0.9k
 * against 0.8k for none (issue 14, 20k orders in batches of 500, callgrind). Testing
 * IN (SELECT ... json_each) by id, before the join, built an ephemeral index of the ids
 * first (2.1k per order with no holds). ORDERS_CANCEL's unary + keeps the planner
 * from walking an index by status or deadline (every due pending order) instead. The
 * page walks name their partial index: without ANALYZE statistics the planner preferred
 * the index by status that schema version 3 had, and sorted every page in a temporary
 * B-tree. PRUNE_PICK keeps an order whose event is still unpublished by the order ids
 * of the unpublished events: an uncorrelated NOT IN, which SQLite reads once per
 * statement (the events from events_published_below's seq on, by rowid) into a
 * temporary index, since version 5 has no index by event_id to look each order's event
 * up by. Write transactions start with
 * BEGIN IMMEDIATE so the write lock is taken (and waited for) up front: a deferred
 * transaction that upgrades later fails with SQLITE_BUSY_SNAPSHOT without consulting
 * the busy handler. PRUNE_EVENTS walks the outbox by seq from its oldest row, which
 * is the order events were written in, and stops at the first event created at or after
 * the cutoff: a walk over the old rows only (those it deletes, and unpublished ones),
 * not over the whole outbox. An event published before the cutoff is necessarily
 * created before it; one written after a younger row (consumers whose clocks differ)
 * waits until the walk gets past that row, a later prune. An event published with no
 * time of its own (below events_published_below's seq, published_at_ms NULL) goes once
 * it was created before the cutoff, as every row of the walk was: its publication time
 * is unknown, and it was published at or after its creation. */
/* The outbox's unpublished events: from events_published_below's seq on (every event
 * below it is published), by rowid, those not marked. Nothing ever marks an event
 * unpublished again, and a new event's seq is above every seq written before it, so
 * the seq only grows. A mark of a run of seqs that starts at it, the usual round of a
 * consumer's own events, moves it past the run and writes no event
 * (EVENTS_BELOW_JUMP; not past the last event, so that no seq a later event gets is
 * taken for published); any other mark sets published_at_ms of its rows
 * (EVENTS_PUBLISHED, EVENTS_PUBLISHED_RANGE). Then EVENTS_BELOW_ADVANCE, in the same
 * transaction, moves it to the first unpublished event, or past the last event when
 * there is none, reading the events from where it was (what was marked since, in the
 * steady state). The jump is what a consumer's mark costs now: writing published_at_ms
 * into the rows of a round of 500 was 72.1 of 833.1 million instructions for a consumer
 * draining 20k orders (issue 14), and wrote again to the WAL the pages the cancel had
 * just written. Should the row be gone, the reads start at 0 (everything, those below
 * the lost seq with no published_at_ms included: published again, never lost) and the
 * next mark writes it again, as 1, for the mark after it to move up. */
#define PUBLISHED_BELOW "coalesce((SELECT seq FROM events_published_below), 0)"
#define UNPUBLISHED     " seq >= " PUBLISHED_BELOW " AND published_at_ms IS NULL"

#define STATEMENTS(X)                                                                    \
    X(BEGIN_READ, "BEGIN DEFERRED")                                                      \
    X(BEGIN_WRITE, "BEGIN IMMEDIATE")                                                    \
    X(COMMIT, "COMMIT")                                                                  \
    X(ROLLBACK, "ROLLBACK")                                                              \
    X(ORDER_INSERT, "INSERT INTO orders (order_id, status, deadline_ms, created_at_ms)"  \
                    " VALUES (?1, 'pending', ?2, ?3) ON CONFLICT (order_id) DO NOTHING") \
    X(HOLD_INSERT, "INSERT INTO holds (order_id, resource) VALUES (?1, ?2)"              \
                   " ON CONFLICT DO NOTHING")                                            \
    X(ORDER_READ, "SELECT status, deadline_ms, created_at_ms, paid_at_ms,"               \
                  " cancelled_at_ms, scheduled FROM orders WHERE order_id = ?1")         \
    X(HOLDS_READ, "SELECT resource FROM holds WHERE order_id = ?1 ORDER BY resource")    \
    X(ORDERS_SCHEDULE, "UPDATE orders SET scheduled = 1"                                 \
                       " WHERE order_id IN (SELECT value FROM json_each(?1))")           \
    X(ORDER_PAY, "UPDATE orders SET status = 'paid', paid_at_ms = ?1"                    \
                 " WHERE order_id = ?2 AND status = 'pending' AND deadline_ms > ?1")     \
    X(ORDERS_LOOK, "SELECT o.order_id, o.status, o.deadline_ms, o.rowid"                 \
                   " FROM json_each(?1) AS batch CROSS JOIN orders AS o"                 \
                   " ON o.order_id = batch.value")                                       \
    X(ORDERS_CANCEL, "UPDATE orders SET status = 'cancelled', cancelled_at_ms = ?1"      \
                     " WHERE rowid IN (SELECT value FROM json_each(?2))"                 \
                     " AND +status = 'pending' AND +deadline_ms <= ?1")                  \
    X(HOLDS_LOOK, "SELECT h.order_id, h.resource, h.rowid FROM json_each(?1) AS batch"   \
                  " CROSS JOIN holds AS h ON h.order_id = batch.value"                   \
                  " WHERE h.released_at_ms IS NULL")                                     \
    X(HOLDS_RELEASE, "UPDATE holds SET released_at_ms = ?1"                              \
                     " WHERE rowid IN (SELECT value FROM json_each(?2))"                 \
                     " AND released_at_ms IS NULL")                                      \
    X(EVENTS_NEXT_SEQ,                                                                   \
      "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0)," \
      " coalesce((SELECT max(seq) FROM events), 0)) + 1")                                \
    X(PENDING_PAGE, "SELECT order_id, deadline_ms, created_at_ms, scheduled"             \
                    " FROM orders INDEXED BY orders_pending_deadline"                    \
                    " WHERE status = 'pending' AND (deadline_ms, order_id) > (?1, ?2)"   \
                    " AND deadline_ms < ?3 AND created_at_ms < ?4"                       \
                    " ORDER BY deadline_ms, order_id LIMIT ?5")                          \
    X(UNSCHEDULED_PAGE, "SELECT order_id, deadline_ms, created_at_ms, scheduled"         \
                        " FROM orders INDEXED BY orders_unscheduled_deadline"            \
                        " WHERE status = 'pending' AND scheduled = 0 AND (deadline_ms, " \
                        "order_id) > (?1, ?2)"                                           \
                        " AND deadline_ms < ?3 AND created_at_ms < ?4"                   \
                        " ORDER BY deadline_ms, order_id LIMIT ?5")                      \
    X(ORDER_COUNT, "SELECT status, count(*) FROM orders GROUP BY status")                \
    X(EVENTS_PENDING, "SELECT seq, event_id, order_id, body, deadline_ms, created_at_ms" \
                      " FROM events WHERE" UNPUBLISHED " ORDER BY seq LIMIT ?1")         \
    X(EVENTS_BY_SEQ,                                                                     \
      "SELECT seq, event_id, order_id, body, deadline_ms, created_at_ms"                 \
      " FROM events"                                                                     \
      " WHERE seq IN (SELECT value FROM json_each(?1)) AND" UNPUBLISHED " ORDER BY seq") \
    X(EVENTS_PUBLISHED,                                                                  \
      "UPDATE events SET published_at_ms = ?1"                                           \
      " WHERE seq IN (SELECT value FROM json_each(?2)) AND" UNPUBLISHED)                 \
    X(EVENTS_BY_RANGE, "SELECT seq, event_id, order_id, body, deadline_ms,"              \
                       " created_at_ms FROM events WHERE seq BETWEEN"                    \
                       " max(?1, " PUBLISHED_BELOW ") AND ?2"                            \
                       " AND published_at_ms IS NULL ORDER BY seq")                      \
    X(EVENTS_PUBLISHED_RANGE,                                                            \
      "UPDATE events SET published_at_ms = ?1 WHERE seq BETWEEN"                         \
      " max(?2, " PUBLISHED_BELOW ") AND ?3 AND published_at_ms IS NULL")                \
    X(EVENTS_BELOW_JUMP, "UPDATE events_published_below SET seq = ?2 + 1"                \
                         " WHERE id = 1 AND seq = ?1"                                    \
                         " AND ?2 <= (SELECT max(seq) FROM events)")                     \
    X(EVENTS_BELOW_ADVANCE,                                                              \
      "INSERT INTO events_published_below (id, seq) VALUES (1, 1)"                       \
      " ON CONFLICT (id) DO UPDATE SET seq = max(seq, coalesce((SELECT e.seq"            \
      " FROM events AS e WHERE e.seq >= events_published_below.seq"                      \
      " AND e.published_at_ms IS NULL ORDER BY e.seq LIMIT 1),"                          \
      " (SELECT max(e.seq) FROM events AS e) + 1, seq))")                                \
    X(EVENTS_COUNT, "SELECT count(*) FROM events WHERE" UNPUBLISHED)                     \
    X(PRUNE_PICK, "INSERT INTO temp.prune_ids SELECT order_id FROM orders"               \
                  " INDEXED BY orders_settled_deadline WHERE status <> 'pending'"        \
                  " AND deadline_ms < ?1"                                                \
                  " AND coalesce(paid_at_ms, cancelled_at_ms) < ?1"                      \
                  " AND order_id NOT IN (SELECT order_id FROM events"                    \
                  " WHERE" UNPUBLISHED ") LIMIT ?2")                                     \
    X(PRUNE_HOLDS, "DELETE FROM holds WHERE order_id IN temp.prune_ids")                 \
    X(PRUNE_ORDERS, "DELETE FROM orders WHERE order_id IN temp.prune_ids")               \
    X(PRUNE_CLEAR, "DELETE FROM temp.prune_ids")                                         \
    X(PRUNE_EVENTS, "DELETE FROM events WHERE seq IN (SELECT seq FROM events"            \
                    " WHERE seq < coalesce((SELECT seq FROM events"                      \
                    " WHERE created_at_ms >= ?1 ORDER BY seq LIMIT 1),"                  \
                    " 9223372036854775807) AND (published_at_ms < ?1"                    \
                    " OR (published_at_ms IS NULL AND seq < " PUBLISHED_BELOW "))"       \
                    " ORDER BY seq LIMIT ?2)")

typedef enum stmt_id {
#define STMT_ENUM_(name, sql) ST_##name,
    STATEMENTS(STMT_ENUM_)
#undef STMT_ENUM_
        ST_COUNT_
} stmt_id_t;

static const char *const STMT_SQL[ST_COUNT_] = {
#define STMT_SQL_(name, sql) sql,
    STATEMENTS(STMT_SQL_)
#undef STMT_SQL_
};

static const char *const STMT_NAME[ST_COUNT_] = {
#define STMT_NAME_(name, sql) #name,
    STATEMENTS(STMT_NAME_)
#undef STMT_NAME_
};

#endif

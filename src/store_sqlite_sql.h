/* SPDX-License-Identifier: MIT
 * Internal: the SQLite store's schema and its statements, as data (one X-macro table
 * gives each statement an id, its SQL and a name for error messages). Included by
 * store_sqlite.c only. */
#ifndef LAPSE_STORE_SQLITE_SQL_H
#define LAPSE_STORE_SQLITE_SQL_H

#include <lapse/message.h>

#define SCHEMA_VERSION 3 /* PRAGMA user_version; SCHEMA_SQL sets it */

/* Applied in one write transaction when user_version is behind, to a new file or to one
 * of an older version alike: every statement is IF NOT EXISTS, which also makes a race
 * between two processes creating the same file harmless. Version 2 added the two partial
 * indexes that walk pending orders by deadline (lapse pending, the sweeper) without
 * reading paid and cancelled ones. Version 3 added the two that find what
 * lapse_store_prune() deletes: settled orders by deadline, published events by time. */
static const char SCHEMA_SQL[] =
    "CREATE TABLE IF NOT EXISTS orders ("
    " order_id TEXT NOT NULL PRIMARY KEY,"
    " status TEXT NOT NULL CHECK (status IN ('pending', 'paid', 'cancelled')),"
    " deadline_ms INTEGER NOT NULL,"
    " created_at_ms INTEGER NOT NULL,"
    " paid_at_ms INTEGER,"
    " cancelled_at_ms INTEGER,"
    " scheduled INTEGER NOT NULL DEFAULT 0 CHECK (scheduled IN (0, 1)));"
    "CREATE INDEX IF NOT EXISTS orders_status_deadline ON orders (status, deadline_ms);"
    "CREATE INDEX IF NOT EXISTS orders_pending_deadline ON orders (deadline_ms, order_id)"
    " WHERE status = 'pending';"
    "CREATE INDEX IF NOT EXISTS orders_unscheduled_deadline"
    " ON orders (deadline_ms, order_id) WHERE status = 'pending' AND scheduled = 0;"
    "CREATE TABLE IF NOT EXISTS holds ("
    " order_id TEXT NOT NULL REFERENCES orders (order_id),"
    " resource TEXT NOT NULL,"
    " released_at_ms INTEGER,"
    " PRIMARY KEY (order_id, resource));"
    "CREATE TABLE IF NOT EXISTS events ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " event_id TEXT NOT NULL UNIQUE,"
    " order_id TEXT NOT NULL,"
    " body TEXT NOT NULL,"
    " created_at_ms INTEGER NOT NULL,"
    " published_at_ms INTEGER);"
    "CREATE INDEX IF NOT EXISTS events_unpublished ON events (seq)"
    " WHERE published_at_ms IS NULL;"
    "CREATE INDEX IF NOT EXISTS orders_settled_deadline ON orders (deadline_ms)"
    " WHERE status <> 'pending';"
    "CREATE INDEX IF NOT EXISTS events_published ON events (published_at_ms)"
    " WHERE published_at_ms IS NOT NULL;"
    "PRAGMA user_version = 3;";

/* Every statement the backend runs; prepared at open, reset after each use. Statements
 * over a set of orders (a cancel batch, a mark-scheduled batch) take it as one JSON array
 * bound to a parameter and read it with json_each: one statement per batch instead of
 * one per order. ORDERS_CANCEL looks its orders up by id: the unary + keeps the planner
 * from walking orders_status_deadline, every due pending order, instead. The page
 * walks name their partial index: without ANALYZE statistics the planner prefers
 * orders_status_deadline and sorts every page in a temporary B-tree. Write
 * transactions start with BEGIN IMMEDIATE so the write lock is taken (and waited for)
 * up front: a deferred transaction that upgrades later fails with SQLITE_BUSY_SNAPSHOT
 * without consulting the busy handler. */
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
    X(ORDERS_CANCEL, "UPDATE orders SET status = 'cancelled', cancelled_at_ms = ?1"      \
                     " WHERE order_id IN (SELECT value FROM json_each(?2))"              \
                     " AND +status = 'pending' AND +deadline_ms <= ?1"                   \
                     " RETURNING order_id, deadline_ms")                                 \
    X(ORDERS_READ, "SELECT order_id, status, deadline_ms FROM orders"                    \
                   " WHERE order_id IN (SELECT value FROM json_each(?1))")               \
    X(HOLDS_RELEASE, "UPDATE holds SET released_at_ms = ?1"                              \
                     " WHERE order_id IN (SELECT value FROM json_each(?2))"              \
                     " AND released_at_ms IS NULL")                                      \
    X(HOLDS_READ_SET, "SELECT order_id, resource FROM holds"                             \
                      " WHERE order_id IN (SELECT value FROM json_each(?1))"             \
                      " ORDER BY order_id, resource")                                    \
    X(EVENTS_INSERT, "INSERT INTO events (event_id, order_id, body, created_at_ms)"      \
                     " SELECT '" LAPSE_EVENT_CANCELLED ":' || key, key, value, ?2"       \
                     " FROM json_each(?1)"                                               \
                     " RETURNING seq, order_id")                                         \
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
    X(EVENTS_PENDING, "SELECT seq, event_id, order_id, body FROM events"                 \
                      " WHERE published_at_ms IS NULL ORDER BY seq LIMIT ?1")            \
    X(EVENTS_BY_SEQ, "SELECT seq, event_id, order_id, body FROM events"                  \
                     " WHERE seq IN (SELECT value FROM json_each(?1))"                   \
                     " AND published_at_ms IS NULL ORDER BY seq")                        \
    X(EVENTS_PUBLISHED, "UPDATE events SET published_at_ms = ?1"                         \
                        " WHERE seq IN (SELECT value FROM json_each(?2))"                \
                        " AND published_at_ms IS NULL")                                  \
    X(EVENTS_COUNT, "SELECT count(*) FROM events WHERE published_at_ms IS NULL")         \
    X(PRUNE_PICK, "INSERT INTO temp.prune_ids SELECT order_id FROM orders"               \
                  " INDEXED BY orders_settled_deadline WHERE status <> 'pending'"        \
                  " AND deadline_ms < ?1"                                                \
                  " AND coalesce(paid_at_ms, cancelled_at_ms) < ?1"                      \
                  " AND NOT EXISTS (SELECT 1 FROM events e WHERE e.event_id ="           \
                  " 'order.cancelled:' || orders.order_id"                               \
                  " AND e.published_at_ms IS NULL) LIMIT ?2")                            \
    X(PRUNE_HOLDS, "DELETE FROM holds WHERE order_id IN temp.prune_ids")                 \
    X(PRUNE_ORDERS, "DELETE FROM orders WHERE order_id IN temp.prune_ids")               \
    X(PRUNE_CLEAR, "DELETE FROM temp.prune_ids")                                         \
    X(PRUNE_EVENTS, "DELETE FROM events WHERE seq IN (SELECT seq FROM events"            \
                    " INDEXED BY events_published WHERE published_at_ms < ?1"            \
                    " LIMIT ?2)")

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

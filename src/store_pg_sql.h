/* SPDX-License-Identifier: MIT
 * Internal: the PostgreSQL store's schema and its statements, as data. "@." stands for
 * the quoted schema name and a dot; store_pg.c expands it once per handle. NOW_MS is the
 * server's clock at the start of the transaction (now()), in ms since the epoch: the one
 * clock the laws depend on (DESIGN.md, "One clock decides"). Included by store_pg.c
 * only.
 *
 * Every statement goes through PQexecParams (the unnamed statement), never a named
 * prepared statement, and no session state is relied on (names are schema-qualified,
 * timeouts are SET LOCAL per transaction, the migration lock is transaction-level), so
 * the backend works through PgBouncer in transaction pooling mode. */
#ifndef LAPSE_STORE_PG_SQL_H
#define LAPSE_STORE_PG_SQL_H

#include <lapse/message.h> /* LAPSE_EVENT_CANCELLED */

/* An event's id is its type, a colon and the order id (EVENTS_INSERT builds it). */
#define EVENT_ID_PREFIX LAPSE_EVENT_CANCELLED ":"

#define PG_SCHEMA_VERSION 3
#define PG_TEXT_(x)       #x
#define PG_TEXT(x)        PG_TEXT_(x) /* PG_TEXT(PG_SCHEMA_VERSION) is "3" */

#define NOW_MS "(floor(extract(epoch FROM now()) * 1000))::bigint"

/* The tables mirror the SQLite backend's (same names, times as bigint ms), so that the
 * two can be inspected with the same queries. order_id is COLLATE "C": keyset paging
 * then orders ids byte-wise, like SQLite, and the indexes serve the row comparisons. */
static const char PG_SCHEMA_V1[] =
    "CREATE TABLE IF NOT EXISTS @.orders ("
    " order_id text COLLATE \"C\" NOT NULL PRIMARY KEY,"
    " status text NOT NULL CHECK (status IN ('pending', 'paid', 'cancelled')),"
    " deadline_ms bigint NOT NULL,"
    " created_at_ms bigint NOT NULL,"
    " paid_at_ms bigint,"
    " cancelled_at_ms bigint,"
    " scheduled smallint NOT NULL DEFAULT 0 CHECK (scheduled IN (0, 1)),"
    " claimed_until_ms bigint);"
    "CREATE INDEX IF NOT EXISTS orders_pending_deadline ON @.orders (deadline_ms, "
    "order_id)"
    " WHERE status = 'pending';"
    "CREATE INDEX IF NOT EXISTS orders_unscheduled_deadline"
    " ON @.orders (deadline_ms, order_id) WHERE status = 'pending' AND scheduled = 0;"
    "CREATE TABLE IF NOT EXISTS @.holds ("
    " order_id text COLLATE \"C\" NOT NULL REFERENCES @.orders (order_id)"
    " ON DELETE CASCADE,"
    " resource text NOT NULL,"
    " released_at_ms bigint,"
    " PRIMARY KEY (order_id, resource));"
    "CREATE TABLE IF NOT EXISTS @.events ("
    " seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " event_id text NOT NULL UNIQUE,"
    " order_id text COLLATE \"C\" NOT NULL,"
    " body text NOT NULL,"
    " created_at_ms bigint NOT NULL,"
    " published_at_ms bigint,"
    " claimed_until_ms bigint);"
    "CREATE INDEX IF NOT EXISTS events_unpublished ON @.events (seq)"
    " WHERE published_at_ms IS NULL;"
    "CREATE INDEX IF NOT EXISTS orders_settled_deadline ON @.orders (deadline_ms)"
    " WHERE status <> 'pending';"
    "CREATE INDEX IF NOT EXISTS events_published ON @.events (published_at_ms)"
    " WHERE published_at_ms IS NOT NULL;";

/* Version 2: lapse's own bookkeeping for the shop's orders (--orders-map): which orders
 * it was asked to schedule, with the deadline it published, and whether the broker
 * confirmed the message. The shop's table is never altered. */
static const char PG_SCHEMA_V2[] =
    "CREATE TABLE IF NOT EXISTS @.scheduled ("
    " order_id text COLLATE \"C\" NOT NULL PRIMARY KEY,"
    " deadline_ms bigint NOT NULL,"
    " created_at_ms bigint NOT NULL,"
    " scheduled smallint NOT NULL DEFAULT 0 CHECK (scheduled IN (0, 1)));"
    "CREATE INDEX IF NOT EXISTS scheduled_deadline ON @.scheduled (deadline_ms);";

/* Version 3 (issue 14): the outbox loses two indexes that a draining consumer paid for
 * on every event and that nothing needs, as SQLite's version 5 did: UNIQUE (event_id)
 * (the cancel's compare-and-set already writes one event per order) and events_published
 * (only pruning read it; PRUNE_EVENTS walks by seq now). The published mark changes
 * published_at_ms, which events_unpublished's predicate reads, so it is never a HOT
 * update: each mark inserted the new row version into every index of the table, three
 * then, one now. */
static const char PG_SCHEMA_V3[] =
    "ALTER TABLE @.events DROP CONSTRAINT IF EXISTS events_event_id_key;"
    "DROP INDEX IF EXISTS @.events_published;";

/* Each transaction that writes starts with this (one round trip): short waits for locks,
 * a bound on every statement, and a session that dies rather than sit on its locks. */
#define PG_BEGIN                                                                         \
    "BEGIN; SET LOCAL lock_timeout = '2s'; SET LOCAL statement_timeout = '30s';"         \
    " SET LOCAL idle_in_transaction_session_timeout = '60s'"

/* The holds of order o as a JSON array text, sorted, or NULL when there are none. */
#define HOLDS_JSON                                                                       \
    "(SELECT json_agg(h.resource ORDER BY h.resource COLLATE \"C\")::text FROM @.holds " \
    "h"                                                                                  \
    " WHERE h.order_id = o.order_id)"

/* ORDERS_CANCEL's guards (the rows are locked and checked by CANCEL_LOCK first) are
 * written so that no index can serve them, as SQLite's statement does with its unary +:
 * "status = 'pending' AND deadline_ms <= $2" is exactly orders_pending_deadline, and when
 * the statistics say few pending orders are due (always true of a table analyzed in
 * steady state), the planner walked that index over every due pending order and
 * hash-joined the batch to it, once per batch: a backlog of 100k due orders cost 20-35 ms
 * per batch instead of 3 (auto_explain in a bench drain), quadratic in the backlog. Now
 * the batch is found by the primary key, or, on a table of less than about a hundred
 * rows per id of the batch, by one scan of the table: bounded by its size either way. */
#define PG_STATEMENTS(X)                                                                 \
    X(NOW, "SELECT (floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint")       \
    X(ORDERS_INSERT,                                                                     \
      "INSERT INTO @.orders (order_id, status, deadline_ms, created_at_ms)"              \
      " SELECT i, 'pending', d, c FROM unnest($1::text[], $2::bigint[],"                 \
      " $3::bigint[]) AS t (i, d, c) ON CONFLICT (order_id) DO NOTHING"                  \
      " RETURNING order_id")                                                             \
    X(ORDERS_READ, "SELECT order_id, status, deadline_ms FROM @.orders"                  \
                   " WHERE order_id = ANY ($1::text[])")                                 \
    X(HOLDS_INSERT, "INSERT INTO @.holds (order_id, resource)"                           \
                    " SELECT * FROM unnest($1::text[], $2::text[])"                      \
                    " ON CONFLICT DO NOTHING")                                           \
    X(ORDERS_SCHEDULE, "UPDATE @.orders SET scheduled = 1"                               \
                       " WHERE order_id = ANY ($1::text[]) AND scheduled = 0")           \
    X(ORDER_PAY, "UPDATE @.orders SET status = 'paid', paid_at_ms = " NOW_MS             \
                 " WHERE order_id = $1 AND status = 'pending' AND deadline_ms > " NOW_MS \
                 " RETURNING order_id")                                                  \
    X(ORDER_GET, "SELECT o.status, o.deadline_ms, o.created_at_ms, o.paid_at_ms,"        \
                 " o.cancelled_at_ms, o.scheduled, " HOLDS_JSON                          \
                 " FROM @.orders o WHERE o.order_id = $1")                               \
    X(CANCEL_LOCK, "WITH l AS (SELECT order_id, status, deadline_ms FROM @.orders"       \
                   " WHERE order_id = ANY ($1::text[]) ORDER BY order_id"                \
                   " FOR NO KEY UPDATE SKIP LOCKED)"                                     \
                   " SELECT " NOW_MS ", l.order_id, l.status, l.deadline_ms"             \
                   " FROM (SELECT 1) AS one LEFT JOIN l ON true")                        \
    X(ORDERS_EXIST, "SELECT order_id FROM @.orders WHERE order_id = ANY ($1::text[])")   \
    X(ORDERS_CANCEL, "UPDATE @.orders o SET status = 'cancelled', cancelled_at_ms = $2"  \
                     " FROM unnest($1::text[]) AS t (id) WHERE o.order_id = t.id"        \
                     " AND o.status || '' = 'pending' AND o.deadline_ms + 0 <= $2")      \
    X(HOLDS_RELEASE, "WITH r AS (UPDATE @.holds SET released_at_ms = $2"                 \
                     " WHERE order_id = ANY ($1::text[]) AND released_at_ms IS NULL"     \
                     " RETURNING order_id, resource) SELECT order_id, resource FROM r"   \
                     " ORDER BY order_id, resource COLLATE \"C\"")                       \
    X(EVENTS_INSERT,                                                                     \
      "INSERT INTO @.events (event_id, order_id, body, created_at_ms,"                   \
      " claimed_until_ms) SELECT '" EVENT_ID_PREFIX "' || o, o, b, $3, $4"               \
      " FROM unnest($1::text[], $2::text[]) AS t (o, b)"                                 \
      " RETURNING seq, order_id")                                                        \
    X(ORDER_COUNT, "SELECT status, count(*) FROM @.orders GROUP BY status")              \
    X(EVENTS_CLAIM, "WITH c AS (SELECT seq FROM @.events WHERE published_at_ms IS NULL"  \
                    " AND (claimed_until_ms IS NULL OR claimed_until_ms <= " NOW_MS ")"  \
                    " ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED)"                     \
                    " UPDATE @.events e SET claimed_until_ms = " NOW_MS " + $2 FROM c"   \
                    " WHERE e.seq = c.seq RETURNING e.seq, e.event_id, e.order_id,"      \
                    " e.body")                                                           \
    X(EVENTS_BY_SEQ, "SELECT seq, event_id, order_id, body FROM @.events"                \
                     " WHERE seq = ANY ($1::bigint[]) AND published_at_ms IS NULL"       \
                     " ORDER BY seq LIMIT $2")                                           \
    X(EVENTS_PUBLISHED, "UPDATE @.events SET published_at_ms = " NOW_MS ","              \
                        " claimed_until_ms = NULL"                                       \
                        " WHERE seq = ANY ($1::bigint[]) AND published_at_ms IS NULL")   \
    X(EVENTS_RELEASE, "UPDATE @.events SET claimed_until_ms = NULL"                      \
                      " WHERE seq = ANY ($1::bigint[]) AND published_at_ms IS NULL")     \
    X(EVENTS_COUNT, "SELECT count(*) FROM @.events WHERE published_at_ms IS NULL")       \
    X(PRUNE_ORDERS,                                                                      \
      "DELETE FROM @.orders WHERE order_id IN (SELECT o.order_id"                        \
      " FROM @.orders o WHERE o.status <> 'pending' AND o.deadline_ms < $1"              \
      " AND coalesce(o.paid_at_ms, o.cancelled_at_ms) < $1"                              \
      " AND NOT EXISTS (SELECT 1 FROM @.events e WHERE e.order_id = o.order_id"          \
      " AND e.published_at_ms IS NULL)"                                                  \
      " LIMIT $2"                                                                        \
      " FOR UPDATE SKIP LOCKED)")                                                        \
    X(PRUNE_EVENTS, "DELETE FROM @.events WHERE seq IN (SELECT seq FROM @.events"        \
                    " WHERE seq < coalesce((SELECT seq FROM @.events"                    \
                    " WHERE created_at_ms >= $1 ORDER BY seq LIMIT 1),"                  \
                    " 9223372036854775807) AND published_at_ms < $1"                     \
                    " ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED)")                    \
    X(PENDING_PAGE, "SELECT o.order_id, o.deadline_ms, o.created_at_ms, o.scheduled,"    \
                    " CASE WHEN $6 THEN " HOLDS_JSON " END FROM @.orders o"              \
                    " WHERE o.status = 'pending' AND (o.deadline_ms, o.order_id) >"      \
                    " ($1, $2) AND o.deadline_ms < $3 AND o.created_at_ms < $4"          \
                    " ORDER BY o.deadline_ms, o.order_id LIMIT $5")                      \
    X(UNSCHEDULED_PAGE,                                                                  \
      "SELECT o.order_id, o.deadline_ms, o.created_at_ms,"                               \
      " o.scheduled, CASE WHEN $6 THEN " HOLDS_JSON " END"                               \
      " FROM @.orders o WHERE o.status = 'pending'"                                      \
      " AND o.scheduled = 0 AND (o.deadline_ms, o.order_id) > ($1, $2)"                  \
      " AND o.deadline_ms < $3 AND o.created_at_ms < $4"                                 \
      " ORDER BY o.deadline_ms, o.order_id LIMIT $5")                                    \
    X(UNSCHEDULED_CLAIM, "WITH c AS (SELECT order_id FROM @.orders"                      \
                         " WHERE status = 'pending' AND scheduled = 0"                   \
                         " AND (deadline_ms, order_id) > ($1, $2) AND deadline_ms < $3"  \
                         " AND created_at_ms < $4 AND (claimed_until_ms IS NULL"         \
                         " OR claimed_until_ms <= " NOW_MS ")"                           \
                         " ORDER BY deadline_ms, order_id LIMIT $5"                      \
                         " FOR NO KEY UPDATE SKIP LOCKED)"                               \
                         " UPDATE @.orders o SET claimed_until_ms = " NOW_MS " + $7"     \
                         " FROM c WHERE o.order_id = c.order_id RETURNING o.order_id,"   \
                         " o.deadline_ms, o.created_at_ms, o.scheduled,"                 \
                         " CASE WHEN $6 THEN " HOLDS_JSON " END")

typedef enum pg_stmt_id {
#define PG_STMT_ENUM_(name, sql) PS_##name,
    PG_STATEMENTS(PG_STMT_ENUM_)
#undef PG_STMT_ENUM_
        PS_COUNT_
} pg_stmt_id_t;

static const char *const PG_STMT_SQL[PS_COUNT_] = {
#define PG_STMT_SQL_(name, sql) sql,
    PG_STATEMENTS(PG_STMT_SQL_)
#undef PG_STMT_SQL_
};

static const char *const PG_STMT_NAME[PS_COUNT_] = {
#define PG_STMT_NAME_(name, sql) #name,
    PG_STATEMENTS(PG_STMT_NAME_)
#undef PG_STMT_NAME_
};

/*
 * The same statements on the shop's own table (an orders map), for the ids that touch
 * orders; NULL: the statement above serves both. Same parameters, same result columns,
 * so the C code is shared. store_pg_map.c fills the placeholders: {T} the quoted table
 * (aliased o), {ID} {ST} {DLC} the quoted id, status and deadline (or window start)
 * columns as o.<col>, {STN} the bare status column, {STT} its type, {IDT} the id's type,
 * {SET_CA} ", <cancelled_at> = now()" or nothing, {CA_MS} that column in ms or NULL, and
 * the derived {DL} {DLMS} {CLASS} and {ID_IS_S} (the shop's row of bookkeeping row s, by
 * an index on the shop's id); the values {PENDING} (text[]), {PAID}, {CANCELLED},
 * {WIN} (the window in ms, 0 for a deadline column) and {CURSOR} (an exact timestamptz
 * or NULL) become bound parameters numbered after the statement's own.
 */
#define MAP_PENDING_PAGE_(extra)                                                         \
    "SELECT {ID}::text, {DLMS}, coalesce(s.created_at_ms, 0), coalesce(s.scheduled, 0)," \
    " CASE WHEN $6 THEN NULL::text END, {DLC}::text"                                     \
    " FROM {T} LEFT JOIN @.scheduled s ON s.order_id = {ID}::text"                       \
    " WHERE {ST}::text = ANY ({PENDING}) AND ({DLC}, {ID}::text COLLATE \"C\") >"        \
    " (coalesce({CURSOR}, CASE WHEN $1 < -100000000000000 THEN '-infinity'::timestamptz" \
    " ELSE to_timestamp(($1 - 1) / 1000.0) END - {WIN} * interval '1 millisecond'), $2)" \
    " AND {DLC} < CASE WHEN $3 > 100000000000000 THEN 'infinity'::timestamptz"           \
    " ELSE to_timestamp($3 / 1000.0) END - {WIN} * interval '1 millisecond'"             \
    " AND coalesce(s.created_at_ms, 0) < $4" extra                                       \
    " ORDER BY {DLC}, {ID}::text COLLATE \"C\" LIMIT $5"

static const char *const PG_MAP_SQL[PS_COUNT_] = {
    /* The batch found by the shop's id, not by an index on its status column (see
     * PS_ORDERS_CANCEL): 24 ms against 0.7 ms for 400 orders with 52k pending. */
    [PS_ORDERS_INSERT] =
        "INSERT INTO @.scheduled (order_id, deadline_ms, created_at_ms)"
        " SELECT t.i, t.d, t.c FROM unnest($1::text[], $2::bigint[], $3::bigint[])"
        " AS t (i, d, c) WHERE EXISTS (SELECT 1 FROM {T} WHERE {ID} = t.i::{IDT}"
        " AND {ST}::text || '' = ANY ({PENDING}) AND {DLMS} = t.d)"
        " ON CONFLICT (order_id) DO NOTHING RETURNING order_id",
    [PS_ORDERS_READ] = "SELECT {ID}::text, {CLASS}, {DLMS} FROM {T}"
                       " WHERE {ID} = ANY ($1::{IDT}[])",
    [PS_ORDERS_SCHEDULE] = "UPDATE @.scheduled SET scheduled = 1"
                           " WHERE order_id = ANY ($1::text[]) AND scheduled = 0",
    [PS_ORDER_PAY] = "UPDATE {T} SET {STN} = {PAID}::text::{STT}"
                     " WHERE {ID} = $1::{IDT} AND {ST}::text = ANY ({PENDING})"
                     " AND {DL} > now() RETURNING 1",
    [PS_ORDER_GET] = "SELECT {CLASS}, {DLMS}, coalesce(s.created_at_ms, {DLMS}),"
                     " NULL::bigint, {CA_MS}, coalesce(s.scheduled, 0), NULL::text"
                     " FROM {T} LEFT JOIN @.scheduled s ON s.order_id = {ID}::text"
                     " WHERE {ID} = $1::{IDT}",
    [PS_CANCEL_LOCK] = "WITH l AS (SELECT {ID}::text AS order_id, {CLASS} AS status,"
                       " {DLMS} AS deadline_ms FROM {T} WHERE {ID} = ANY ($1::{IDT}[])"
                       " ORDER BY {ID} FOR NO KEY UPDATE OF o SKIP LOCKED)"
                       " SELECT " NOW_MS ", l.order_id, l.status, l.deadline_ms"
                       " FROM (SELECT 1) AS one LEFT JOIN l ON true",
    [PS_ORDERS_EXIST] = "SELECT {ID}::text FROM {T} WHERE {ID} = ANY ($1::{IDT}[])",
    /* The guard off the shop's indexes, as ORDERS_CANCEL's and ORDERS_INSERT's: an index
     * on the status column would otherwise be walked over every pending order once per
     * batch. */
    [PS_ORDERS_CANCEL] =
        "UPDATE {T} SET {STN} = {CANCELLED}::text::{STT}{SET_CA}"
        " WHERE {ID} = ANY ($1::{IDT}[]) AND {ST}::text || '' = ANY ({PENDING})"
        " AND {DLMS} <= $2",
    /* The shop's on_cancel statements release what an order held (store_pg_map.c). */
    [PS_HOLDS_RELEASE] = "SELECT NULL::text, NULL::text"
                         " WHERE $1::text[] IS NULL AND $2::bigint IS NULL",
    [PS_ORDER_COUNT] = "SELECT {CLASS}, count(*) FROM {T} GROUP BY 1",
    /* The shop's rows looked up by id ({ID_IS_S}), the status guard off the shop's
     * indexes as ORDERS_CANCEL's: `{ID}::text = s.order_id`, which no index on an
     * integer id serves, read every pending order of the shop (or the whole table) per
     * round, and so did an index on status where statistics said few are pending. */
    [PS_PRUNE_ORDERS] = "DELETE FROM @.scheduled WHERE order_id IN (SELECT s.order_id"
                        " FROM @.scheduled s WHERE s.deadline_ms < $1 AND NOT EXISTS"
                        " (SELECT 1 FROM {T} WHERE {ID_IS_S}"
                        " AND {ST}::text || '' = ANY ({PENDING})) LIMIT $2"
                        " FOR UPDATE OF s SKIP LOCKED)",
    [PS_PENDING_PAGE] = MAP_PENDING_PAGE_(""),
    [PS_UNSCHEDULED_PAGE] = MAP_PENDING_PAGE_(" AND coalesce(s.scheduled, 0) = 0"),
    /* No claims on the shop's rows: a second re-publish of an order is a no-op. */
    [PS_UNSCHEDULED_CLAIM] =
        MAP_PENDING_PAGE_(" AND coalesce(s.scheduled, 0) = 0 AND $7::bigint IS NOT NULL"),
};

#endif

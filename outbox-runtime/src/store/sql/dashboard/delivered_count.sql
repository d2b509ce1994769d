-- Dashboard overview: the delivered events still kept, counted exactly up to a cap, and the
-- planner's row count of the event table for when the cap is reached.
--
-- Parameters: $1 cap bigint, $2 the table's name text (for pg_class).
-- Returns one row: (delivered_capped bigint, table_rows_estimate float8). delivered_capped below
-- the cap is exact; at the cap the dashboard shows an estimate (table_rows_estimate, the
-- planner's reltuples of the event table, minus the open and exhausted events it counts
-- exactly: each of them is one event row with a queue row), labelled as such. reltuples is -1
-- until the table is first vacuumed or analysed.
-- Delivered is an event without a queue row. The event table's primary key is walked from the
-- oldest id, each event probed in the queue's primary key, and the walk stops at the cap, so
-- the cost is bounded by the cap (plus the undelivered events passed on the way, the oldest of
-- which are few: open events are the recent ones), never by the retained history. Oldest first
-- because the newest events are the ones still open. ORDER BY keeps the planner on the index:
-- without it, a limited hash anti-join over a sequential scan would read the event table in
-- its physical order, which is the same here but does not say so in the plan.
-- Indexes: <table>_pkey, <table>_queue_pkey.
SELECT (SELECT count(*)
        FROM (SELECT 1
              FROM /* TEMPLATE: table */outbox AS e
              WHERE NOT EXISTS (SELECT 1 FROM /* TEMPLATE: table */outbox_queue AS q WHERE q.id = e.id)
              ORDER BY e.id
              LIMIT $1) AS capped) AS delivered_capped,
       (SELECT c.reltuples::float8 FROM pg_class AS c WHERE c.oid = to_regclass($2)) AS table_rows_estimate

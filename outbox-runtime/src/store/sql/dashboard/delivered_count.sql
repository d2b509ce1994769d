-- Dashboard overview: the delivered rows still kept, counted exactly up to a cap, and the
-- planner's row count of the table for when the cap is reached.
--
-- Parameters: $1 cap bigint, $2 the table's name text (for pg_class).
-- Returns one row: (delivered_capped bigint, table_rows_estimate float8). delivered_capped below
-- the cap is exact; at the cap the dashboard shows an estimate (table_rows_estimate, the
-- planner's reltuples, minus the open and exhausted rows it counts exactly), labelled as such.
-- reltuples is -1 until the table is first vacuumed or analysed.
-- Index: <table>_purge_idx walked newest first and stopped at the cap, so the cost is bounded by
-- the cap, never by the retained history (ORDER BY keeps the planner on the index: a top-N
-- over a sequential scan would have to read every delivered row).
SELECT (SELECT count(*)
        FROM (SELECT 1
              FROM /* TEMPLATE: table */outbox
              WHERE delivered_at IS NOT NULL
              ORDER BY delivered_at DESC
              LIMIT $1) AS capped) AS delivered_capped,
       (SELECT c.reltuples::float8 FROM pg_class AS c WHERE c.oid = to_regclass($2)) AS table_rows_estimate

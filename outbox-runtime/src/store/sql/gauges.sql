-- Gauges: what the maintenance leader publishes every interval: open rows per status, exhausted
-- rows and the age of the oldest ready pending event (database clock).
--
-- No parameters. Returns one row: (pending, processing, exhausted, oldest_pending_age_seconds
-- float8), with the meaning of stats.sql. Unlike stats.sql it does not count delivered rows:
-- those are most of the table (the whole retention period), and counting them every few seconds
-- would scan it.
-- Indexes: <table>_open_idx (counts and age), <table>_exhausted_idx.
WITH open AS (
    SELECT count(*) FILTER (WHERE status = 'pending')    AS pending,
           count(*) FILTER (WHERE status = 'processing') AS processing
    FROM /* TEMPLATE: table */outbox
    WHERE delivered_at IS NULL AND exhausted_at IS NULL
)
SELECT open.pending,
       open.processing,
       (SELECT count(*) FROM /* TEMPLATE: table */outbox WHERE exhausted_at IS NOT NULL) AS exhausted,
       (SELECT greatest(extract(epoch FROM now() - available_at), 0)::float8
        FROM /* TEMPLATE: table */outbox
        WHERE delivered_at IS NULL AND exhausted_at IS NULL AND status = 'pending'
        ORDER BY available_at
        LIMIT 1) AS oldest_pending_age_seconds
FROM open

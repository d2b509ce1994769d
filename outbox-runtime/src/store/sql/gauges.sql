-- Gauges: what the maintenance leader publishes every interval: open rows per status, exhausted
-- rows and the age of the oldest ready pending event (database clock).
--
-- No parameters. Returns one row: (pending, processing, exhausted, oldest_pending_age_seconds
-- float8). The age is now() - the smallest available_at of the pending rows: how long the oldest
-- pending event has been ready to claim (0 when every pending event is scheduled for later, null
-- when nothing is pending). An event waiting for a retry's backoff counts from when its retry
-- became due. Delivered events are not counted here (count_delivered.sql, for operators): they
-- are most of the event table, and counting them every few seconds would read the retained
-- history. Everything here reads the queue table alone, which holds the undelivered events only.
-- Indexes: <table>_queue_open_idx (pending and processing, told apart by status; the age walks
-- it in order to the first pending row), <table>_queue_exhausted_idx.
WITH open AS (
    SELECT count(*) FILTER (WHERE status = 'pending')    AS pending,
           count(*) FILTER (WHERE status = 'processing') AS processing
    FROM /* TEMPLATE: table */outbox_queue
    WHERE exhausted_at IS NULL
)
SELECT open.pending,
       open.processing,
       (SELECT count(*) FROM /* TEMPLATE: table */outbox_queue WHERE exhausted_at IS NOT NULL) AS exhausted,
       (SELECT greatest(extract(epoch FROM now() - available_at), 0)::float8
        FROM /* TEMPLATE: table */outbox_queue
        WHERE exhausted_at IS NULL AND status = 'pending'
        ORDER BY available_at
        LIMIT 1) AS oldest_pending_age_seconds
FROM open

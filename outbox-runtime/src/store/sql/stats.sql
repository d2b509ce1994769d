-- Stats: rows per status and the age of the oldest pending event (by the database clock).
--
-- No parameters. Returns one row: (pending, processing, delivered, exhausted,
-- oldest_pending_age_seconds float8, null when nothing is pending). The age counts from
-- created_at, so it includes time spent waiting for retries.
-- Reads the whole table once (purge keeps delivered history bounded); not a hot statement.
SELECT count(*) FILTER (WHERE status = 'pending')    AS pending,
       count(*) FILTER (WHERE status = 'processing') AS processing,
       count(*) FILTER (WHERE status = 'delivered')  AS delivered,
       count(*) FILTER (WHERE status = 'exhausted')  AS exhausted,
       extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'pending'))::float8
           AS oldest_pending_age_seconds
FROM /* TEMPLATE: table */outbox

-- Stats: rows per status and the age of the oldest ready pending event (database clock).
--
-- No parameters. Returns one row: (pending, processing, delivered, exhausted,
-- oldest_pending_age_seconds float8). The age is now() - the smallest available_at of the
-- pending rows: how long the oldest pending event has been ready to claim (0 when every pending
-- event is scheduled for later, null when nothing is pending). An event waiting for a retry's
-- backoff counts from when its retry became due.
--
-- Each count reads its own partial index, so delivered history does not cost a table scan:
-- <table>_pending_idx, <table>_lease_idx, <table>_purge_idx, <table>_exhausted_idx. The age is
-- the first entry of <table>_pending_idx.
SELECT (SELECT count(*) FROM /* TEMPLATE: table */outbox WHERE status = 'pending')    AS pending,
       (SELECT count(*) FROM /* TEMPLATE: table */outbox WHERE status = 'processing') AS processing,
       (SELECT count(*) FROM /* TEMPLATE: table */outbox WHERE status = 'delivered')  AS delivered,
       (SELECT count(*) FROM /* TEMPLATE: table */outbox WHERE status = 'exhausted')  AS exhausted,
       (SELECT greatest(extract(epoch FROM now() - available_at), 0)::float8
        FROM /* TEMPLATE: table */outbox
        WHERE status = 'pending'
        ORDER BY available_at
        LIMIT 1) AS oldest_pending_age_seconds

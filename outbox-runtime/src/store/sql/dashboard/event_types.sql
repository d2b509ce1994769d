-- Dashboard, per event type and version: rows by status, failed attempts, and the last failure.
--
-- No parameters. Returns one row per (event_type, event_version) that has open or exhausted rows
-- or was delivered in the last hour: (event_type, event_version, pending, processing,
-- delivered_last_hour, exhausted, failures bigint, last_error text, last_failure_at timestamptz).
-- failures counts the failed attempts the rows record (lease expiries plus handler failures);
-- the failure rate the dashboard shows is failures / (failures + delivered_last_hour).
-- Delivered rows older than an hour are not read: they are most of the table.
-- Indexes: <table>_open_idx (open rows), <table>_exhausted_idx, <table>_purge_idx (the last
-- hour's deliveries); one branch each, so no branch reads the retained history.
WITH scope AS (
    SELECT event_type, event_version, status, lease_expiries, handler_failures, last_error, updated_at
    FROM /* TEMPLATE: table */outbox
    WHERE delivered_at IS NULL AND exhausted_at IS NULL
    UNION ALL
    SELECT event_type, event_version, status, lease_expiries, handler_failures, last_error, updated_at
    FROM /* TEMPLATE: table */outbox
    WHERE exhausted_at IS NOT NULL
    UNION ALL
    SELECT event_type, event_version, status, lease_expiries, handler_failures, last_error, updated_at
    FROM /* TEMPLATE: table */outbox
    WHERE delivered_at IS NOT NULL AND delivered_at >= now() - interval '1 hour'
)
SELECT event_type,
       event_version,
       count(*) FILTER (WHERE status = 'pending')    AS pending,
       count(*) FILTER (WHERE status = 'processing') AS processing,
       count(*) FILTER (WHERE status = 'delivered')  AS delivered_last_hour,
       count(*) FILTER (WHERE status = 'exhausted')  AS exhausted,
       coalesce(sum(lease_expiries + handler_failures), 0)::bigint AS failures,
       (array_agg(last_error ORDER BY updated_at DESC) FILTER (WHERE last_error IS NOT NULL))[1] AS last_error,
       max(updated_at) FILTER (WHERE last_error IS NOT NULL) AS last_failure_at
FROM scope
GROUP BY event_type, event_version
ORDER BY event_type, event_version

-- Dashboard, per event type and version: events not delivered by status, the failed attempts
-- they record and their last failure, and the last hour's enqueues with how many of them are
-- delivered by now.
--
-- No parameters. Returns one row per (event_type, event_version) that has open or exhausted
-- events or was enqueued in the last hour: (event_type, event_version, pending, processing,
-- exhausted, failures, enqueued_last_hour, delivered_of_last_hour bigint, last_error text,
-- last_failure_at timestamptz).
-- failures counts the failed attempts the queue rows record (lease expiries plus handler
-- failures): those of the events not delivered yet. A delivered event keeps no delivery state
-- (the completion deletes its queue row), so attempts that failed before a delivery succeeded
-- are not here; the workers' metrics count them (outbox_retried_total).
-- Delivered events enqueued more than an hour ago are not read: they are most of the table.
-- Indexes: the queue table read whole (it holds the events not delivered only, which the
-- gauges count every interval too), each row's event by the event table's primary key (one
-- probe a queue row, never the whole event table);
-- <table>_created_brin for the last hour's enqueues, each probed in the queue's primary key.
WITH undelivered AS (
    SELECT e.event_type,
           e.event_version,
           count(*) FILTER (WHERE q.status = 'pending')    AS pending,
           count(*) FILTER (WHERE q.status = 'processing') AS processing,
           count(*) FILTER (WHERE q.status = 'exhausted')  AS exhausted,
           sum(q.lease_expiries + q.handler_failures)::bigint AS failures,
           (array_agg(q.last_error ORDER BY q.updated_at DESC) FILTER (WHERE q.last_error IS NOT NULL))[1] AS last_error,
           max(q.updated_at) FILTER (WHERE q.last_error IS NOT NULL) AS last_failure_at
    FROM /* TEMPLATE: table */outbox_queue AS q
    -- Each queue row's event by primary key. LIMIT 1 changes no result (one event an id) but
    -- keeps the planner from a hash join, which would read the whole event table to find the
    -- few events the queue holds.
    CROSS JOIN LATERAL (
        SELECT e.event_type, e.event_version
        FROM /* TEMPLATE: table */outbox AS e
        WHERE e.id = q.id
        LIMIT 1
    ) AS e
    GROUP BY e.event_type, e.event_version
),
last_hour AS (
    SELECT e.event_type,
           e.event_version,
           count(*) AS enqueued_last_hour,
           count(*) FILTER (WHERE NOT EXISTS (
               SELECT 1 FROM /* TEMPLATE: table */outbox_queue AS q WHERE q.id = e.id
           )) AS delivered_of_last_hour
    FROM /* TEMPLATE: table */outbox AS e
    WHERE e.created_at >= now() - interval '1 hour'
    GROUP BY e.event_type, e.event_version
)
SELECT event_type,
       event_version,
       coalesce(u.pending, 0)                 AS pending,
       coalesce(u.processing, 0)              AS processing,
       coalesce(u.exhausted, 0)               AS exhausted,
       coalesce(u.failures, 0)                AS failures,
       coalesce(h.enqueued_last_hour, 0)      AS enqueued_last_hour,
       coalesce(h.delivered_of_last_hour, 0)  AS delivered_of_last_hour,
       u.last_error,
       u.last_failure_at
FROM undelivered AS u
FULL JOIN last_hour AS h USING (event_type, event_version)
ORDER BY event_type, event_version

-- Dashboard chart: events enqueued per minute over the last hour, and where each minute's events
-- stand now: delivered, exhausted, or still open (the rest). A minute whose events are not all
-- delivered shows delivery falling behind (or failing, for the exhausted part).
--
-- No parameters. Returns 60 rows, oldest minute first: (minute timestamptz, enqueued bigint,
-- delivered bigint, exhausted bigint); a minute without enqueues has zeros.
-- Not a delivery rate: a delivered event keeps no delivery time (its queue row, deleted by the
-- completion, is all the state there was), so deliveries per minute and the enqueue-to-delivery
-- latency come from the workers' metrics (outbox_delivered_total,
-- outbox_delivery_latency_seconds). Events deleted by a completion (retention zero) or a purge
-- are gone and not counted.
-- Index: <table>_created_brin (created_at), the last hour's pages only (the event table is
-- insert-only, so created_at follows its pages); the queue's primary key for each event's state.
WITH enqueued AS (
    SELECT date_trunc('minute', e.created_at) AS minute,
           count(*) AS enqueued,
           count(*) FILTER (WHERE q.id IS NULL) AS delivered,
           count(*) FILTER (WHERE q.exhausted_at IS NOT NULL) AS exhausted
    FROM /* TEMPLATE: table */outbox AS e
    LEFT JOIN /* TEMPLATE: table */outbox_queue AS q ON q.id = e.id
    WHERE e.created_at >= date_trunc('minute', now()) - interval '59 minutes'
    GROUP BY 1
)
SELECT m.minute,
       coalesce(x.enqueued, 0) AS enqueued,
       coalesce(x.delivered, 0) AS delivered,
       coalesce(x.exhausted, 0) AS exhausted
FROM generate_series(date_trunc('minute', now()) - interval '59 minutes',
                     date_trunc('minute', now()),
                     interval '1 minute') AS m(minute)
LEFT JOIN enqueued AS x ON x.minute = m.minute
ORDER BY m.minute

-- Events that wait for a worker: the ready pending events whose stored (type, version) no live
-- worker of the table claims (outbox_workers, migrations/0007_workers.sql), per type and
-- version, with how many wait and since when the oldest of them could have been claimed. What
-- `outbox status`, the dashboard and the `outbox_unhandled_events` gauge show: a missing
-- deploy, not a failure (docs/rolling-deploys.md).
--
-- Parameters: $1 the outbox table's name text (outbox_workers.table_name), $2 limit bigint:
-- how many of the oldest ready pending events are looked at. An event nobody claims stays at
-- the head of the open index, so the oldest events are where it is found; the count is of
-- those looked at (it reaches the limit when more wait).
-- Returns (event_type, event_version, waiting bigint, since timestamptz, age_seconds float8 (now()
-- - since, by the database clock), live_workers bigint),
-- oldest first; no row when every waiting event has a worker. With no live worker at all, every
-- ready pending event is listed (live_workers 0): a worker of a library older than
-- outbox_workers claims everything but is not listed there.
--
-- Indexes: <table>_queue_open_idx in order, the event table's primary key for the type and
-- version, outbox_workers' primary key.
WITH oldest AS (
    SELECT q.id, q.available_at
    FROM /* TEMPLATE: table */outbox_queue AS q
    WHERE q.exhausted_at IS NULL AND q.available_at <= now() AND q.status = 'pending'
    ORDER BY q.available_at, q.id
    LIMIT $2
), live AS (
    SELECT w.handles
    FROM outbox_workers AS w
    WHERE w.table_name = $1 AND w.expires_at >= now()
), waiting AS (
    -- The events by `id = ANY (ARRAY(...))`, which can only be looked up in the primary key:
    -- a plain join let the planner hash the whole event table (measured on 211,000 events).
    SELECT e.event_type, e.event_version, count(*) AS waiting, min(o.available_at) AS since
    FROM /* TEMPLATE: table */outbox AS e
    JOIN oldest AS o ON o.id = e.id
    WHERE e.id = ANY (ARRAY(SELECT id FROM oldest))
    GROUP BY e.event_type, e.event_version
)
SELECT w.event_type, w.event_version, w.waiting, w.since,
       greatest(extract(epoch FROM now() - w.since), 0)::float8 AS age_seconds,
       (SELECT count(*) FROM live) AS live_workers
FROM waiting AS w
WHERE NOT EXISTS (
    SELECT 1
    FROM live AS l
    WHERE (l.handles IS NULL
           OR l.handles @> jsonb_build_array(
                  jsonb_build_object('name', w.event_type, 'version', w.event_version))))
ORDER BY w.since, w.event_type, w.event_version

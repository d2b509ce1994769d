-- Claim for a worker whose sink names the events it can deliver (a dispatcher): like
-- claim_batch.sql, but only events whose stored (event_type, event_version) is one of the pairs
-- given. Every other event stays pending, untouched: no attempt charged, never exhausted for
-- want of a handler, claimable by the worker that handles it (docs/rolling-deploys.md).
--
-- Parameters: $1 limit bigint, $2 lease in microseconds bigint, $3 worker name text,
-- $4 event names text[], $5 event versions int[] (pairs: $4[i] with $5[i]).
--
-- The type and version live on the event table only, so the candidates join it by its primary
-- key. Measured against copying them into the queue row at enqueue (100,000 open rows, EXPLAIN
-- ANALYZE, docs/rolling-deploys.md): with nothing unhandled, the join adds one primary-key probe
-- per candidate (about 0.6 ms on a batch of 256); with 10,000 unhandled events at the head of the
-- open index, every claim steps over them either way (32 ms through the join, 14 ms with copied
-- columns, 0.25 ms unfiltered). Copying would widen every queue row and every enqueue, and needs
-- a migration of every table before the filter may be trusted (queue rows written by an older
-- library would carry no type); the join needs none, and a backlog nobody handles is visible
-- (`outbox_unhandled_events`) for what it is: a missing deploy. Producers and workers of an
-- older library keep working against the same tables.
--
-- Everything else (SKIP LOCKED, the HOT update, the lease by the database clock, the
-- `id = ANY (ARRAY(...))` update) is claim_batch.sql's; see the comments there.
-- Indexes: <table>_queue_open_idx for candidates; the event table's primary key for the filter
-- and the payloads.
WITH candidates AS (
    SELECT q.id
    FROM /* TEMPLATE: table */outbox_queue AS q
    JOIN /* TEMPLATE: table */outbox AS e ON e.id = q.id
    WHERE q.exhausted_at IS NULL AND q.available_at <= now()
      AND q.status = 'pending'
      AND (e.event_type, e.event_version) IN (
            SELECT h.event_type, h.event_version
            FROM unnest($4::text[], $5::integer[]) AS h(event_type, event_version))
    ORDER BY q.available_at, q.id
    LIMIT $1
    FOR UPDATE OF q SKIP LOCKED
), claimed AS (
    UPDATE /* TEMPLATE: table */outbox_queue AS q
    SET status = 'processing',
        lease_until = now() + $2::bigint * interval '1 microsecond',
        claimed_by = $3,
        claim_version = q.claim_version + 1,
        attempts = q.attempts + 1,
        updated_at = now()
    WHERE q.id = ANY (ARRAY(SELECT id FROM candidates))
    RETURNING q.id, q.claim_version, q.attempts, q.max_attempts, q.lease_until, q.available_at
)
-- The payloads, read from the event table by its primary key, one probe per claimed row.
SELECT c.id, e.event_id, e.event_type, e.event_version, e.aggregate_type, e.aggregate_id,
       e.aggregate_version, e.payload, e.headers, c.claim_version, c.attempts, c.max_attempts,
       c.lease_until,
       -- For the worker's histograms, by the database clock: how long the row had been
       -- claimable (available_at is not changed by the claim, so c still holds it), and how
       -- long ago it was enqueued.
       greatest(extract(epoch FROM now() - c.available_at), 0)::float8 AS waited_seconds,
       greatest(extract(epoch FROM now() - e.created_at), 0)::float8 AS age_seconds
FROM claimed AS c
JOIN /* TEMPLATE: table */outbox AS e ON e.id = c.id

-- Ordered claim for a worker whose sink names the events it can deliver: claim_batch_ordered.sql
-- with claim_batch_handled.sql's filter (see both for the why).
--
-- Parameters: $1 limit bigint, $2 lease in microseconds bigint, $3 worker name text,
-- $4 event names text[], $5 event versions int[] (pairs: $4[i] with $5[i]).
--
-- The earlier-event check is NOT filtered: an open event of the aggregate that this worker
-- cannot handle (a newer version, waiting for its worker) still blocks the later events of its
-- aggregate, so an aggregate's order holds across a rolling deploy: nothing overtakes an event
-- that waits for its handler to be deployed.
--
-- Indexes: <table>_queue_open_idx for candidates, <table>_queue_aggregate_idx for the
-- earlier-event check, the event table's primary key for the filter and the payloads.
WITH candidates AS (
    SELECT o.id
    FROM /* TEMPLATE: table */outbox_queue AS o
    JOIN /* TEMPLATE: table */outbox AS ev ON ev.id = o.id
    WHERE o.exhausted_at IS NULL AND o.available_at <= now()
      AND o.status = 'pending'
      AND (ev.event_type, ev.event_version) IN (
            SELECT h.event_type, h.event_version
            FROM unnest($4::text[], $5::integer[]) AS h(event_type, event_version))
      AND (o.aggregate_id IS NULL OR NOT EXISTS (
            SELECT 1
            FROM /* TEMPLATE: table */outbox_queue AS e
            WHERE e.aggregate_type = o.aggregate_type
              AND e.aggregate_id = o.aggregate_id
              AND e.id < o.id
              AND e.exhausted_at IS NULL))
    ORDER BY o.available_at, o.id
    LIMIT $1
    FOR UPDATE OF o SKIP LOCKED
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

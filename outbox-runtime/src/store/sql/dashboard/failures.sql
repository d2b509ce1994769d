-- Dashboard: failing events (open events that failed at least once) and exhausted events, newest
-- change first, with optional filters.
--
-- Parameters: $1 which text ('failing', 'exhausted' or null for both), $2 event_type text or
-- null, $3 aggregate_id text or null, $4 changed since timestamptz or null, $5 error text
-- (case-insensitive substring of last_error) or null, $6 limit bigint, $7 changed within this
-- many microseconds bigint or null (an age, measured by the database clock).
-- Returns (event_id, event_type, event_version, status, aggregate_type, aggregate_id, attempts,
-- max_attempts, lease_expiries, handler_failures, last_error, claimed_by, created_at,
-- updated_at, available_at).
-- The error filter is strpos, not LIKE: an operator's % or _ is text, not a wildcard.
-- Both kinds are queue rows (a delivered event has none, and keeps no failures); each is joined
-- to its event by primary key for the type and the times, one probe a row: LIMIT 1 changes no
-- result (one event an id) but keeps the planner from a hash join that would read the whole
-- event table when many events fail. The queue keeps a copy of the aggregate, so that filter
-- needs no event.
-- Indexes: <table>_queue_open_idx for the failing branch, <table>_queue_exhausted_idx for the
-- exhausted one (one branch each, so a state filter reads one of them), the event table's
-- primary key.
SELECT e.event_id, e.event_type, e.event_version, f.status, e.aggregate_type, e.aggregate_id,
       f.attempts, f.max_attempts, f.lease_expiries, f.handler_failures, f.last_error,
       f.claimed_by, e.created_at, f.updated_at, f.available_at
FROM (
    SELECT q.id, q.status, q.attempts, q.max_attempts, q.lease_expiries, q.handler_failures,
           q.last_error, q.claimed_by, q.updated_at, q.available_at, q.aggregate_id
    FROM /* TEMPLATE: table */outbox_queue AS q
    WHERE q.exhausted_at IS NULL
      AND (q.lease_expiries > 0 OR q.handler_failures > 0)
      AND ($1::text IS NULL OR $1::text = 'failing')
    UNION ALL
    SELECT q.id, q.status, q.attempts, q.max_attempts, q.lease_expiries, q.handler_failures,
           q.last_error, q.claimed_by, q.updated_at, q.available_at, q.aggregate_id
    FROM /* TEMPLATE: table */outbox_queue AS q
    WHERE q.exhausted_at IS NOT NULL
      AND ($1::text IS NULL OR $1::text = 'exhausted')
) AS f
CROSS JOIN LATERAL (
    SELECT e.event_id, e.event_type, e.event_version, e.aggregate_type, e.aggregate_id,
           e.created_at
    FROM /* TEMPLATE: table */outbox AS e
    WHERE e.id = f.id
    LIMIT 1
) AS e
WHERE ($2::text IS NULL OR e.event_type = $2::text)
  AND ($3::text IS NULL OR f.aggregate_id = $3::text)
  AND ($4::timestamptz IS NULL OR f.updated_at >= $4::timestamptz)
  AND ($7::bigint IS NULL OR f.updated_at >= now() - $7::bigint * interval '1 microsecond')
  AND ($5::text IS NULL OR strpos(lower(f.last_error), lower($5::text)) > 0)
ORDER BY f.updated_at DESC
LIMIT $6

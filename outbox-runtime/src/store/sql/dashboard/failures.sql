-- Dashboard: failing events (open rows that failed at least once) and exhausted events, newest
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
-- Indexes: <table>_open_idx for the failing branch, <table>_exhausted_idx for the exhausted
-- one (one branch each, so neither reads delivered history).
SELECT *
FROM (
    SELECT event_id, event_type, event_version, status, aggregate_type, aggregate_id, attempts,
           max_attempts, lease_expiries, handler_failures, last_error, claimed_by, created_at,
           updated_at, available_at
    FROM /* TEMPLATE: table */outbox
    WHERE delivered_at IS NULL AND exhausted_at IS NULL
      AND (lease_expiries > 0 OR handler_failures > 0)
      AND ($1::text IS NULL OR $1::text = 'failing')
      AND ($2::text IS NULL OR event_type = $2::text)
      AND ($3::text IS NULL OR aggregate_id = $3::text)
      AND ($4::timestamptz IS NULL OR updated_at >= $4::timestamptz)
      AND ($7::bigint IS NULL OR updated_at >= now() - $7::bigint * interval '1 microsecond')
      AND ($5::text IS NULL OR strpos(lower(last_error), lower($5::text)) > 0)
    UNION ALL
    SELECT event_id, event_type, event_version, status, aggregate_type, aggregate_id, attempts,
           max_attempts, lease_expiries, handler_failures, last_error, claimed_by, created_at,
           updated_at, available_at
    FROM /* TEMPLATE: table */outbox
    WHERE exhausted_at IS NOT NULL
      AND ($1::text IS NULL OR $1::text = 'exhausted')
      AND ($2::text IS NULL OR event_type = $2::text)
      AND ($3::text IS NULL OR aggregate_id = $3::text)
      AND ($4::timestamptz IS NULL OR updated_at >= $4::timestamptz)
      AND ($7::bigint IS NULL OR updated_at >= now() - $7::bigint * interval '1 microsecond')
      AND ($5::text IS NULL OR strpos(lower(last_error), lower($5::text)) > 0)
) AS failing
ORDER BY updated_at DESC
LIMIT $6

-- Dashboard: one event, everything its row records. The payload leaves the database only when
-- the dashboard was started to show payloads (they can hold personal data).
--
-- Parameters: $1 event_id uuid, $2 show the payload boolean.
-- Returns at most one row.
-- Index: the unique index on event_id.
SELECT event_id, operation_key, event_type, event_version, aggregate_type, aggregate_id,
       aggregate_version, headers,
       CASE WHEN $2::boolean THEN payload END AS payload,
       status, available_at, lease_until, claimed_by, claim_version, attempts, max_attempts,
       lease_expiries, handler_failures, last_error, created_at, updated_at, delivered_at,
       exhausted_at, now() AS read_at
FROM /* TEMPLATE: table */outbox
WHERE event_id = $1

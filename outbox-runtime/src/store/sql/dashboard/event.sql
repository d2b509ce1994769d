-- Dashboard: one event, everything its rows record: the event, and its queue row while it is not
-- delivered. The payload leaves the database only when the dashboard was started to show
-- payloads (they can hold personal data).
--
-- Parameters: $1 event_id uuid, $2 show the payload boolean.
-- Returns at most one row. status is the queue row's, or 'delivered' when there is none; then
-- every queue column (available_at ... exhausted_at) is NULL: a delivered event keeps no
-- delivery state.
-- Indexes: the unique index on event_id, then the queue's primary key.
SELECT e.event_id, e.operation_key, e.event_type, e.event_version, e.aggregate_type,
       e.aggregate_id, e.aggregate_version, e.headers,
       CASE WHEN $2::boolean THEN e.payload END AS payload,
       e.created_at,
       coalesce(q.status, 'delivered') AS status,
       q.id IS NOT NULL AS queued,
       q.available_at, q.lease_until, q.claimed_by, q.claim_version, q.attempts, q.max_attempts,
       q.lease_expiries, q.handler_failures, q.last_error, q.updated_at, q.exhausted_at,
       now() AS read_at
FROM /* TEMPLATE: table */outbox AS e
LEFT JOIN /* TEMPLATE: table */outbox_queue AS q ON q.id = e.id
WHERE e.event_id = $1

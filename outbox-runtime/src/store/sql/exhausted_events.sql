-- Operator listing: the most recently exhausted events with their failure history.
--
-- Parameters: $1 limit bigint.
-- Indexes: <table>_queue_exhausted_idx (exhausted_at) WHERE exhausted_at IS NOT NULL, walked
-- newest first and stopped after $1 rows; the event table's primary key for each row's event.
SELECT e.event_id, e.event_type, e.event_version, q.attempts, q.last_error, q.lease_expiries,
       q.handler_failures, q.updated_at
FROM /* TEMPLATE: table */outbox_queue AS q
JOIN /* TEMPLATE: table */outbox AS e ON e.id = q.id
WHERE q.exhausted_at IS NOT NULL
ORDER BY q.exhausted_at DESC
LIMIT $1

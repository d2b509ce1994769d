-- List events: up to $1 events of the table in id order (enqueue order), whatever their status.
-- For the test kit's assertions (`outbox_runtime::testing::enqueued`), which read what a
-- transaction or a service enqueued; not used by workers.
--
-- Parameters: $1 limit bigint.
-- Runs on the caller's executor, so inside an open transaction it sees that transaction's own
-- uncommitted events. An event without a queue row is delivered: it keeps no delivery state, so
-- its attempts, max_attempts and last_error are NULL (the completion deleted them with the
-- queue row).
-- Indexes: the event table's primary key (walked in id order, stopped after $1 rows), the
-- queue's primary key for each event's state.
SELECT e.id, e.event_id, e.operation_key, e.event_type, e.event_version, e.aggregate_type,
       e.aggregate_id, e.aggregate_version, e.payload, e.headers,
       coalesce(q.status, 'delivered') AS status,
       q.attempts,
       q.max_attempts,
       q.last_error
FROM /* TEMPLATE: table */outbox AS e
LEFT JOIN /* TEMPLATE: table */outbox_queue AS q ON q.id = e.id
ORDER BY e.id
LIMIT $1

-- List events: up to $1 rows of the table in id order (enqueue order), whatever their status.
-- For the test kit's assertions (`outbox_runtime::testing::enqueued`), which read what a
-- transaction or a service enqueued; not used by workers.
--
-- Parameters: $1 limit bigint.
-- Runs on the caller's executor, so inside an open transaction it sees that transaction's own
-- uncommitted events.
-- Index: primary key (walked in id order, stopped after $1 rows).
SELECT id, event_id, operation_key, event_type, event_version, aggregate_type, aggregate_id,
       aggregate_version, payload, headers, status, attempts, max_attempts, last_error
FROM /* TEMPLATE: table */outbox
ORDER BY id
LIMIT $1

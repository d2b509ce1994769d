-- Enqueue fallback: the event already stored under an operation key, read with a fresh snapshot
-- (needed when enqueue.sql lost an insert race to a transaction that committed after its
-- snapshot was taken).
--
-- Parameters: $1 event_id uuid (derived from the operation key, see create_table.sql).
-- Returns at most one row: (event_id, payload_fingerprint).
-- Index: the unique index on event_id.
SELECT event_id, payload_fingerprint
FROM /* TEMPLATE: table */outbox
WHERE event_id = $1

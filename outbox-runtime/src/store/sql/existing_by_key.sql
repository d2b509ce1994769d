-- Enqueue fallback: the event already stored under an operation key, read by a statement of its
-- own after enqueue.sql inserted nothing (so with a fresh snapshot, which also sees a row that
-- another transaction committed after the insert began).
--
-- Parameters: $1 event_id uuid (derived from the operation key, see create_table.sql).
-- Returns at most one row: (event_id, payload_fingerprint).
-- Index: the unique index on event_id.
SELECT event_id, payload_fingerprint
FROM /* TEMPLATE: table */outbox
WHERE event_id = $1

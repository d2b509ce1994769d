-- Operator retry of every exhausted event of one type (after the receiver was fixed).
--
-- Parameters: $1 event_type text.
-- Like retry_exhausted.sql for each matching row. The type is the event's, so each exhausted
-- queue row is joined to its event by primary key.
-- Indexes: <table>_queue_exhausted_idx (exhausted_at) WHERE exhausted_at IS NOT NULL, the event
-- table's primary key.
UPDATE /* TEMPLATE: table */outbox_queue AS q
SET status = 'pending',
    attempts = 0,
    available_at = now(),
    lease_until = NULL,
    exhausted_at = NULL,
    updated_at = now()
FROM /* TEMPLATE: table */outbox AS e
WHERE q.exhausted_at IS NOT NULL
  AND e.id = q.id
  AND e.event_type = $1

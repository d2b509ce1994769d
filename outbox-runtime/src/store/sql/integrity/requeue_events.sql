-- Doctor --requeue: give events that read as delivered without ever being claimed
-- (unqueued_events.sql) their queue row, pending now, so the workers deliver them.
--
-- Parameters: $1 the event rows' ids (bigint[]). An event that has a queue row by now is left
-- alone. Returns the ids queued.
-- Index: the event table's primary key for the ids, the queue's for the conflict check.
INSERT INTO /* TEMPLATE: table */outbox_queue (id, aggregate_type, aggregate_id)
SELECT e.id, e.aggregate_type, e.aggregate_id
FROM /* TEMPLATE: table */outbox AS e
WHERE e.id = ANY ($1::bigint[])
ON CONFLICT (id) DO NOTHING
RETURNING id

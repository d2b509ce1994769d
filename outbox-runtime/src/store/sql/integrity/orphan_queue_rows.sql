-- Doctor: queue rows whose event is gone (an operator's DELETE before the foreign key, or with
-- its triggers off). Such a row was claimed, charged an attempt and exhausted for nothing, and
-- no listing showed it: the event listings join the event table.
--
-- Parameters: $1 how many to list (bigint). Returns every orphan's count in `total` and the
-- first $1 of them in id order.
-- Index: a scan of the queue table (the rows not delivered), one probe of the event table's
-- primary key each. The queue holds only the events not delivered, so this reads what the
-- claim reads; it runs when an operator asks, never on the delivery path.
SELECT q.id, q.status, q.attempts, q.last_error, count(*) OVER () AS total
FROM /* TEMPLATE: table */outbox_queue AS q
-- A correlated probe the planner cannot turn into a join: one primary-key lookup per queue row,
-- never a hash of the whole history (which an anti-join chose for the delete: 211,100 rows read
-- to find none).
WHERE NOT EXISTS (SELECT 1 FROM /* TEMPLATE: table */outbox AS e WHERE e.id = q.id OFFSET 0)
ORDER BY q.id
LIMIT $1

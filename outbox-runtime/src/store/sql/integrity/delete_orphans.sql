-- Doctor --repair: delete the queue rows whose event is gone (orphan_queue_rows.sql): there is
-- nothing to deliver for them. Returns the ids deleted.
-- Index: as orphan_queue_rows.sql.
DELETE FROM /* TEMPLATE: table */outbox_queue AS q
-- A correlated probe the planner cannot turn into a join: one primary-key lookup per queue row,
-- never a hash of the whole history (which an anti-join chose for the delete: 211,100 rows read
-- to find none).
WHERE NOT EXISTS (SELECT 1 FROM /* TEMPLATE: table */outbox AS e WHERE e.id = q.id OFFSET 0)
RETURNING q.id

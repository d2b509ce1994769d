-- Doctor --repair: delete the queue rows whose event is gone (orphan_queue_rows.sql): there is
-- nothing to deliver for them. Returns the ids deleted.
-- Index: as orphan_queue_rows.sql.
DELETE FROM /* TEMPLATE: table */outbox_queue AS q
WHERE NOT EXISTS (SELECT 1 FROM /* TEMPLATE: table */outbox AS e WHERE e.id = q.id)
RETURNING q.id

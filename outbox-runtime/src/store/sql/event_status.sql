-- Event status: where one event stands, by its event id (what enqueue returned).
--
-- Parameters: $1 event_id uuid.
-- Returns one row (status text) while the event is kept: its queue row's status, or 'delivered'
-- when it has none; no row when no event has that id (never enqueued, or purged).
-- Indexes: the unique index on event_id, then the queue's primary key.
SELECT coalesce(q.status, 'delivered') AS status
FROM /* TEMPLATE: table */outbox AS e
LEFT JOIN /* TEMPLATE: table */outbox_queue AS q ON q.id = e.id
WHERE e.event_id = $1

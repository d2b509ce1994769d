-- Doctor: the events that read as delivered (no queue row), with what tells who wrote them.
-- The typed enqueue and outbox_enqueue() derive the event id from the table and the operation
-- key (store::enqueue::event_id_for); the caller (store::integrity) keeps the rows whose id is
-- not that derivation: events another writer inserted without their queue row, before the
-- table had the invariants or while they were off, and so never claimed.
--
-- Parameters: none. Streamed (every event within retention that is delivered), oldest first.
-- Index: a scan of the event table, one probe of the queue's primary key each; an operator's
-- check, never on the delivery path.
SELECT e.id, e.event_id, e.operation_key, e.event_type, e.event_version, e.created_at
FROM /* TEMPLATE: table */outbox AS e
WHERE NOT EXISTS (SELECT 1 FROM /* TEMPLATE: table */outbox_queue AS q WHERE q.id = e.id)
ORDER BY e.id

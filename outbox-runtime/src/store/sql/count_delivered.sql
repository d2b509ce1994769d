-- Count delivered: the delivered events still kept (not yet purged), for `Store::stats` and the
-- operator's `outbox status`. Everything else `Store::stats` reports comes from gauges.sql.
--
-- No parameters. Returns one row: (delivered bigint).
-- Delivered is an event without a queue row. Delivered events are most of the event table (the
-- whole retention period), so this reads it whole, with an anti-join on the queue's primary key:
-- an operator query, never run by the workers on a timer.
SELECT count(*) AS delivered
FROM /* TEMPLATE: table */outbox AS e
WHERE NOT EXISTS (SELECT 1 FROM /* TEMPLATE: table */outbox_queue AS q WHERE q.id = e.id)

-- Operator retry: put one exhausted event back to pending, available now, with fresh attempts.
--
-- Parameters: $1 event_id uuid.
-- The counters lease_expiries and handler_failures and last_error are kept as history.
-- Index: the unique index on event_id (the event's row id), then the queue's primary key.
UPDATE /* TEMPLATE: table */outbox_queue
SET status = 'pending',
    attempts = 0,
    available_at = now(),
    lease_until = NULL,
    exhausted_at = NULL,
    updated_at = now()
WHERE id = (SELECT id FROM /* TEMPLATE: table */outbox WHERE event_id = $1)
  AND exhausted_at IS NOT NULL

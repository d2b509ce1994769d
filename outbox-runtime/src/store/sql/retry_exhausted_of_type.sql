-- Operator retry of every exhausted event of one type (after the receiver was fixed).
--
-- Parameters: $1 event_type text.
-- Like retry_exhausted.sql for each matching row.
-- Index: <table>_exhausted_idx (exhausted_at) WHERE exhausted_at IS NOT NULL.
UPDATE /* TEMPLATE: table */outbox
SET status = 'pending',
    attempts = 0,
    available_at = now(),
    lease_until = NULL,
    exhausted_at = NULL,
    updated_at = now()
WHERE event_type = $1 AND exhausted_at IS NOT NULL

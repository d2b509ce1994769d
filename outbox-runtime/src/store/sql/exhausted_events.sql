-- Operator listing: the most recently exhausted events with their failure history.
--
-- Parameters: $1 limit bigint.
-- Index: <table>_exhausted_idx (exhausted_at) WHERE exhausted_at IS NOT NULL.
SELECT event_id, event_type, event_version, attempts, last_error, lease_expiries,
       handler_failures, updated_at
FROM /* TEMPLATE: table */outbox
WHERE exhausted_at IS NOT NULL
ORDER BY exhausted_at DESC
LIMIT $1

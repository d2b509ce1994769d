-- Operator listing: the most recently exhausted events with their failure history.
--
-- Parameters: $1 limit bigint.
-- Index: <table>_exhausted_idx (updated_at) WHERE status = 'exhausted'.
SELECT event_id, event_type, event_version, attempts, last_error, lease_expiries,
       handler_failures, updated_at
FROM /* TEMPLATE: table */outbox
WHERE status = 'exhausted'
ORDER BY updated_at DESC
LIMIT $1

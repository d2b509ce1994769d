-- Dashboard: the live claims, soonest lease expiry first: which worker holds which event and for
-- how long still (by the database clock; negative: expired, waiting for recovery).
--
-- Parameters: $1 limit bigint.
-- Returns (event_id, event_type, event_version, claimed_by, attempts, claim_version,
-- lease_remaining_seconds float8).
-- Index: <table>_open_idx (processing rows are open; told from pending by status).
SELECT event_id, event_type, event_version, claimed_by, attempts, claim_version,
       extract(epoch FROM lease_until - now())::float8 AS lease_remaining_seconds
FROM /* TEMPLATE: table */outbox
WHERE delivered_at IS NULL AND exhausted_at IS NULL AND status = 'processing'
ORDER BY lease_until
LIMIT $1

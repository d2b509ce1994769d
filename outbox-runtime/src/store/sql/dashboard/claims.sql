-- Dashboard: the live claims, soonest lease expiry first: which worker holds which event and for
-- how long still (by the database clock; negative: expired, waiting for recovery).
--
-- Parameters: $1 limit bigint.
-- Returns (event_id, event_type, event_version, claimed_by, attempts, claim_version,
-- lease_remaining_seconds float8).
-- The claims are chosen on the queue table first and only they are joined to their events, so
-- the event table is read by primary key, $1 probes at most.
-- Indexes: <table>_queue_open_idx (processing rows are open; told from pending by status), the
-- event table's primary key.
SELECT e.event_id, e.event_type, e.event_version, c.claimed_by, c.attempts, c.claim_version,
       extract(epoch FROM c.lease_until - now())::float8 AS lease_remaining_seconds
FROM (SELECT id, claimed_by, attempts, claim_version, lease_until
      FROM /* TEMPLATE: table */outbox_queue
      WHERE exhausted_at IS NULL AND status = 'processing'
      ORDER BY lease_until
      LIMIT $1) AS c
JOIN /* TEMPLATE: table */outbox AS e ON e.id = c.id
ORDER BY c.lease_until

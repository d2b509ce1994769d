-- Recover: return up to $1 processing rows whose lease ran out (by the database clock) to
-- pending, or to exhausted when their attempts are used up.
--
-- Parameters: $1 limit bigint.
-- lease_expiries + 1, and last_error says when the lease expired and which worker held it.
-- SKIP LOCKED: a row being completed or renewed right now is left alone; if that statement wins,
-- the row is no longer an expired processing row, and if ours wins, its fence check fails.
-- Returns the new status of each recovered row.
-- Index: <table>_lease_idx (lease_until) WHERE status = 'processing'.
WITH expired AS (
    SELECT id
    FROM /* TEMPLATE: table */outbox
    WHERE status = 'processing' AND lease_until <= now()
    ORDER BY lease_until
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE /* TEMPLATE: table */outbox AS o
SET status = CASE WHEN o.attempts >= o.max_attempts THEN 'exhausted' ELSE 'pending' END,
    lease_expiries = o.lease_expiries + 1,
    last_error = format('lease expired at %s while held by worker %s (claim %s, attempt %s of %s)',
                        o.lease_until, coalesce(o.claimed_by, '?'), o.claim_version,
                        o.attempts, o.max_attempts),
    lease_until = NULL,
    updated_at = now()
FROM expired AS e
WHERE o.id = e.id
RETURNING o.status

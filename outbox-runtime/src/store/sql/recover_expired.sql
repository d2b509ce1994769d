-- Recover: return up to $1 processing rows whose lease ran out (by the database clock) to
-- pending, or to exhausted when their attempts are used up.
--
-- Parameters: $1 limit bigint, $2 backoff base in microseconds bigint, $3 backoff cap in
-- microseconds bigint, $4 jitter boolean.
-- A requeued row is claimable again only after a backoff, so a payload that kills every worker
-- that takes it does not hot-loop through claims: the same formula as a handler's failure
-- (worker::RetryPolicy::delay_for) for the attempt that expired, min(base * 2^(attempts - 1), cap)
-- with the exponent capped at 31, of which the upper half is random when $4 ("equal jitter",
-- random() per row). It is computed here, from each row's attempts, by the database clock.
-- lease_expiries + 1, and last_error says when the lease expired and which worker held it.
-- SKIP LOCKED: a row being completed or renewed right now is left alone; if that statement wins,
-- the row is no longer an expired processing row, and if ours wins, its fence check fails.
-- Returns the new status of each recovered row.
-- Index: <table>_queue_open_idx, walked in full and filtered by status and lease: there is no lease
-- index on purpose, since an index on lease_until would make every claim and renewal a non-HOT
-- update (see create_table.sql). The walk costs time proportional to the open rows, once per
-- maintenance interval, on the maintenance leader only.
-- The update finds the candidates by `id = ANY (ARRAY(...))`, not by joining them: a join lets
-- the planner hash the whole table when it expects a big batch (measured: a claim of 800 took
-- 40 ms through a hash join over 50,000 rows, 7 ms this way), while an array of ids can only be
-- looked up in the primary key.
WITH expired AS (
    SELECT id
    FROM /* TEMPLATE: table */outbox_queue
    WHERE exhausted_at IS NULL
      AND status = 'processing' AND lease_until <= now()
    ORDER BY available_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE /* TEMPLATE: table */outbox_queue AS o
SET status = CASE WHEN o.attempts >= o.max_attempts THEN 'exhausted' ELSE 'pending' END,
    exhausted_at = CASE WHEN o.attempts >= o.max_attempts THEN now() END,
    available_at = CASE WHEN o.attempts >= o.max_attempts THEN o.available_at
                        ELSE now() + least($2::bigint::float8 * power(2::float8, least(greatest(o.attempts - 1, 0), 31)),
                                           $3::bigint::float8)
                                     * CASE WHEN $4::boolean THEN 0.5 + 0.5 * random() ELSE 1 END
                                     * interval '1 microsecond' END,
    lease_expiries = o.lease_expiries + 1,
    last_error = format('lease expired at %s while held by worker %s (claim %s, attempt %s of %s)',
                        o.lease_until, coalesce(o.claimed_by, '?'), o.claim_version,
                        o.attempts, o.max_attempts),
    lease_until = NULL,
    updated_at = now()
WHERE o.id = ANY (ARRAY(SELECT id FROM expired))
RETURNING o.status

-- Renew many: extend the leases of a batch of claims in one statement.
--
-- Parameters: $1 ids bigint[], $2 claim_versions bigint[], $3 lease in microseconds bigint.
-- Fenced per row like renew.sql. Returns the ids that were renewed; the others were lost.
-- Index: primary key (one lookup per pair). Callers pass the pairs sorted by id, so two
-- batched statements over the same rows lock them in the same order (no deadlock).
UPDATE /* TEMPLATE: table */outbox AS o
SET lease_until = now() + $3::bigint * interval '1 microsecond',
    updated_at = now()
FROM unnest($1::bigint[], $2::bigint[]) AS c(id, claim_version)
WHERE o.id = c.id
  AND o.claim_version = c.claim_version
  -- The same fence as the single statements (status processing AND a live lease), written as a
  -- CASE on purpose: as plain conjuncts it matches <table>_lease_idx's predicate, and with
  -- stale statistics (ANALYZE taken while nothing was in flight) the planner then scans every
  -- in-flight row against every pair of the batch, O(in-flight x batch). As a CASE it cannot
  -- be used as an index predicate, so the primary key is the only access path.
  AND CASE WHEN o.status = 'processing' THEN o.lease_until > now() ELSE false END
RETURNING o.id

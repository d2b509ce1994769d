-- Renew many: extend the leases of a batch of claims in one statement.
--
-- Parameters: $1 ids bigint[], $2 claim_versions bigint[], $3 lease in microseconds bigint.
-- Fenced per row like renew.sql. Returns the (id, claim_version) pairs that were renewed; the
-- others were lost. Callers compare whole pairs (see complete_many.sql).
-- Index: primary key (one scan over the ids, `o.id = ANY($1)`). Callers pass the pairs sorted
-- by id, so two batched statements over the same rows lock them in the same order (no deadlock).
UPDATE /* TEMPLATE: table */outbox AS o
SET lease_until = now() + $3::bigint * interval '1 microsecond',
    updated_at = now()
FROM unnest($1::bigint[], $2::bigint[]) AS c(id, claim_version)
WHERE o.id = c.id
  -- Probes the primary key once per id (one index scan over the sorted array). Implied by
  -- the join above; it is here for the planner: statistics taken while every row was pending
  -- (after a burst of enqueues, with autovacuum off or late) estimate one `processing` row,
  -- and the planner then scanned the table and joined every in-flight row against every pair
  -- (O(in-flight x batch): 5-9 s for 1,024 pairs). tests/store_schema.rs checks the plan.
  AND o.id = ANY($1::bigint[])
  AND o.claim_version = c.claim_version
  -- The same fence as the single statements: status processing and a live lease. No index
  -- predicate matches these columns (an earlier schema had a lease index whose predicate did,
  -- and the planner walked it for every pair).
  AND o.status = 'processing'
  AND o.lease_until > now()
RETURNING o.id, o.claim_version

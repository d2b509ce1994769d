-- Renew many: extend the leases of a batch of claims in one statement.
--
-- Parameters: $1 ids bigint[], $2 claim_versions bigint[], $3 lease in microseconds bigint.
-- Fenced per row like renew.sql. Returns the (id, claim_version) pairs that were renewed; the
-- others were lost. Callers compare whole pairs (see complete_many.sql).
-- Index: primary key (one scan over the ids, `o.id = ANY($1)`). Callers pass the pairs sorted
-- by id, so two batched statements over the same rows lock them in the same order (no deadlock).
UPDATE /* TEMPLATE: table */outbox_queue AS o
SET lease_until = now() + $3::bigint * interval '1 microsecond',
    updated_at = now()
FROM unnest($1::bigint[], $2::bigint[]) AS c(id, claim_version)
WHERE o.id = c.id
  -- The id probe and the unestimable fence below are spelled as in complete_many.sql, for
  -- the same reason: a plan that stale statistics cannot turn quadratic.
  AND o.id = ANY($1::bigint[])
  AND o.claim_version = c.claim_version
  AND (CASE WHEN o.status = 'processing' THEN o.lease_until > now() ELSE false END)
RETURNING o.id, o.claim_version

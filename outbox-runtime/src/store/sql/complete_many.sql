-- Complete many: mark a batch of claimed events delivered in one statement.
--
-- Parameters: $1 ids bigint[], $2 claim_versions bigint[] (same length, pairwise).
-- Fenced per row like complete.sql. Returns the ids that were completed; every other claim of
-- the batch was lost.
-- Index: primary key (one lookup per pair).
UPDATE /* TEMPLATE: table */outbox AS o
SET status = 'delivered',
    delivered_at = now(),
    lease_until = NULL,
    updated_at = now()
FROM unnest($1::bigint[], $2::bigint[]) AS c(id, claim_version)
WHERE o.id = c.id
  AND o.claim_version = c.claim_version
  AND o.status = 'processing'
  AND o.lease_until > now()
RETURNING o.id

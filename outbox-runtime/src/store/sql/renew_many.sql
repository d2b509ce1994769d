-- Renew many: extend the leases of a batch of claims in one statement.
--
-- Parameters: $1 ids bigint[], $2 claim_versions bigint[], $3 lease in microseconds bigint.
-- Fenced per row like renew.sql. Returns the ids that were renewed; the others were lost.
-- Index: primary key.
UPDATE /* TEMPLATE: table */outbox AS o
SET lease_until = now() + $3::bigint * interval '1 microsecond',
    updated_at = now()
FROM unnest($1::bigint[], $2::bigint[]) AS c(id, claim_version)
WHERE o.id = c.id
  AND o.claim_version = c.claim_version
  AND o.status = 'processing'
  AND o.lease_until > now()
RETURNING o.id

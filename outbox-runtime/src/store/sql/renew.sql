-- Renew: extend the lease of one claim to now() + lease, if the claim is still ours.
--
-- Parameters: $1 id bigint, $2 claim_version bigint, $3 lease in microseconds bigint.
-- Fenced like complete.sql: an expired lease cannot be renewed (recovery may already have
-- handed the row to someone else).
-- Index: the queue's primary key.
UPDATE /* TEMPLATE: table */outbox_queue
SET lease_until = now() + $3::bigint * interval '1 microsecond',
    updated_at = now()
WHERE id = $1
  AND claim_version = $2
  AND status = 'processing'
  AND lease_until > now()

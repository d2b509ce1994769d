-- Exhaust undecodable: end a just-claimed row whose payload or headers no worker can decode
-- (see payload_limits.rs), with its own reason, without delivering it.
--
-- Parameters: $1 id bigint, $2 claim_version bigint, $3 reason text.
-- Run by Store::claim_batch right after the claim that returned the row, fenced like
-- complete.sql, so only that claim can end it. The attempt the claim charged stays charged;
-- neither handler_failures nor lease_expiries count it (no handler ran, no lease expired):
-- last_error says why. The other rows of the batch are delivered as usual.
-- Index: the queue's primary key.
UPDATE /* TEMPLATE: table */outbox_queue
SET status = 'exhausted',
    exhausted_at = now(),
    lease_until = NULL,
    last_error = $3,
    updated_at = now()
WHERE id = $1
  AND claim_version = $2
  AND status = 'processing'
  AND lease_until > now()

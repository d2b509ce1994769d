-- Complete: mark one claimed event delivered, if the claim is still ours, by deleting its queue
-- row (the event row stays until the purge).
--
-- Parameters: $1 id bigint, $2 claim_version bigint.
-- Fenced: status processing, the same claim_version, and a live lease by the database clock.
-- Zero rows affected means the claim was lost (recovered, re-claimed, or its lease ran out).
-- Index: the queue's primary key.
DELETE FROM /* TEMPLATE: table */outbox_queue
WHERE id = $1
  AND claim_version = $2
  AND status = 'processing'
  AND lease_until > now()

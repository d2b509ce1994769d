-- Release: hand a claimed but unstarted event back (shutdown), without charging the attempt.
--
-- Parameters: $1 id bigint, $2 claim_version bigint.
-- Back to pending, immediately available, attempts - 1, lease cleared. claim_version is not
-- lowered: the fencing token only ever grows. Fenced like complete.sql.
-- Index: the queue's primary key.
UPDATE /* TEMPLATE: table */outbox_queue
SET status = 'pending',
    attempts = attempts - 1,
    lease_until = NULL,
    updated_at = now()
WHERE id = $1
  AND claim_version = $2
  AND status = 'processing'
  AND lease_until > now()

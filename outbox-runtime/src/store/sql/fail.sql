-- Fail: record a failed delivery attempt reported by a handler.
--
-- Parameters: $1 id bigint, $2 claim_version bigint, $3 error text, $4 retry_after in
-- microseconds bigint, $5 permanent boolean.
-- A permanent failure, or a claim that used the last attempt (attempts are charged at claim
-- time), ends exhausted; otherwise the event is pending again from now() + retry_after.
-- handler_failures + 1 and the error is kept. Fenced like complete.sql.
-- Returns the new status, or no row when the claim was lost.
-- Index: the queue's primary key.
UPDATE /* TEMPLATE: table */outbox_queue
SET status = CASE WHEN $5::boolean OR attempts >= max_attempts THEN 'exhausted' ELSE 'pending' END,
    available_at = CASE WHEN $5::boolean OR attempts >= max_attempts THEN available_at
                        ELSE now() + $4::bigint * interval '1 microsecond' END,
    exhausted_at = CASE WHEN $5::boolean OR attempts >= max_attempts THEN now() END,
    lease_until = NULL,
    handler_failures = handler_failures + 1,
    last_error = $3,
    updated_at = now()
WHERE id = $1
  AND claim_version = $2
  AND status = 'processing'
  AND lease_until > now()
RETURNING status

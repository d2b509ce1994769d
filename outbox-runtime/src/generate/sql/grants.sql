-- Least-privilege grants for one outbox table ({table}) and two roles.
--
-- {enqueuer}: the role services connect as to write events. It may INSERT only the columns an
-- enqueue sets (not status, attempts or claim_version, so it cannot insert an event as already
-- delivered), and SELECT only the three columns the operation-key idempotency path reads back
-- (event_id, operation_key, payload_fingerprint): it cannot read other services' payloads.
GRANT INSERT (event_id, operation_key, payload_fingerprint, event_type, event_version,
              aggregate_type, aggregate_id, aggregate_version, payload, headers, max_attempts,
              available_at)
    ON {table} TO {enqueuer};
GRANT SELECT (event_id, operation_key, payload_fingerprint) ON {table} TO {enqueuer};

-- {worker}: the role workers (and the `outbox` operator command) connect as. It reads events,
-- updates only the columns of the state machine (never the payload, its type or its key), and
-- deletes delivered rows past retention. It cannot insert events.
GRANT SELECT, DELETE ON {table} TO {worker};
GRANT UPDATE (status, available_at, lease_until, claimed_by, claim_version, attempts,
              lease_expiries, handler_failures, last_error, updated_at, delivered_at,
              exhausted_at)
    ON {table} TO {worker};

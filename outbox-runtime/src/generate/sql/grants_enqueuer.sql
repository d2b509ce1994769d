-- Least-privilege grants of the enqueuer role on one outbox table ({table}) and its queue table
-- ({table}_queue), each what the library's statements (outbox-runtime/src/store/sql/) need; the
-- other role's are in grants_worker.sql. Printed by `outbox grants`, and given again by the upgrade of a
-- table to the split layout to the roles that held the earlier grants (grants_upgrade.sql).
--
-- {enqueuer}: the role services connect as to write events. The enqueue is one statement
-- (enqueue.sql): the event row, then its queue row from the event's RETURNING. On {table} it may
-- INSERT only the event's columns (not id or created_at) and SELECT only the three columns the
-- operation-key idempotency path reads back (event_id, operation_key, payload_fingerprint) and
-- the three the RETURNING hands to the queue row (id, aggregate_type, aggregate_id): it cannot
-- read other services' payloads. On {table}_queue it may INSERT only what an enqueue sets (not
-- status, attempts or claim_version, so it cannot insert an event as already claimed or
-- exhausted), and read nothing. It cannot update or delete either table.
GRANT INSERT (event_id, operation_key, payload_fingerprint, event_type, event_version,
              aggregate_type, aggregate_id, aggregate_version, payload, headers)
    ON {table} TO {enqueuer};
GRANT SELECT (id, event_id, operation_key, payload_fingerprint, aggregate_type, aggregate_id)
    ON {table} TO {enqueuer};
GRANT INSERT (id, aggregate_type, aggregate_id, max_attempts, available_at)
    ON {table}_queue TO {enqueuer};

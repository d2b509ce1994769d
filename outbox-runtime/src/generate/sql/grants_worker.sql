-- Least-privilege grants of the worker role on one outbox table ({table}) and its queue table
-- ({table}_queue), each what the library's statements (outbox-runtime/src/store/sql/) need; the
-- other role's are in grants_enqueuer.sql. Printed by `outbox grants`, and given again by the upgrade of a
-- table to the split layout to the roles that held the earlier grants (grants_upgrade.sql).
--
-- {worker}: the role workers (and the `outbox` operator command) connect as. It cannot insert
-- into either table: it cannot make an event, nor put a delivered one back in the queue.
-- On {table} it reads events and deletes them (the purge; the completion of retention zero
-- deletes the event with its queue row). The purge locks its batch first (FOR UPDATE SKIP
-- LOCKED), which PostgreSQL allows only with UPDATE on some column: granted on created_at
-- alone, so a payload, its type or its key can never be rewritten (moving created_at moves the
-- purge, which the DELETE allows anyway).
GRANT SELECT, DELETE ON {table} TO {worker};
GRANT UPDATE (created_at) ON {table} TO {worker};
-- On {table}_queue it reads and deletes (a completion deletes the queue row) and updates only
-- the columns of the state machine: never id, which ties the row to its event, nor the
-- aggregate the ordered claim reads, nor max_attempts.
GRANT SELECT, DELETE ON {table}_queue TO {worker};
GRANT UPDATE (status, available_at, lease_until, claimed_by, claim_version, attempts,
              lease_expiries, handler_failures, last_error, updated_at, exhausted_at)
    ON {table}_queue TO {worker};

-- The worker reads the contract registry at start-up (generate::verify_database_contracts).
GRANT SELECT ON outbox_contracts TO {worker};
-- The enqueuer reads one version's fingerprint before its first enqueue of a type
-- (store/sql/registered_contract.sql); not the shapes.
GRANT SELECT (event_type, event_version, fingerprint, type_name) ON outbox_contracts TO {enqueuer};
-- Every worker lists itself and the events it claims in outbox_workers (worker/roster.rs:
-- insert, refresh, delete its row and the expired rows of its table), and reads it for the
-- events no worker handles (store/sql/unhandled_events.sql); it never rewrites another
-- worker's name or table.
GRANT SELECT, INSERT, DELETE ON outbox_workers TO {worker};
GRANT UPDATE (handles, heartbeat_at, expires_at) ON outbox_workers TO {worker};

-- The worker reads the contract registry at start-up (generate::verify_database_contracts).
GRANT SELECT ON outbox_contracts TO {worker};
-- The enqueuer reads one version's fingerprint before its first enqueue of a type
-- (store/sql/registered_contract.sql); not the shapes.
GRANT SELECT (event_type, event_version, fingerprint, type_name) ON outbox_contracts TO {enqueuer};

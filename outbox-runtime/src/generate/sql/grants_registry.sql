-- The worker reads the contract registry at start-up (generate::verify_database_contracts).
GRANT SELECT ON outbox_contracts TO {worker};

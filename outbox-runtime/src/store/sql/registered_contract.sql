-- Enqueue-side contract check: the fingerprint the contract registry holds for one event version,
-- read once per process and event type before the first enqueue (store/contract_check.rs).
--
-- Parameters: $1 event_type text, $2 event_version integer.
-- Returns at most one row: (fingerprint, type_name).
-- Index: the primary key (event_type, event_version) of outbox_contracts.
-- Rights: the enqueuer role reads only these columns (generate/sql/grants_registry.sql).
SELECT fingerprint, type_name
FROM outbox_contracts
WHERE event_type = $1 AND event_version = $2

-- Start-up contract check: every (name, version) the database's contract registry holds.
--
-- No parameters. The registry is small (one row per event version); read it whole.
-- Index: primary key (event_type, event_version), for the order.
SELECT event_type, event_version, fingerprint, type_name
FROM outbox_contracts
ORDER BY event_type, event_version

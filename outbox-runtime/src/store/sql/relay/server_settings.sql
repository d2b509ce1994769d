-- What a WAL relay needs of the server and of its role (docs/relay.md, "Failures and what
-- happens"), read once at the relay's start: logical decoding, room for one more slot and one
-- more walsender, the REPLICATION attribute (or superuser) to read a slot, and the cap on the
-- WAL a slot may hold (-1: unlimited). $1 is the relay's slot name (it may exist already: a
-- restarted relay takes its slot back). Read-only; no table.
SELECT current_setting('wal_level') AS wal_level,
       current_setting('max_replication_slots')::integer AS max_replication_slots,
       (SELECT count(*) FROM pg_replication_slots)::integer AS replication_slots_used,
       EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1) AS slot_exists,
       current_setting('max_wal_senders')::integer AS max_wal_senders,
       (SELECT count(*) FROM pg_stat_replication)::integer AS wal_senders_used,
       (SELECT setting::bigint FROM pg_settings
        WHERE name = 'max_slot_wal_keep_size') AS max_slot_wal_keep_size_mb,
       (SELECT rolreplication OR rolsuper FROM pg_roles
        WHERE rolname = current_user) AS can_replicate,
       current_user::text AS role_name

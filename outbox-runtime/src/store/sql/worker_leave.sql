-- A worker that stops claiming leaves outbox_workers (migrations/0007_workers.sql).
--
-- Parameters: $1 outbox table text, $2 worker name text. Index: outbox_workers' primary key.
DELETE FROM outbox_workers WHERE table_name = $1 AND worker = $2

-- A worker's heartbeat in outbox_workers (migrations/0007_workers.sql): insert or refresh its
-- row with the events it claims, and delete the rows of the table's workers whose heartbeats
-- ran out (a worker that died), so the table holds the live workers only.
--
-- Parameters: $1 outbox table text, $2 worker name text, $3 handled events jsonb (an array of
-- {"name", "version"}; null: every event), $4 time to live in microseconds bigint.
-- Names no outbox table: the table name is a value here. Index: outbox_workers' primary key.
WITH expired AS (
    DELETE FROM outbox_workers
    WHERE table_name = $1 AND expires_at < now() AND worker <> $2
)
INSERT INTO outbox_workers AS w (table_name, worker, handles, expires_at)
VALUES ($1, $2, $3, now() + $4::bigint * interval '1 microsecond')
ON CONFLICT (table_name, worker) DO UPDATE
SET handles = EXCLUDED.handles,
    heartbeat_at = now(),
    expires_at = EXCLUDED.expires_at

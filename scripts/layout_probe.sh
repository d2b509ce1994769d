#!/usr/bin/env bash
# Probe of ways to finish a delivered event (docs/benchmarks.md, "Keeping delivered rows"): a
# drain of 50,000 events inside PostgreSQL (a procedure on one connection, one transaction per
# claim of 100 with SKIP LOCKED and per completion of 100, the real outbox schema), three ways:
# keep (mark delivered, today's default), delete (retention 0), move (delete + a narrow history
# row: event id unique, BRIN on delivered_at). Prints the time and WAL bytes per event, twice.
#
#   scripts/layout_probe.sh        # needs psql and the server of the README (127.0.0.1:5432)
#
# Drops and recreates the database `layout_probe`.
set -euo pipefail
cd "$(dirname "$0")/.."
DB=layout_probe
psql -h 127.0.0.1 -U postgres -d postgres -qc "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB"
P="psql -h 127.0.0.1 -U postgres -d $DB -q -v ON_ERROR_STOP=1"
$P -f outbox-runtime/migrations/0001_outbox.sql
$P <<'SQL'
CREATE TABLE outbox_history (
    event_id uuid PRIMARY KEY,
    id bigint NOT NULL,
    delivered_at timestamptz NOT NULL
);
CREATE INDEX outbox_history_purge ON outbox_history USING brin (delivered_at);
CREATE TABLE results (mode text, secs numeric, wal_bytes_per_event numeric);
CREATE PROCEDURE drain(mode text) LANGUAGE plpgsql AS $f$
DECLARE
  started timestamptz; lsn pg_lsn; ids bigint[]; n int := 0;
BEGIN
  started := clock_timestamp(); lsn := pg_current_wal_lsn();
  LOOP
    WITH c AS (SELECT id FROM outbox WHERE delivered_at IS NULL AND exhausted_at IS NULL
                 AND available_at <= now() AND status = 'pending'
               ORDER BY available_at, id LIMIT 100 FOR UPDATE SKIP LOCKED),
         u AS (UPDATE outbox o SET status = 'processing', claim_version = o.claim_version + 1,
                 attempts = o.attempts + 1, lease_until = now() + interval '30 s', claimed_by = 'w',
                 updated_at = now()
               FROM c WHERE o.id = c.id RETURNING o.id)
    SELECT array_agg(id) INTO ids FROM u;
    COMMIT;
    EXIT WHEN ids IS NULL;
    IF mode = 'keep' THEN
      UPDATE outbox SET status = 'delivered', delivered_at = now(), lease_until = NULL, updated_at = now()
      WHERE id = ANY(ids);
    ELSIF mode = 'delete' THEN
      DELETE FROM outbox WHERE id = ANY(ids);
    ELSE
      WITH d AS (DELETE FROM outbox WHERE id = ANY(ids) RETURNING id, event_id)
      INSERT INTO outbox_history (event_id, id, delivered_at) SELECT event_id, id, now() FROM d;
    END IF;
    COMMIT;
    n := n + cardinality(ids);
  END LOOP;
  INSERT INTO results VALUES (mode, round(extract(epoch FROM clock_timestamp() - started)::numeric, 3),
                      round(pg_wal_lsn_diff(pg_current_wal_lsn(), lsn) / greatest(n, 1), 0));
  COMMIT;
END $f$;
SQL
for mode in keep delete move keep delete move; do
  $P -c "TRUNCATE outbox, outbox_history" -c "INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload)
      SELECT gen_random_uuid(), 'k' || g, '\\x00', 'order_placed', 1, jsonb_build_object('order_id', g, 'total', 100) FROM generate_series(1, 50000) g" \
     -c "VACUUM ANALYZE outbox" -c "CHECKPOINT"
  $P -c "CALL drain('$mode')"
  $P -Atc "SELECT mode || ': ' || secs || ' s, ' || wal_bytes_per_event || ' WAL bytes/event' FROM results ORDER BY ctid DESC LIMIT 1"
done

#!/usr/bin/env bash
# A draft of the upgrade to the split layout (docs/split-layout.md, "The upgrade"), run on a
# table created by today's base migration and filled like the store's EXPLAIN test (200,000
# delivered events, 10,000 pending of which 1,000 in aggregates, 1,000 processing of which half
# expired, 100 exhausted). The upgrade runs in one transaction under the table's lock; the script
# prints how long it took and then checks what it must keep: every event row and its payload
# byte for byte, a queue row for exactly the events that were not delivered with their state,
# no state column left on the event table, and the indexes the plan names (exit 1 otherwise).
#
#   scripts/split_layout_upgrade.sh     # needs psql and the server of the README (127.0.0.1:5432)
#
# Drops and recreates the database `split_upgrade`. A draft: no migration of the crate runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
DB=split_upgrade
psql -h 127.0.0.1 -U postgres -d postgres -qc "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB"
P="psql -h 127.0.0.1 -U postgres -d $DB -q -v ON_ERROR_STOP=1"
$P -f outbox-runtime/migrations/0001_outbox.sql

$P <<'SQL'
INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version,
                    aggregate_type, aggregate_id, payload, created_at)
SELECT gen_random_uuid(), 'k' || g, '\x00', 'note', 1,
       CASE WHEN g > 200000 AND g <= 201000 THEN 'order' END,
       CASE WHEN g > 200000 AND g <= 201000 THEN 'agg-' || (g % 100) END,
       jsonb_build_object('n', g, 'text', repeat('x', g % 50)),
       now() - interval '8 days' + g * interval '1 ms'
FROM generate_series(1, 211100) g;
UPDATE outbox SET status = 'delivered', delivered_at = created_at + interval '1 second'
WHERE id <= 200000;
UPDATE outbox SET status = 'processing', claim_version = 1, attempts = 1, claimed_by = 'w',
                  lease_until = now() + CASE WHEN id % 2 = 0 THEN interval '1 hour' ELSE interval '-1 minute' END
WHERE id > 210000 AND id <= 211000;
UPDATE outbox SET status = 'exhausted', exhausted_at = now(), attempts = 10,
                  last_error = 'receiver said no', handler_failures = 10
WHERE id > 211000;
VACUUM ANALYZE outbox;
-- What the upgrade must keep, to compare with afterwards.
CREATE TABLE before_events AS SELECT id, event_id, md5(payload::text) AS payload_md5 FROM outbox;
CREATE TABLE before_state AS
SELECT id, status, available_at, lease_until, claimed_by, claim_version, attempts, max_attempts,
       lease_expiries, handler_failures, last_error, exhausted_at
FROM outbox WHERE delivered_at IS NULL;
SQL

started=$(date +%s.%N)
$P <<'SQL'
BEGIN;
-- Workers of the old version wait here, then fail on their next statement (the columns they
-- name are gone): loud, and nothing half-written.
LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE;
\i scripts/split_layout_queue.sql
INSERT INTO outbox_queue (id, aggregate_type, aggregate_id, status, available_at, lease_until,
                          claimed_by, claim_version, attempts, max_attempts, lease_expiries,
                          handler_failures, last_error, updated_at, exhausted_at)
SELECT id, aggregate_type, aggregate_id, status, available_at, lease_until, claimed_by,
       claim_version, attempts, max_attempts, lease_expiries, handler_failures, last_error,
       updated_at, exhausted_at
FROM outbox
WHERE delivered_at IS NULL;
-- A catalog change: the payloads are not rewritten (the dropped columns' space is reused as rows
-- are written, and the purge removes the old rows anyway). The indexes and CHECKs that read
-- these columns go with them.
ALTER TABLE outbox
    DROP COLUMN status, DROP COLUMN available_at, DROP COLUMN lease_until,
    DROP COLUMN claimed_by, DROP COLUMN claim_version, DROP COLUMN attempts,
    DROP COLUMN max_attempts, DROP COLUMN lease_expiries, DROP COLUMN handler_failures,
    DROP COLUMN last_error, DROP COLUMN updated_at, DROP COLUMN delivered_at,
    DROP COLUMN exhausted_at;
ALTER TABLE outbox SET (fillfactor = 100);
CREATE INDEX outbox_created_brin ON outbox USING brin (created_at);
COMMIT;
SQL
finished=$(date +%s.%N)
echo "upgrade of 211,100 events (11,100 not delivered): $(echo "$finished - $started" | bc) s"

problems=$($P -At <<'SQL'
SELECT 'event rows: ' || (SELECT count(*) FROM outbox) || ' after, ' || (SELECT count(*) FROM before_events) || ' before'
WHERE (SELECT count(*) FROM outbox) <> (SELECT count(*) FROM before_events);
SELECT 'payload or event id changed: ' || count(*)
FROM before_events b LEFT JOIN outbox o ON o.id = b.id
WHERE o.id IS NULL OR o.event_id <> b.event_id OR md5(o.payload::text) <> b.payload_md5
HAVING count(*) > 0;
SELECT 'queue rows differ from the state of the events not delivered: ' || count(*)
FROM (
    (SELECT id, status, available_at, lease_until, claimed_by, claim_version, attempts,
            max_attempts, lease_expiries, handler_failures, last_error, exhausted_at
     FROM outbox_queue
     EXCEPT ALL SELECT * FROM before_state)
    UNION ALL
    (SELECT * FROM before_state
     EXCEPT ALL SELECT id, status, available_at, lease_until, claimed_by, claim_version, attempts,
                       max_attempts, lease_expiries, handler_failures, last_error, exhausted_at
     FROM outbox_queue)
) AS d
HAVING count(*) > 0;
SELECT 'aggregate lost on a queue row: ' || count(*)
FROM outbox_queue q JOIN outbox o ON o.id = q.id
WHERE q.aggregate_id IS DISTINCT FROM o.aggregate_id OR q.aggregate_type IS DISTINCT FROM o.aggregate_type
HAVING count(*) > 0;
SELECT 'state column left on the event table: ' || attname
FROM pg_attribute
WHERE attrelid = 'outbox'::regclass AND attnum > 0 AND NOT attisdropped
  AND attname IN ('status', 'available_at', 'lease_until', 'claimed_by', 'claim_version',
                  'attempts', 'max_attempts', 'lease_expiries', 'handler_failures',
                  'last_error', 'updated_at', 'delivered_at', 'exhausted_at');
SELECT 'indexes: ' || string_agg(indexrelid::regclass::text, ', ' ORDER BY indexrelid::regclass::text)
FROM pg_index WHERE indrelid IN ('outbox'::regclass, 'outbox_queue'::regclass)
HAVING string_agg(indexrelid::regclass::text, ', ' ORDER BY indexrelid::regclass::text)
    <> 'outbox_created_brin, outbox_event_id_key, outbox_pkey, outbox_queue_aggregate_idx, outbox_queue_exhausted_idx, outbox_queue_open_idx, outbox_queue_pkey';
SQL
)
if [ -n "$problems" ]; then
  echo "$problems" >&2
  exit 1
fi
echo "every event and payload kept; a queue row with its state for each of the 11,100 not delivered; no state column left; the planned indexes"

#!/usr/bin/env bash
# Probe of ways to finish a delivered event (docs/benchmarks.md, "Keeping delivered rows"): a
# drain of 50,000 events inside PostgreSQL (a procedure on one connection, one transaction per
# claim of 100 with SKIP LOCKED and per completion of 100, the real outbox schema), six ways:
# keep (mark delivered, today's default), delete (retention 0), move (delete + a narrow history
# row: event id unique, BRIN on delivered_at), split (the event in an immutable table that
# holds the event id's unique index and the payload, its delivery state in a narrow queue table
# whose row the completion deletes; the claim reads the payloads by primary key), split-keep
# (the same event table; a narrow state row carrying what operators and the ordered claim read,
# which the completion marks delivered instead of deleting) and split-forget (split whose
# completion deletes the event row too: retention zero on the split pair). Prints the time and
# WAL bytes per event of each mode in MODES (default: every mode, twice). Then the enqueue
# side: 20,000 one-event transactions (synchronous_commit off, so the commit's flush does not
# hide the difference) into the outbox table as it is, into the split pair and into the
# split-keep pair.
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
-- The split layout: what an enqueue writes once, and what a claim changes.
CREATE TABLE outbox_event (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id            uuid        NOT NULL UNIQUE,
    operation_key       text        NOT NULL,
    payload_fingerprint bytea       NOT NULL,
    event_type          text        NOT NULL,
    event_version       integer     NOT NULL,
    aggregate_type      text,
    aggregate_id        text,
    aggregate_version   bigint,
    payload             jsonb       NOT NULL,
    headers             jsonb       NOT NULL DEFAULT '{}',
    created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE outbox_queue (
    id             bigint      PRIMARY KEY,
    status         text        NOT NULL DEFAULT 'pending',
    available_at   timestamptz NOT NULL DEFAULT now(),
    lease_until    timestamptz,
    claimed_by     text,
    claim_version  bigint      NOT NULL DEFAULT 0,
    attempts       integer     NOT NULL DEFAULT 0,
    max_attempts   integer     NOT NULL DEFAULT 10,
    updated_at     timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50);
CREATE INDEX outbox_queue_open ON outbox_queue (available_at, id);
-- split-keep: the event in outbox_event as for split, its delivery state in a narrow row that
-- the completion marks delivered instead of deleting (today's state machine, on a narrow row).
-- The row carries what the state machine, ordering and operators read (the event id for
-- lookups, the aggregate for the ordered claim, failure counts and the last error); the open
-- index is partial and the purge index a BRIN, so the mark writes the primary key's entry only.
CREATE TABLE outbox_state (
    id               bigint      PRIMARY KEY,
    event_id         uuid        NOT NULL,
    aggregate_type   text,
    aggregate_id     text,
    status           text        NOT NULL DEFAULT 'pending',
    available_at     timestamptz NOT NULL DEFAULT now(),
    lease_until      timestamptz,
    claimed_by       text,
    claim_version    bigint      NOT NULL DEFAULT 0,
    attempts         integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL DEFAULT 10,
    lease_expiries   integer     NOT NULL DEFAULT 0,
    handler_failures integer     NOT NULL DEFAULT 0,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    exhausted_at     timestamptz
) WITH (fillfactor = 50);
CREATE INDEX outbox_state_open ON outbox_state (available_at, id)
    WHERE delivered_at IS NULL AND exhausted_at IS NULL;
CREATE INDEX outbox_state_aggregate ON outbox_state (aggregate_type, aggregate_id, id)
    WHERE delivered_at IS NULL AND exhausted_at IS NULL AND aggregate_id IS NOT NULL;
CREATE INDEX outbox_state_purge ON outbox_state USING brin (delivered_at);
CREATE TABLE results (mode text, secs numeric, wal_bytes_per_event numeric);
CREATE PROCEDURE enqueue(mode text, n int) LANGUAGE plpgsql AS $f$
DECLARE
  started timestamptz; lsn pg_lsn; new_id bigint;
BEGIN
  SET LOCAL synchronous_commit = off;
  started := clock_timestamp(); lsn := pg_current_wal_lsn();
  FOR g IN 1..n LOOP
    IF mode = 'enqueue one table' THEN
      INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload)
      VALUES (gen_random_uuid(), 'k' || g, '\x00', 'order_placed', 1, jsonb_build_object('order_id', g, 'total', 100))
      ON CONFLICT (event_id) DO NOTHING;
    ELSIF mode = 'enqueue split-keep' THEN
      WITH e AS (INSERT INTO outbox_event (event_id, operation_key, payload_fingerprint, event_type, event_version, payload)
                 VALUES (gen_random_uuid(), 'k' || g, '\x00', 'order_placed', 1, jsonb_build_object('order_id', g, 'total', 100))
                 ON CONFLICT (event_id) DO NOTHING RETURNING id, event_id)
      INSERT INTO outbox_state (id, event_id) SELECT id, event_id FROM e;
    ELSE
      WITH e AS (INSERT INTO outbox_event (event_id, operation_key, payload_fingerprint, event_type, event_version, payload)
                 VALUES (gen_random_uuid(), 'k' || g, '\x00', 'order_placed', 1, jsonb_build_object('order_id', g, 'total', 100))
                 ON CONFLICT (event_id) DO NOTHING RETURNING id)
      INSERT INTO outbox_queue (id) SELECT id FROM e;
    END IF;
    COMMIT;
    SET LOCAL synchronous_commit = off;
  END LOOP;
  INSERT INTO results VALUES (mode, round(extract(epoch FROM clock_timestamp() - started)::numeric, 3),
                      round(pg_wal_lsn_diff(pg_current_wal_lsn(), lsn) / n, 0));
  COMMIT;
END $f$;
CREATE PROCEDURE drain(mode text) LANGUAGE plpgsql AS $f$
DECLARE
  started timestamptz; lsn pg_lsn; ids bigint[]; n int := 0;
BEGIN
  started := clock_timestamp(); lsn := pg_current_wal_lsn();
  LOOP
    IF mode = 'split-keep' THEN
      WITH c AS (SELECT id FROM outbox_state WHERE delivered_at IS NULL AND exhausted_at IS NULL
                   AND status = 'pending' AND available_at <= now()
                 ORDER BY available_at, id LIMIT 100 FOR UPDATE SKIP LOCKED),
           u AS (UPDATE outbox_state q SET status = 'processing', claim_version = q.claim_version + 1,
                   attempts = q.attempts + 1, lease_until = now() + interval '30 s', claimed_by = 'w',
                   updated_at = now()
                 FROM c WHERE q.id = c.id RETURNING q.id)
      SELECT array_agg(id) INTO ids FROM u;
      PERFORM count(e.payload) FROM outbox_event e WHERE e.id = ANY(ids);
      COMMIT;
      EXIT WHEN ids IS NULL;
      UPDATE outbox_state SET status = 'delivered', delivered_at = now(), lease_until = NULL,
        updated_at = now() WHERE id = ANY(ids);
      COMMIT;
      n := n + cardinality(ids);
      CONTINUE;
    END IF;
    IF mode IN ('split', 'split-forget') THEN
      WITH c AS (SELECT id FROM outbox_queue WHERE status = 'pending' AND available_at <= now()
                 ORDER BY available_at, id LIMIT 100 FOR UPDATE SKIP LOCKED),
           u AS (UPDATE outbox_queue q SET status = 'processing', claim_version = q.claim_version + 1,
                   attempts = q.attempts + 1, lease_until = now() + interval '30 s', claimed_by = 'w',
                   updated_at = now()
                 FROM c WHERE q.id = c.id RETURNING q.id)
      SELECT array_agg(id) INTO ids FROM u;
      -- The claim hands the payloads to the worker: read them by primary key.
      PERFORM count(e.payload) FROM outbox_event e WHERE e.id = ANY(ids);
      COMMIT;
      EXIT WHEN ids IS NULL;
      IF mode = 'split' THEN
        DELETE FROM outbox_queue WHERE id = ANY(ids);
      ELSE
        -- split-forget (retention zero on the split pair): the queue row and the event row go.
        WITH q AS (DELETE FROM outbox_queue WHERE id = ANY(ids) RETURNING id)
        DELETE FROM outbox_event WHERE id IN (SELECT id FROM q);
      END IF;
      COMMIT;
      n := n + cardinality(ids);
      CONTINUE;
    END IF;
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
for mode in ${MODES:-keep delete move split split-keep split-forget keep delete move split split-keep split-forget}; do
  $P -c "TRUNCATE outbox, outbox_history, outbox_event, outbox_queue, outbox_state" -c "INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload)
      SELECT gen_random_uuid(), 'k' || g, '\\x00', 'order_placed', 1, jsonb_build_object('order_id', g, 'total', 100) FROM generate_series(1, 50000) g" \
     -c "INSERT INTO outbox_event (event_id, operation_key, payload_fingerprint, event_type, event_version, payload)
      SELECT event_id, operation_key, payload_fingerprint, event_type, event_version, payload FROM outbox" \
     -c "INSERT INTO outbox_queue (id) SELECT id FROM outbox_event" \
     -c "INSERT INTO outbox_state (id, event_id) SELECT id, event_id FROM outbox_event" \
     -c "VACUUM ANALYZE outbox, outbox_event, outbox_queue, outbox_state" -c "CHECKPOINT"
  $P -c "CALL drain('$mode')"
  $P -Atc "SELECT mode || ': ' || secs || ' s, ' || wal_bytes_per_event || ' WAL bytes/event' FROM results ORDER BY ctid DESC LIMIT 1"
done
for mode in 'enqueue one table' 'enqueue split' 'enqueue split-keep' 'enqueue one table' 'enqueue split' 'enqueue split-keep'; do
  $P -c "TRUNCATE outbox, outbox_event, outbox_queue, outbox_state" -c "CHECKPOINT"
  $P -c "CALL enqueue('$mode', 20000)"
  $P -Atc "SELECT mode || ': ' || secs || ' s, ' || wal_bytes_per_event || ' WAL bytes/event' FROM results ORDER BY ctid DESC LIMIT 1"
done

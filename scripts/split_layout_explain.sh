#!/usr/bin/env bash
# A draft of every statement of the split layout (docs/split-layout.md), run on a realistic pair
# of tables and EXPLAINed, so the plan is checked against PostgreSQL before the store is
# rewritten: the same data as the EXPLAIN test of tests/store_schema.rs (200,000 delivered
# events, 10,000 pending of which 1,000 in aggregates, 1,000 processing of which half expired,
# 100 exhausted), ANALYZEd. Each statement runs under EXPLAIN (ANALYZE) in a transaction that is
# rolled back, so every plan sees the same rows. Prints each plan after a `--- name` line, then
# checks that no statement scans the event table whole (exit 1 and the offending lines
# otherwise).
#
#   scripts/split_layout_explain.sh     # needs psql and the server of the README (127.0.0.1:5432)
#
# Drops and recreates the database `split_layout`. The statements here are drafts: the store's
# own are still those of outbox-runtime/src/store/sql/ until the layout is adopted.
set -euo pipefail
cd "$(dirname "$0")/.."
DB=split_layout
psql -h 127.0.0.1 -U postgres -d postgres -qc "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB"
P="psql -h 127.0.0.1 -U postgres -d $DB -q -v ON_ERROR_STOP=1"

$P <<'SQL'
-- The event: written once by the enqueue, never updated; what every reader reads.
CREATE TABLE outbox (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id            uuid        NOT NULL UNIQUE,
    operation_key       text        NOT NULL,
    payload_fingerprint bytea       NOT NULL,
    event_type          text        NOT NULL,
    event_version       integer     NOT NULL CHECK (event_version >= 1),
    aggregate_type      text,
    aggregate_id        text,
    aggregate_version   bigint,
    payload             jsonb       NOT NULL,
    headers             jsonb       NOT NULL DEFAULT '{}',
    created_at          timestamptz NOT NULL DEFAULT now()
);
-- Insert-only, so created_at follows the physical order: a BRIN index finds the old pages.
CREATE INDEX outbox_created_brin ON outbox USING brin (created_at);

\i scripts/split_layout_queue.sql

-- 200,000 delivered events enqueued 8 days ago, then 11,100 open or exhausted ones.
INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version,
                    aggregate_type, aggregate_id, payload, created_at)
SELECT gen_random_uuid(), 'k' || g, '\x00', CASE WHEN g % 2 = 0 THEN 'note' ELSE 'order' END, 1,
       CASE WHEN g > 200000 AND g <= 201000 THEN 'order' END,
       CASE WHEN g > 200000 AND g <= 201000 THEN 'agg-' || (g % 100) END,
       jsonb_build_object('n', g, 'total', 100),
       now() - interval '8 days' + g * interval '1 ms'
FROM generate_series(1, 211100) g;
INSERT INTO outbox_queue (id, aggregate_type, aggregate_id, status, lease_until, claim_version,
                          attempts, exhausted_at, claimed_by)
SELECT id, aggregate_type, aggregate_id,
       CASE WHEN id <= 210000 THEN 'pending' WHEN id <= 211000 THEN 'processing' ELSE 'exhausted' END,
       CASE WHEN id > 210000 AND id <= 211000
            THEN now() + CASE WHEN id % 2 = 0 THEN interval '1 hour' ELSE interval '-1 minute' END END,
       CASE WHEN id > 210000 THEN 1 ELSE 0 END,
       CASE WHEN id > 210000 THEN 1 ELSE 0 END,
       CASE WHEN id > 211000 THEN now() END,
       CASE WHEN id > 210000 AND id <= 211000 THEN 'w' END
FROM outbox WHERE id > 200000;
VACUUM ANALYZE outbox, outbox_queue;
SQL

explain() {
  local name=$1 sql=$2
  echo "--- $name"
  $P -At -c "BEGIN" -c "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) $sql" -c "ROLLBACK"
  echo
}

IDS_CLAIMED="ARRAY(SELECT generate_series(210001, 210100))::bigint[]"
VERSIONS="array_fill(1::bigint, ARRAY[100])"

report=$(
explain enqueue "
WITH e AS (
    INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version,
                        aggregate_type, aggregate_id, aggregate_version, payload, headers)
    VALUES (gen_random_uuid(), 'new-key', '\\x00', 'note', 1, 'order', 'agg-1', 7, '{}', '{}')
    ON CONFLICT (event_id) DO NOTHING
    RETURNING id, aggregate_type, aggregate_id
)
INSERT INTO outbox_queue (id, aggregate_type, aggregate_id, max_attempts, available_at)
SELECT id, aggregate_type, aggregate_id, 10, now() FROM e"

explain claim_batch "
WITH candidates AS (
    SELECT id FROM outbox_queue
    WHERE exhausted_at IS NULL AND available_at <= now() AND status = 'pending'
    ORDER BY available_at, id
    LIMIT 100
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE outbox_queue AS q
    SET status = 'processing', lease_until = now() + interval '30 s', claimed_by = 'w',
        claim_version = q.claim_version + 1, attempts = q.attempts + 1, updated_at = now()
    WHERE q.id = ANY (ARRAY(SELECT id FROM candidates))
    RETURNING q.id, q.claim_version, q.attempts, q.max_attempts, q.lease_until, q.available_at
)
SELECT c.id, e.event_id, e.event_type, e.event_version, e.aggregate_type, e.aggregate_id,
       e.aggregate_version, e.payload, e.headers, c.claim_version, c.attempts, c.max_attempts,
       c.lease_until, greatest(extract(epoch FROM now() - c.available_at), 0)::float8,
       greatest(extract(epoch FROM now() - e.created_at), 0)::float8
FROM claimed AS c JOIN outbox AS e ON e.id = c.id"

explain claim_batch_ordered "
WITH candidates AS (
    SELECT o.id FROM outbox_queue AS o
    WHERE o.exhausted_at IS NULL AND o.available_at <= now() AND o.status = 'pending'
      AND (o.aggregate_id IS NULL OR NOT EXISTS (
            SELECT 1 FROM outbox_queue AS e
            WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id
              AND e.id < o.id AND e.exhausted_at IS NULL))
    ORDER BY o.available_at, o.id
    LIMIT 100
    FOR UPDATE OF o SKIP LOCKED
), claimed AS (
    UPDATE outbox_queue AS q
    SET status = 'processing', lease_until = now() + interval '30 s', claimed_by = 'w',
        claim_version = q.claim_version + 1, attempts = q.attempts + 1, updated_at = now()
    WHERE q.id = ANY (ARRAY(SELECT id FROM candidates))
    RETURNING q.id, q.claim_version
)
SELECT c.id, c.claim_version, e.payload FROM claimed AS c JOIN outbox AS e ON e.id = c.id"

explain complete_many "
DELETE FROM outbox_queue AS q
USING unnest($IDS_CLAIMED, $VERSIONS) AS c(id, claim_version)
WHERE q.id = c.id AND q.id = ANY ($IDS_CLAIMED) AND q.claim_version = c.claim_version
  AND (CASE WHEN q.status = 'processing' THEN q.lease_until > now() ELSE false END)
RETURNING q.id, q.claim_version"

explain complete_many_forget "
WITH q AS (
    DELETE FROM outbox_queue AS q
    USING unnest($IDS_CLAIMED, $VERSIONS) AS c(id, claim_version)
    WHERE q.id = c.id AND q.id = ANY ($IDS_CLAIMED) AND q.claim_version = c.claim_version
      AND (CASE WHEN q.status = 'processing' THEN q.lease_until > now() ELSE false END)
    RETURNING q.id, q.claim_version
), e AS (
    DELETE FROM outbox WHERE id IN (SELECT id FROM q)
)
SELECT id, claim_version FROM q"

explain completed_earlier "
SELECT c.id, c.claim_version
FROM unnest($IDS_CLAIMED, $VERSIONS) AS c(id, claim_version)
LEFT JOIN outbox_queue AS q ON q.id = c.id AND q.id = ANY ($IDS_CLAIMED)
WHERE q.id IS NULL"

explain renew_many "
UPDATE outbox_queue AS q
SET lease_until = now() + interval '30 s', updated_at = now()
FROM unnest($IDS_CLAIMED, $VERSIONS) AS c(id, claim_version)
WHERE q.id = c.id AND q.id = ANY ($IDS_CLAIMED) AND q.claim_version = c.claim_version
  AND (CASE WHEN q.status = 'processing' THEN q.lease_until > now() ELSE false END)
RETURNING q.id, q.claim_version"

explain fail "
UPDATE outbox_queue
SET status = CASE WHEN attempts >= max_attempts THEN 'exhausted' ELSE 'pending' END,
    available_at = now() + interval '1 s', lease_until = NULL,
    exhausted_at = CASE WHEN attempts >= max_attempts THEN now() END,
    handler_failures = handler_failures + 1, last_error = 'boom', updated_at = now()
WHERE id = 210002 AND claim_version = 1 AND status = 'processing' AND lease_until > now()
RETURNING status"

explain recover_expired "
WITH expired AS (
    SELECT id FROM outbox_queue
    WHERE exhausted_at IS NULL AND status = 'processing' AND lease_until <= now()
    ORDER BY available_at, id
    LIMIT 1000
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox_queue AS q
SET status = 'pending', lease_until = NULL, lease_expiries = q.lease_expiries + 1, updated_at = now()
WHERE q.id = ANY (ARRAY(SELECT id FROM expired))
RETURNING q.status"

explain purge_delivered "
DELETE FROM outbox
WHERE id = ANY (ARRAY(
    SELECT e.id FROM outbox AS e
    WHERE e.created_at < now() - interval '7 days'
      AND NOT EXISTS (SELECT 1 FROM outbox_queue AS q WHERE q.id = e.id)
    LIMIT 1000
    FOR UPDATE SKIP LOCKED
))"

explain purge_nothing_due "
DELETE FROM outbox
WHERE id = ANY (ARRAY(
    SELECT e.id FROM outbox AS e
    WHERE e.created_at < now() - interval '30 days'
      AND NOT EXISTS (SELECT 1 FROM outbox_queue AS q WHERE q.id = e.id)
    LIMIT 1000
    FOR UPDATE SKIP LOCKED
))"

explain gauges "
SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'processing'),
       (SELECT count(*) FROM outbox_queue WHERE exhausted_at IS NOT NULL)
FROM outbox_queue WHERE exhausted_at IS NULL"

explain retry_exhausted "
UPDATE outbox_queue AS q
SET status = 'pending', attempts = 0, available_at = now(), lease_until = NULL,
    exhausted_at = NULL, updated_at = now()
FROM outbox AS e
WHERE e.event_id = (SELECT event_id FROM outbox WHERE id = 211050)
  AND q.id = e.id AND q.exhausted_at IS NOT NULL"

explain retry_exhausted_of_type "
UPDATE outbox_queue AS q
SET status = 'pending', attempts = 0, available_at = now(), lease_until = NULL,
    exhausted_at = NULL, updated_at = now()
FROM outbox AS e
WHERE q.exhausted_at IS NOT NULL AND e.id = q.id AND e.event_type = 'note'"

explain list_events "
SELECT e.id, e.event_id, e.event_type, e.payload, coalesce(q.status, 'delivered') AS status,
       q.attempts
FROM outbox AS e LEFT JOIN outbox_queue AS q ON q.id = e.id
ORDER BY e.id
LIMIT 100"
)
echo "$report"

# No statement reads the whole event table, which grows with the delivered history. The queue
# table holds the open rows only, so reading it whole (recovery and the gauges, when the planner
# finds that cheaper) reads what today's statements read through the open index.
wrong=$(echo "$report" | grep -nE "Seq Scan on outbox( |$)" || true)
if [ -n "$wrong" ]; then
  echo "whole scans of the event table:" >&2
  echo "$wrong" >&2
  exit 1
fi
echo "no statement scans the event table"

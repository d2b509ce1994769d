-- Enqueue: write one event in the caller's transaction, in one round trip.
--
-- Parameters:
--   $1 event_id uuid            $2 operation_key text       $3 payload_fingerprint bytea
--   $4 event_type text          $5 event_version int        $6 aggregate_type text (null)
--   $7 aggregate_id text (null) $8 aggregate_version bigint (null)
--   $9 payload jsonb            $10 headers jsonb           $11 max_attempts int
--   $12 delay in microseconds (bigint, 0 = now)
--   $13 notification channel (text; null = no wake-up)
--
-- Returns one row (event_id, notified) when the row is new, and no row when the event id (so
-- the operation key) is already used: the caller then reads the stored row with
-- existing_by_key.sql, a second statement whose fresh snapshot also sees a row that another
-- transaction committed after this statement began. The duplicate path costs a round trip; the
-- common path is one plain INSERT (an earlier version also looked the existing row up in the
-- same statement, a CTE with a UNION ALL branch, and paid for it on every enqueue).
--
-- ON CONFLICT DO NOTHING: the event id is derived from the operation key, so the unique index on
-- event_id is the key's uniqueness, and a concurrent insert of the same key waits for the other
-- transaction and then does nothing: it never raises a unique violation that would abort the
-- caller's transaction.
--
-- pg_notify runs only when a row was inserted (RETURNING is evaluated per inserted row) and a
-- channel is given. PostgreSQL delivers it on commit and folds identical notifications of one
-- transaction into one, so a transaction wakes the workers once however many events it writes,
-- and a rolled-back transaction not at all.
--
-- Index: the unique index on event_id (conflict check).
INSERT INTO /* TEMPLATE: table */outbox
    (event_id, operation_key, payload_fingerprint, event_type, event_version,
     aggregate_type, aggregate_id, aggregate_version, payload, headers, max_attempts,
     available_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
        now() + $12::bigint * interval '1 microsecond')
ON CONFLICT DO NOTHING
RETURNING event_id,
          (SELECT count(*) FROM (SELECT pg_notify($13::text, '') WHERE $13::text IS NOT NULL) AS wake)
              AS notified

-- Enqueue: write one event in the caller's transaction, in one round trip.
--
-- Parameters:
--   $1 event_id uuid            $2 operation_key text       $3 payload_fingerprint bytea
--   $4 event_type text          $5 event_version int        $6 aggregate_type text (null)
--   $7 aggregate_id text (null) $8 aggregate_version bigint (null)
--   $9 payload jsonb            $10 headers jsonb           $11 max_attempts int
--   $12 delay in microseconds (bigint, 0 = now)
--
-- Inserts the event and its queue row, or neither when the event id (so the operation key) is
-- already used: the queue row is inserted from the event insert's RETURNING, which returns
-- nothing for a taken key. The caller tells the two apart by the rows affected (the queue
-- insert's), and on a duplicate reads the stored row with
-- existing_by_key.sql, a second statement whose fresh snapshot also sees a row that another
-- transaction committed after this statement began. The duplicate path costs a round trip; the
-- common path is one statement that returns no row to the client (returning a row cost ~5 % of
-- the business transaction's throughput, measured with pgbench).
--
-- ON CONFLICT (event_id) DO NOTHING: the event id is derived from the operation key, so the
-- unique index on event_id is the key's uniqueness, and a concurrent insert of the same key waits
-- for the other transaction and then does nothing: it never raises a unique violation on the
-- event id that would abort the caller's transaction. The conflict target is named so that only
-- the key is treated as a duplicate: a conflict on any other unique index (one an application
-- added to the table) raises its unique violation, which enqueue reports as a typed error,
-- instead of inserting nothing under a key that is still free. Under REPEATABLE READ or
-- SERIALIZABLE a key committed after the transaction's snapshot raises a serialization failure
-- (40001), which enqueue reports as "retry the transaction".
--
-- No wake-up here: enqueue_notify.sql appends the RETURNING clause that queues one.
-- Index: the unique index on event_id (conflict check); the queue's primary key.
WITH event AS (
    INSERT INTO /* TEMPLATE: table */outbox
        (event_id, operation_key, payload_fingerprint, event_type, event_version,
         aggregate_type, aggregate_id, aggregate_version, payload, headers)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
    ON CONFLICT (event_id) DO NOTHING
    RETURNING id, aggregate_type, aggregate_id
)
INSERT INTO /* TEMPLATE: table */outbox_queue
    (id, aggregate_type, aggregate_id, max_attempts, available_at)
SELECT id, aggregate_type, aggregate_id, $11::integer, now() + $12::bigint * interval '1 microsecond'
FROM event

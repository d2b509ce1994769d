-- Enqueue with a wake-up: enqueue.sql (same parameters, same result: the rows affected tell a
-- new row from a taken key) plus $13 the notification channel text.
--
-- The notification is queued by RETURNING, which PostgreSQL evaluates per inserted row only:
-- a taken key writes nothing and wakes nobody. PostgreSQL delivers the notification on commit,
-- folds identical notifications of one transaction into one (a transaction wakes the workers
-- once however many events it writes), and drops it on rollback. (An equivalent form that
-- queues the notification in a subquery the row is selected from measured ~40 % slower
-- through sqlx, though not through pgbench; RETURNING it is.)
--
-- Cost: a committing transaction that notifies holds a database-wide lock until its commit is
-- flushed, so notifying transactions commit one at a time (measured with pgbench, 4 clients:
-- ~20 % fewer business transactions per second than the same insert without it). Services
-- that enqueue at high rates use waker::Waker (coalesced notifications after commit) or polling.
-- Index: the unique index on event_id (conflict check).
INSERT INTO /* TEMPLATE: table */outbox
    (event_id, operation_key, payload_fingerprint, event_type, event_version,
     aggregate_type, aggregate_id, aggregate_version, payload, headers, max_attempts,
     available_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
        now() + $12::bigint * interval '1 microsecond')
ON CONFLICT DO NOTHING
RETURNING (SELECT pg_notify($13::text, '')) IS NULL AS notified

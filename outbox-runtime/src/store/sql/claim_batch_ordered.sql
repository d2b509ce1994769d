-- Ordered claim: like claim_batch.sql, but an event with an aggregate is only claimable when no
-- earlier (smaller id) event of the same aggregate is open (pending or processing), so the events of
-- one aggregate are delivered one after another, in id order.
--
-- Parameters: $1 limit bigint, $2 lease in microseconds bigint, $3 worker name text.
--
-- Exhausted events do NOT block later events of their aggregate: an operator must not have to
-- repair a poison event before the rest of the aggregate can move (retrying it later delivers it
-- out of order, which is the operator's call). Delivered events do not block either.
-- The check reads this statement's snapshot, which can only be older than the truth, so it errs
-- towards blocking.
--
-- Order is id order, and id order is commit order: ids are drawn at INSERT but become visible
-- at COMMIT, so this check alone would let a later event of an aggregate be claimed while an
-- earlier one is still uncommitted (and then deliver the earlier one after it, or while it is in
-- flight). The typed enqueue prevents that by taking lock_aggregate.sql, a transaction-scoped
-- advisory lock per aggregate, before the INSERT draws the id: per aggregate, a transaction can
-- only draw an id once every earlier holder has committed or rolled back, so no earlier id of an
-- aggregate becomes visible after a later one. Consequences: a transaction that enqueued an event
-- of aggregate A makes other producers of A wait at their enqueue until it ends (delivery of
-- other aggregates is unaffected, and no unrelated transaction ever stalls this claim);
-- transactions that enqueue events of several aggregates in different orders may deadlock
-- (SQLSTATE 40P01); rows inserted by raw SQL without the lock are ordered by id only.
-- See docs/ordering.md.
--
-- Two phases, so that no claim probes more than 2 * $1 + 64 blocked events however long an
-- aggregate's backlog is (the old single walk probed every one; docs/ordering.md, costs):
--   walked: the first 2 * $1 + 64 pending rows in (available_at, id) order (<table>_open_idx;
--     rows in flight are stepped over as in the plain claim and do not count), each checked for
--     an earlier open event of its aggregate (one probe of <table>_aggregate_idx per row). This
--     is the whole claim in the common case (many aggregates, few events each): the first $1
--     claimable rows are near the front.
--   heads: only when the walk found fewer than $1, the open head (smallest open id) of every
--     aggregate, enumerated by a loose index scan over <table>_aggregate_idx (one probe per open
--     aggregate, however many events wait behind each head), then a walk of <table>_open_idx
--     that takes the heads and the events without an aggregate. That walk still reads every open
--     row it passes, but only from the index and the heap (a hash lookup, no probe): measured
--     about 0.5 us per blocked row (100,000 of them: 50 ms), against 33 us for each probe the
--     old walk made. A blocked row is never a candidate in either phase.
-- When the walk found $1 events they are the first $1 claimable ones in order, which is what the
-- heads would give, so the gate `count < $1` only saves work. Candidates are locked by primary
-- key, then re-checked (status, availability) against the version a concurrent claim, fail or
-- completion committed after this statement's snapshot, as the plain claim's are.
--
-- Indexes: <table>_open_idx for both walks, <table>_aggregate_idx for the earlier-event check and
-- the loose index scan over aggregate heads, the primary key for the lock and the update.
-- The update finds the candidates by `id = ANY (ARRAY(...))`, not by joining them: a join lets
-- the planner hash the whole table when it expects a big batch (measured: a claim of 800 took
-- 40 ms through a hash join over 50,000 rows, 7 ms this way), while an array of ids can only be
-- looked up in the primary key.
WITH RECURSIVE walked AS MATERIALIZED (
    SELECT w.id
    FROM (
        SELECT o.id, o.available_at, o.aggregate_type, o.aggregate_id
        FROM /* TEMPLATE: table */outbox AS o
        WHERE o.delivered_at IS NULL AND o.exhausted_at IS NULL AND o.available_at <= now()
          AND o.status = 'pending'
        ORDER BY o.available_at, o.id
        LIMIT 2 * $1 + 64
    ) AS w
    WHERE (w.aggregate_id IS NULL OR NOT EXISTS (
            SELECT 1
            FROM /* TEMPLATE: table */outbox AS e
            WHERE e.aggregate_type = w.aggregate_type
              AND e.aggregate_id = w.aggregate_id
              AND e.id < w.id
              AND e.delivered_at IS NULL AND e.exhausted_at IS NULL))
    ORDER BY w.available_at, w.id
    LIMIT $1
), heads (aggregate_type, aggregate_id, id) AS (
    (SELECT e.aggregate_type, e.aggregate_id, e.id
     FROM /* TEMPLATE: table */outbox AS e
     WHERE e.delivered_at IS NULL AND e.exhausted_at IS NULL AND e.aggregate_id IS NOT NULL
     ORDER BY e.aggregate_type, e.aggregate_id, e.id
     LIMIT 1)
    UNION
    SELECT n.aggregate_type, n.aggregate_id, n.id
    FROM heads AS h
    CROSS JOIN LATERAL (
        SELECT e.aggregate_type, e.aggregate_id, e.id
        FROM /* TEMPLATE: table */outbox AS e
        WHERE e.delivered_at IS NULL AND e.exhausted_at IS NULL AND e.aggregate_id IS NOT NULL
          AND (e.aggregate_type, e.aggregate_id) > (h.aggregate_type, h.aggregate_id)
        ORDER BY e.aggregate_type, e.aggregate_id, e.id
        LIMIT 1
    ) AS n
), found AS (
    SELECT id FROM walked
    UNION ALL
    (SELECT o.id
     FROM /* TEMPLATE: table */outbox AS o
     WHERE o.delivered_at IS NULL AND o.exhausted_at IS NULL AND o.available_at <= now()
       AND o.status = 'pending'
       AND (o.aggregate_id IS NULL OR o.id IN (SELECT h.id FROM heads AS h))
       AND (SELECT count(*) FROM walked) < $1
     ORDER BY o.available_at, o.id
     LIMIT $1)
), candidates AS (
    SELECT o.id
    FROM /* TEMPLATE: table */outbox AS o
    WHERE o.id = ANY (ARRAY(SELECT id FROM found))
      AND o.delivered_at IS NULL AND o.exhausted_at IS NULL AND o.available_at <= now()
      AND o.status = 'pending'
    ORDER BY o.available_at, o.id
    LIMIT $1
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE /* TEMPLATE: table */outbox AS o
SET status = 'processing',
    lease_until = now() + $2::bigint * interval '1 microsecond',
    claimed_by = $3,
    claim_version = o.claim_version + 1,
    attempts = o.attempts + 1,
    updated_at = now()
WHERE o.id = ANY (ARRAY(SELECT id FROM candidates))
RETURNING o.id, o.event_id, o.event_type, o.event_version, o.aggregate_type, o.aggregate_id,
          o.aggregate_version, o.payload, o.headers, o.claim_version, o.attempts, o.max_attempts,
          o.lease_until

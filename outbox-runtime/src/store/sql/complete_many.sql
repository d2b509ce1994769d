-- Complete many: mark a batch of claimed events delivered in one statement.
--
-- Parameters: $1 ids bigint[], $2 claim_versions bigint[] (same length, pairwise).
-- Fenced per row like complete.sql. Returns the (id, claim_version) pairs that were completed;
-- every other claim of the batch was lost. Callers compare whole pairs, not ids: a batch may hold
-- a stale claim of a row next to a fresh claim of the same row, and only the fresh one matches.
-- Index: primary key (one scan over the ids, `o.id = ANY($1)`). Callers pass the pairs sorted
-- by id, so two batched statements over the same rows lock them in the same order (no deadlock).
UPDATE /* TEMPLATE: table */outbox AS o
SET status = 'delivered',
    -- Leaves the open index: the one index write of a completion besides the primary key and
    -- event_id (a non-HOT update, like the ceiling's).
    delivered_at = now(),
    lease_until = NULL,
    updated_at = now()
FROM unnest($1::bigint[], $2::bigint[]) AS c(id, claim_version)
WHERE o.id = c.id
  -- The pairs' ids, once more: implied by the join above, it is here for the planner, which
  -- then reaches the table by one primary-key scan over the batch's ids.
  AND o.id = ANY($1::bigint[])
  AND o.claim_version = c.claim_version
  -- The fence of the single statements (status processing and a live lease), spelled so the
  -- planner cannot estimate it. Statistics taken while every row was pending (after a burst
  -- of enqueues, with autovacuum off or late) put the processing rows at one; with the two
  -- plain predicates the planner then either scanned the table and joined every in-flight row
  -- against every pair (O(in-flight x batch): 5-9 s for 1,024 pairs), or, given the id probe,
  -- rescanned the pairs once per row it found (O(batch^2): 49 ms for 512 pairs, against 4 ms).
  -- Unestimated, the fence keeps half the probed rows in the planner's eyes, which makes it hash
  -- the pairs and probe once. tests/store_schema.rs checks the plans; no index predicate
  -- matches these columns.
  AND (CASE WHEN o.status = 'processing' THEN o.lease_until > now() ELSE false END)
RETURNING o.id, o.claim_version

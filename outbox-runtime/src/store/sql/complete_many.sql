-- Complete many: mark a batch of claimed events delivered in one statement, by deleting their
-- queue rows. The event rows stay (delivered history, the operation keys' protection) until the
-- purge removes them, retention after their enqueue.
--
-- Parameters: $1 ids bigint[], $2 claim_versions bigint[] (same length, pairwise).
-- Fenced per row like complete.sql. Returns the (id, claim_version) pairs that were completed;
-- every other claim of the batch was lost. Callers compare whole pairs, not ids: a batch may hold
-- a stale claim of a row next to a fresh claim of the same row, and only the fresh one matches.
--
-- Why a delete: it writes no index entry at all (it only marks the row version dead, and vacuum
-- reclaims it), where marking a wide row delivered wrote a new row version with its payload and
-- an entry in every index. This is what lets a completion that keeps the history cost what a
-- queue's delete costs (docs/split-layout.md).
-- Index: the queue's primary key (one scan over the ids, `q.id = ANY($1)`). Callers pass the
-- pairs sorted by id, so two batched statements over the same rows lock them in the same order
-- (no deadlock).
DELETE FROM /* TEMPLATE: table */outbox_queue AS q
USING unnest($1::bigint[], $2::bigint[]) AS c(id, claim_version)
WHERE q.id = c.id
  -- The pairs' ids, once more: implied by the join above, it is here for the planner, which
  -- then reaches the table by one primary-key scan over the batch's ids.
  AND q.id = ANY($1::bigint[])
  AND q.claim_version = c.claim_version
  -- The fence of the single statements (status processing and a live lease), spelled so the
  -- planner cannot estimate it. Statistics taken while every row was pending (after a burst
  -- of enqueues, with autovacuum off or late) put the processing rows at one; with the two
  -- plain predicates the planner then either scanned the table and joined every in-flight row
  -- against every pair (O(in-flight x batch): 5-9 s for 1,024 pairs), or, given the id probe,
  -- rescanned the pairs once per row it found (O(batch^2): 49 ms for 512 pairs, against 4 ms).
  -- Unestimated, the fence keeps half the probed rows in the planner's eyes, which makes it hash
  -- the pairs and probe once. tests/store_schema.rs checks the plans; no index predicate
  -- matches these columns.
  AND (CASE WHEN q.status = 'processing' THEN q.lease_until > now() ELSE false END)
RETURNING q.id, q.claim_version

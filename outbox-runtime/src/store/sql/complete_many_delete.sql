-- Complete many by deleting: remove a batch of claimed events in one statement, for workers
-- that keep no delivered history (retention zero).
--
-- Parameters: $1 ids bigint[], $2 claim_versions bigint[] (same length, pairwise).
-- Fenced per row exactly like complete_many.sql: a claim that was lost (recovered, re-claimed,
-- or its lease ran out) deletes nothing, and is reported lost. Returns the (id, claim_version)
-- pairs deleted (compared as whole pairs, like complete_many.sql).
--
-- Why a delete: marking a row delivered writes a new row version and a new entry in every
-- index (delivered_at sits in the index predicates, so that update cannot be heap-only), and
-- the purge later deletes it anyway. A delete writes no index entry at all: it only marks the
-- row version dead, and vacuum reclaims it. It also frees the operation key at once, so a
-- business command retried after delivery writes a new event (documented on
-- WorkerConfig::retention).
-- Index: primary key (one scan over the ids, `o.id = ANY($1)`). Callers pass the pairs sorted
-- by id, so two batched statements over the same rows lock them in the same order (no deadlock).
DELETE FROM /* TEMPLATE: table */outbox AS o
USING unnest($1::bigint[], $2::bigint[]) AS c(id, claim_version)
WHERE o.id = c.id
  -- The id probe and the unestimable fence below are spelled as in complete_many.sql, for
  -- the same reason: a plan that stale statistics cannot turn quadratic.
  AND o.id = ANY($1::bigint[])
  AND o.claim_version = c.claim_version
  AND (CASE WHEN o.status = 'processing' THEN o.lease_until > now() ELSE false END)
RETURNING o.id, o.claim_version

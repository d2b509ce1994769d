-- Completed earlier: which claims of a batch an earlier completion by the very same claim already
-- settled. For a completion whose answer was lost (the connection died after the statement was
-- sent, so it may have committed) and whose retry then reported these claims lost.
--
-- Parameters: $1 ids bigint[], $2 claim_versions bigint[] (same length, pairwise), $3 by_deleting
-- boolean (the worker completes by deleting its rows: retention zero).
-- Returns (id, claim_version) of each pair whose row is delivered under that very claim_version
-- (only that claim could have completed it: completion is fenced by claim_version, and a
-- delivered row is never claimed again), and, with $3, of each pair whose row is gone. Read-only.
-- Index: primary key, one scan over the ids (`o.id = ANY($1)`, implied by the join; and the
-- delivered test spelled so the planner cannot estimate it), whatever the statistics say: the
-- reasons are in complete_many.sql.
SELECT c.id, c.claim_version
FROM unnest($1::bigint[], $2::bigint[]) AS c(id, claim_version)
LEFT JOIN /* TEMPLATE: table */outbox AS o ON o.id = c.id AND o.id = ANY($1::bigint[])
WHERE (o.id IS NULL AND $3::boolean)
   OR CASE WHEN o.status = 'delivered' THEN o.claim_version = c.claim_version ELSE false END

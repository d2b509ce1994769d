-- Complete many and forget: complete a batch of claimed events in one statement and delete their
-- events too, for workers that keep no delivered history (retention zero).
--
-- Parameters: $1 ids bigint[], $2 claim_versions bigint[] (same length, pairwise).
-- Fenced per row exactly like complete_many.sql: a claim that was lost (recovered, re-claimed,
-- or its lease ran out) deletes nothing, neither its queue row nor its event, and is reported
-- lost. Returns the (id, claim_version) pairs completed (compared as whole pairs, like
-- complete_many.sql).
--
-- Deleting the event at once frees the operation key, so a business command retried after
-- delivery writes a new event (documented on WorkerConfig::retention), and leaves the purge
-- nothing to do.
-- Indexes: the queue's primary key (as complete_many.sql), then the event table's, one probe
-- per completed row.
WITH completed AS (
    DELETE FROM /* TEMPLATE: table */outbox_queue AS q
    USING unnest($1::bigint[], $2::bigint[]) AS c(id, claim_version)
    WHERE q.id = c.id
      -- The id probe and the unestimable fence are spelled as in complete_many.sql, for the
      -- same reason: a plan that stale statistics cannot turn quadratic.
      AND q.id = ANY($1::bigint[])
      AND q.claim_version = c.claim_version
      AND (CASE WHEN q.status = 'processing' THEN q.lease_until > now() ELSE false END)
    RETURNING q.id, q.claim_version
), forgotten AS (
    -- By an array of ids, so the event table can only be reached by its primary key.
    DELETE FROM /* TEMPLATE: table */outbox
    WHERE id = ANY (ARRAY(SELECT id FROM completed))
)
SELECT id, claim_version FROM completed

-- Completed earlier: which claims of a batch an earlier completion already settled. For a
-- completion whose answer was lost (the connection died after the statement was sent, so it may
-- have committed) and whose retry then reported these claims lost.
--
-- Parameters: $1 ids bigint[], $2 claim_versions bigint[] (same length, pairwise).
-- Returns (id, claim_version) of each pair whose queue row is gone: the event is delivered (a
-- queue row is only ever deleted by a fenced completion; the event's row may be kept or, with
-- retention zero, gone too). Which claim completed it cannot be told any more: this claim's
-- completion, or, when this claim's lease ran out first, another worker's. Either way the event
-- is delivered and nothing is overwritten. A queue row that is still there (pending, processing
-- under this or a later claim, exhausted) was not settled by this claim. Read-only.
-- Index: the queue's primary key, one scan over the ids (`q.id = ANY($1)`, implied by the join),
-- whatever the statistics say: the reasons are in complete_many.sql.
SELECT c.id, c.claim_version
FROM unnest($1::bigint[], $2::bigint[]) AS c(id, claim_version)
LEFT JOIN /* TEMPLATE: table */outbox_queue AS q ON q.id = c.id AND q.id = ANY($1::bigint[])
WHERE q.id IS NULL

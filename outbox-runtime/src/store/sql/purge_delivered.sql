-- Purge: delete up to $2 delivered events enqueued more than $1 ago (by the database clock).
--
-- Parameters: $1 retention in microseconds bigint, $2 limit bigint.
-- Delivered is an event without a queue row, and the retention counts from the enqueue
-- (created_at): the event table is never updated, so it keeps no delivery time. An event that
-- is still open or exhausted has its queue row and is never purged, however old.
-- Bounded so maintenance never holds many locks or writes a huge transaction at once. Purging an
-- event frees its operation key. No ORDER BY: which of the due events goes first does not
-- matter, and sorting them would cost a pass over all of them.
--
-- Why it cannot race an enqueue: a queue row is only inserted by the statement that inserts its
-- event, so an event without one is finished for good. The NOT EXISTS cannot see an uncommitted
-- queue row, but then it cannot see the uncommitted event either.
-- The ids are collected into an array so that the delete can only look them up in the primary
-- key (a join could hash the whole table).
-- Indexes: the event table's primary key or <table>_created_brin (created_at), whichever the
-- planner finds cheaper for the due rows, and the queue's primary key for the anti-join.
DELETE FROM /* TEMPLATE: table */outbox
WHERE id = ANY (ARRAY(
    SELECT e.id
    FROM /* TEMPLATE: table */outbox AS e
    WHERE e.created_at < now() - $1::bigint * interval '1 microsecond'
      AND NOT EXISTS (SELECT 1 FROM /* TEMPLATE: table */outbox_queue AS q WHERE q.id = e.id)
    LIMIT $2
    FOR UPDATE SKIP LOCKED
))

-- Purge: delete up to $2 delivered events delivered more than $1 ago (by the database clock).
--
-- Parameters: $1 retention in microseconds bigint, $2 limit bigint.
-- Bounded so maintenance never holds many locks or writes a huge transaction at once.
-- Purging a row frees its operation key. The ids are collected into an array so that the delete
-- can only look them up in the primary key (a join could hash the whole table).
-- Index: <table>_purge_idx (delivered_at) WHERE delivered_at IS NOT NULL.
DELETE FROM /* TEMPLATE: table */outbox
WHERE id = ANY (ARRAY(
    SELECT id
    FROM /* TEMPLATE: table */outbox
    WHERE delivered_at IS NOT NULL
      AND delivered_at < now() - $1::bigint * interval '1 microsecond'
    ORDER BY delivered_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
))

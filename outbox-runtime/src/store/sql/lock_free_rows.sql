-- Lock free rows: of a batch's rows, lock the ones no other transaction holds, skipping the
-- held ones instead of waiting for them, and say which is which.
--
-- Parameters: $1 ids bigint[]. Returns (id, free) for every row of the batch that exists: free
-- when this transaction now holds it (until its end), false when another transaction does.
-- An id it returns nothing for has no row any more. Run before a batched renewal
-- (renew_many.sql) in the same transaction, so the renewal names only rows it already holds:
-- a row another transaction keeps locked (a completion being written, an operator's
-- SELECT ... FOR UPDATE, a migration) then delays neither that renewal nor the other claims'
-- leases, and its own claim is asked about again at the next renewal.
-- Index: primary key (one probe per id, twice). SKIP LOCKED never waits, so the order of the
-- locks cannot deadlock; ORDER BY id keeps it the order every batched statement locks in.
WITH free AS (
    SELECT o.id
    FROM /* TEMPLATE: table */outbox_queue AS o
    WHERE o.id = ANY($1::bigint[])
    ORDER BY o.id
    FOR UPDATE SKIP LOCKED
)
-- A join, not `IN (SELECT ...)`: the planner rescanned the CTE once per row for that (a batch
-- of 512 would compare 512 x 512 ids).
SELECT o.id, f.id IS NOT NULL AS free
FROM /* TEMPLATE: table */outbox_queue AS o
LEFT JOIN free AS f ON f.id = o.id
WHERE o.id = ANY($1::bigint[])

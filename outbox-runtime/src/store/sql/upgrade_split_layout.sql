-- Upgrade an outbox table of the one-table layout (migrations/0001_outbox.sql) to the split
-- layout of create_table.sql: appended to create_queue_table.sql, which creates the queue table
-- first. Rendered for `outbox` as migrations/0004_split_layout.sql, and by the migration
-- generator for every table an earlier generated migration created (docs/split-layout.md).
--
-- Runs in the migration's transaction. The lock first: workers of the old version wait here,
-- then fail on their next statement (the columns they name are gone), loudly and with nothing
-- half-written.
LOCK TABLE /* TEMPLATE: table */outbox IN ACCESS EXCLUSIVE MODE;

-- The state of every event that is not delivered moves to the queue, as it is (a claim in flight
-- keeps its claim_version and lease, so its worker of the new version can still complete it).
INSERT INTO /* TEMPLATE: table */outbox_queue
    (id, aggregate_type, aggregate_id, status, available_at, lease_until, claimed_by,
     claim_version, attempts, max_attempts, lease_expiries, handler_failures, last_error,
     updated_at, exhausted_at)
SELECT id, aggregate_type, aggregate_id, status, available_at, lease_until, claimed_by,
       claim_version, attempts, max_attempts, lease_expiries, handler_failures, last_error,
       updated_at, exhausted_at
FROM /* TEMPLATE: table */outbox
WHERE delivered_at IS NULL;

-- A catalog change: the payloads are not rewritten (the dropped columns' space is reused as rows
-- are written, and the purge removes the old rows anyway). The indexes and CHECKs that read
-- these columns go with them. Delivered events enqueued more than the retention ago are purged
-- at the first purge after this: the retention now counts from the enqueue.
ALTER TABLE /* TEMPLATE: table */outbox
    DROP COLUMN status, DROP COLUMN available_at, DROP COLUMN lease_until,
    DROP COLUMN claimed_by, DROP COLUMN claim_version, DROP COLUMN attempts,
    DROP COLUMN max_attempts, DROP COLUMN lease_expiries, DROP COLUMN handler_failures,
    DROP COLUMN last_error, DROP COLUMN updated_at, DROP COLUMN delivered_at,
    DROP COLUMN exhausted_at;
-- Never updated from now on: new pages are filled.
ALTER TABLE /* TEMPLATE: table */outbox RESET (fillfactor);
CREATE INDEX IF NOT EXISTS /* TEMPLATE: table */outbox_created_brin
    ON /* TEMPLATE: table */outbox USING brin (created_at)
    -- Where autovacuum runs, it summarizes each range as it fills; the workers' maintenance
    -- vacuums the table past 10,000 inserts either way (worker/vacuum.rs).
    WITH (autosummarize = on);

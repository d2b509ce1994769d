-- An outbox table, its queue table (create_queue_table.sql, appended to this one) and the indexes
-- their statements need. Written once as a template, outbox-runtime/src/store/sql/, where the
-- table name is a visible placeholder (a TEMPLATE comment in front of the default name) replaced
-- by store::create_table_sql(table). The base schema reaches the same tables for `outbox` by
-- migrations/0001_outbox.sql (the old one-table layout) followed by migrations/0004_split_layout.sql
-- (upgrade_split_layout.sql rendered); a test (tests/store_schema.rs) checks that the two agree.
--
-- Two tables, so that finishing an event costs what a queue's delete costs (docs/split-layout.md):
--   * `outbox`, the event: written once by the enqueue and never updated. What every reader
--     reads, and what the operation key's uniqueness lives on.
--   * `outbox_queue`, the delivery state of every event that is not delivered. Delivered is an
--     event without a queue row: the completion deletes the queue row (no index entry written)
--     and the event stays until the purge, retention after its enqueue.
--
-- State machine (the queue row's status):
--   pending --claim--> processing --complete--> (queue row deleted: delivered) --purge--> (event deleted)
--   processing --fail / lease expired--> pending (available_at = now() + backoff)
--   processing --attempts used up / permanent failure--> exhausted --operator retry--> pending
--
-- Every time here comes from the database clock (now()); no statement takes a client timestamp.
--
-- Write amplification is the cost that decides throughput, so the hot updates of the queue are
-- HOT (heap-only: no index entry written). PostgreSQL makes an update HOT only when it changes no
-- column that any index uses, in its key or its predicate, and the new row version fits on the
-- same page. Hence:
--   * no index uses `status`, `lease_until`, `attempts`, `claim_version` or `updated_at`, the
--     columns that claim and renew change. The queue's indexes tell open rows from exhausted ones
--     by `exhausted_at`, which changes only when a row leaves the open set;
--   * fillfactor 50 on the queue leaves room on every page for the claim's new row version
--     (measured on 50,000 claims: 93 % HOT at 50, 44 % at 70, 11 % at 100). The event table is
--     never updated, so its pages are filled (the default fillfactor 100);
--   * one unique index, on event_id: the event id is derived from the operation key
--     (UUID v5 of table and key), so it carries the key's uniqueness in 16 bytes, and a second
--     unique index on the key text would double the cost of every insert.
CREATE TABLE IF NOT EXISTS /* TEMPLATE: table */outbox (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Stable id of the intention (UUID v5 of table and operation key): every retry of the business
    -- command and every delivery attempt carry the same id, so receivers deduplicate on it.
    -- Unique, and so the operation key is unique too, until the event is purged.
    event_id            uuid        NOT NULL UNIQUE,
    -- Names one intended business action (kept for operators; its uniqueness is event_id's).
    operation_key       text        NOT NULL,
    -- SHA-256 of (event_type, event_version, serialized payload): detects a key reused with a
    -- different payload.
    payload_fingerprint bytea       NOT NULL,
    event_type          text        NOT NULL,
    event_version       integer     NOT NULL CHECK (event_version >= 1),
    aggregate_type      text,
    aggregate_id        text,
    aggregate_version   bigint,
    payload             jsonb       NOT NULL,
    headers             jsonb       NOT NULL DEFAULT '{}',
    created_at          timestamptz NOT NULL DEFAULT now()
);

-- Purge: events enqueued before the retention window. The table is insert-only, so created_at
-- follows the physical order of its pages and a BRIN index (a few pages for millions of rows,
-- never touched by a completion) finds the old ones.
CREATE INDEX IF NOT EXISTS /* TEMPLATE: table */outbox_created_brin
    ON /* TEMPLATE: table */outbox USING brin (created_at)
    -- Where autovacuum runs, it summarizes each range as it fills; the workers' maintenance
    -- vacuums the table past 10,000 inserts either way (worker/vacuum.rs).
    WITH (autosummarize = on);

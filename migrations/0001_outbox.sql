-- An outbox table and the indexes its hot statements need. Written once as a template,
-- outbox-runtime/src/store/sql/create_table.sql, where the table name is a visible placeholder
-- (a TEMPLATE comment in front of the default name) replaced by store::create_table_sql(table).
-- migrations/0001_outbox.sql is that template rendered for the default table `outbox`; a test
-- (tests/store_schema.rs) checks that the two agree.
--
-- State machine (status):
--   pending --claim--> processing --complete--> delivered --purge--> (deleted)
--   processing --fail / lease expired--> pending (available_at = now() + backoff)
--   processing --attempts used up / permanent failure--> exhausted --operator retry--> pending
--
-- Every time here comes from the database clock (now()); no statement takes a client timestamp.
CREATE TABLE IF NOT EXISTS outbox (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Stable id of the intention (UUID v5 of table and operation key): every retry of the business
    -- command and every delivery attempt carry the same id, so receivers deduplicate on it.
    event_id            uuid        NOT NULL UNIQUE,
    -- Names one intended business action. Unique until the delivered row is purged.
    operation_key       text        NOT NULL UNIQUE,
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
    status              text        NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'processing', 'delivered', 'exhausted')),
    available_at        timestamptz NOT NULL DEFAULT now(),
    -- Live only while processing: the claim owns the row until then.
    lease_until         timestamptz,
    -- The worker that claimed the row last (kept after the claim ends, for diagnosis).
    claimed_by          text,
    -- Fencing token: +1 on every claim; every later change of the claim must present it.
    claim_version       bigint      NOT NULL DEFAULT 0,
    -- Charged at claim time, so a payload that crashes the worker still uses its attempts up.
    attempts            integer     NOT NULL DEFAULT 0,
    max_attempts        integer     NOT NULL DEFAULT 10 CHECK (max_attempts >= 1),
    -- Leases that ran out (a worker crashed or stalled) versus failures a handler reported
    -- (a receiver refused): an operator can tell a crashing worker from a failing receiver.
    lease_expiries      integer     NOT NULL DEFAULT 0,
    handler_failures    integer     NOT NULL DEFAULT 0,
    last_error          text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    delivered_at        timestamptz
);

-- Claim: the ready pending rows in (available_at, id) order. Partial, so delivered history
-- does not make the claim scan longer.
CREATE INDEX IF NOT EXISTS outbox_pending_idx
    ON outbox (available_at, id) WHERE status = 'pending';

-- Recovery: processing rows whose lease ran out.
CREATE INDEX IF NOT EXISTS outbox_lease_idx
    ON outbox (lease_until) WHERE status = 'processing';

-- Purge: delivered rows past retention, oldest first.
CREATE INDEX IF NOT EXISTS outbox_purge_idx
    ON outbox (delivered_at) WHERE status = 'delivered';

-- Ordered claim: is an earlier event of the same aggregate still pending or processing?
CREATE INDEX IF NOT EXISTS outbox_aggregate_idx
    ON outbox (aggregate_type, aggregate_id, id)
    WHERE status IN ('pending', 'processing') AND aggregate_id IS NOT NULL;

-- Operator view of exhausted rows (listing, retry by type, the exhausted gauge). Rows only
-- enter it when they become exhausted, so enqueue and the claim/complete path never write it.
CREATE INDEX IF NOT EXISTS outbox_exhausted_idx
    ON outbox (updated_at) WHERE status = 'exhausted';

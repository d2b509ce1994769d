-- The queue table of an outbox table: rendered after create_table.sql for a new table (store::
-- create_table_sql), and before upgrade_split_layout.sql when an existing one-table outbox is
-- upgraded. See create_table.sql for the layout and the state machine.
--
-- The delivery state of the events not delivered yet. id is the event's (one queue row per
-- event at most, inserted by the statement that inserts the event).
CREATE TABLE IF NOT EXISTS /* TEMPLATE: table */outbox_queue (
    id                  bigint      PRIMARY KEY,
    -- Copied from the event, for the ordered claim's earlier-event check.
    aggregate_type      text,
    aggregate_id        text,
    status              text        NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'processing', 'exhausted')),
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
    updated_at          timestamptz NOT NULL DEFAULT now(),
    -- Set exactly while the row is exhausted (the CHECK below): the indexes read it instead of
    -- `status`, which changes on every claim.
    exhausted_at        timestamptz,
    CHECK ((status = 'exhausted') = (exhausted_at IS NOT NULL))
) WITH (fillfactor = 50);

-- Claim: the open (pending or processing) rows in (available_at, id) order. Claimed rows stay
-- in it (a claim is a HOT update); the claim skips them by their status, and recovery finds
-- expired leases here.
CREATE INDEX IF NOT EXISTS /* TEMPLATE: table */outbox_queue_open_idx
    ON /* TEMPLATE: table */outbox_queue (available_at, id)
    WHERE exhausted_at IS NULL;

-- Ordered claim: is an earlier event of the same aggregate still open?
CREATE INDEX IF NOT EXISTS /* TEMPLATE: table */outbox_queue_aggregate_idx
    ON /* TEMPLATE: table */outbox_queue (aggregate_type, aggregate_id, id)
    WHERE exhausted_at IS NULL AND aggregate_id IS NOT NULL;

-- Operator view of exhausted rows (listing, retry by type, the exhausted gauge). Rows only
-- enter it when they become exhausted, so enqueue and the claim/complete path never write it.
CREATE INDEX IF NOT EXISTS /* TEMPLATE: table */outbox_queue_exhausted_idx
    ON /* TEMPLATE: table */outbox_queue (exhausted_at) WHERE exhausted_at IS NOT NULL;

-- The queue table of the planned split layout (docs/split-layout.md), shared by
-- scripts/split_layout_explain.sh and scripts/split_layout_upgrade.sh: a draft, which no
-- migration of the crate runs.
-- The delivery state of every event not delivered (pending, processing, exhausted).
CREATE TABLE outbox_queue (
    id               bigint      PRIMARY KEY,
    aggregate_type   text,
    aggregate_id     text,
    status           text        NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'processing', 'exhausted')),
    available_at     timestamptz NOT NULL DEFAULT now(),
    lease_until      timestamptz,
    claimed_by       text,
    claim_version    bigint      NOT NULL DEFAULT 0,
    attempts         integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL DEFAULT 10 CHECK (max_attempts >= 1),
    lease_expiries   integer     NOT NULL DEFAULT 0,
    handler_failures integer     NOT NULL DEFAULT 0,
    last_error       text,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    exhausted_at     timestamptz,
    CHECK ((status = 'exhausted') = (exhausted_at IS NOT NULL))
) WITH (fillfactor = 50);
CREATE INDEX outbox_queue_open_idx ON outbox_queue (available_at, id) WHERE exhausted_at IS NULL;
CREATE INDEX outbox_queue_aggregate_idx ON outbox_queue (aggregate_type, aggregate_id, id)
    WHERE exhausted_at IS NULL AND aggregate_id IS NOT NULL;
CREATE INDEX outbox_queue_exhausted_idx ON outbox_queue (exhausted_at) WHERE exhausted_at IS NOT NULL;

-- OWNER: issue 6. The consumer-side inbox (outbox_runtime::inbox).
--
-- One row per (consumer, event) a consumer has applied. The row is written inside the
-- consumer's own transaction, together with the effect of the event, so "applied" and
-- "recorded as applied" commit or roll back together. The primary key is what makes a second
-- delivery of the same event a no-op: `INSERT ... ON CONFLICT DO NOTHING` inserts nothing and
-- the consumer skips the effect.
CREATE TABLE outbox_inbox (
    -- Who applied the event: a service or handler name. Several consumers in one database each
    -- apply an event once.
    consumer    text        NOT NULL CHECK (length(consumer) BETWEEN 1 AND 200),
    -- The event id the publisher sent (the `Idempotency-Key` / `Nats-Msg-Id`).
    event_id    uuid        NOT NULL,
    -- Set by the database clock; retention (`inbox::purge`) deletes by it.
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- Retention deletes the oldest rows first, in bounded batches.
CREATE INDEX outbox_inbox_received_at_idx ON outbox_inbox (received_at);

-- Least-privilege grants on the consumer-side inbox (outbox_inbox) for {consumer}: the role a
-- consuming service connects as. `inbox::apply_once` inserts its record (ON CONFLICT DO NOTHING
-- reads the primary key), `inbox::is_applied` reads it, and `inbox::purge` deletes old rows by
-- received_at. The purge locks its batch first (FOR UPDATE SKIP LOCKED), which PostgreSQL allows
-- only with UPDATE on some column: granted on received_at alone, so a record's consumer and
-- event id can never be rewritten (an applied event cannot be made to look unapplied).
GRANT SELECT (consumer, event_id, received_at), INSERT (consumer, event_id),
      UPDATE (received_at), DELETE
    ON outbox_inbox TO {consumer};

-- The invariants of an outbox table that PostgreSQL keeps itself, whatever writes the tables:
-- appended to create_queue_table.sql for a new table (store::create_table_sql), and rendered on
-- its own by the upgrade of an existing one (store::upgrade_queue_invariants_sql,
-- migrations/0005_queue_invariants.sql for `outbox`). See docs/schema.md, "What the database
-- enforces".
--
-- Delivered means "an event with no queue row". Only our enqueue wrote the queue row, so an
-- event inserted any other way (another program's INSERT, a COPY, psql) read as delivered the
-- moment it committed, and was purged without ever being delivered; an operator's DELETE of an
-- event left a queue row that was claimed, and charged, until it was exhausted. Two rules close
-- both holes, enforced by the database for every writer:
--
-- 1. Every inserted event gets its queue row in the same statement. A statement-level AFTER
--    INSERT trigger reads the statement's new events (a transition table) and inserts the queue
--    row of each one that has none, with the queue table's defaults (pending now, 10 attempts).
--    The typed enqueue inserts its own queue row in the same statement (enqueue.sql: its
--    max_attempts and delay), which the trigger then finds and leaves alone: ON CONFLICT DO
--    NOTHING, so it needs no read privilege on the queue table (the enqueuer role may only
--    insert there, generate/sql/grants_enqueuer.sql). One trigger call per statement, not per
--    row: a COPY of a million events is one call. Measured on the enqueue statement (a
--    server-side loop of 5,000 in one transaction): about +8 us per statement, and no WAL. Per
--    business transaction it costs more (the trigger machinery is set up per transaction):
--    outbox-bench's enqueue kept 0.41-0.50 of the business rate with both rules against
--    0.78-0.88 without them, in two interleaved rounds on a loaded machine (docs/benchmarks.md);
--    a row-level trigger measured no cheaper.
--    The function is SECURITY INVOKER (the writer's own rights: a writer that may not insert
--    into the queue table may not insert events either) and resolves the queue table through
--    the search_path of the session that created it (SET search_path FROM CURRENT), so a
--    session whose search_path names another schema first cannot make it write another
--    service's queue table.
--
-- 2. A queue row cannot exist without its event: a foreign key from the queue row's id to the
--    event's, ON DELETE CASCADE, so deleting an event (the purge, an operator's DELETE) takes
--    its delivery state with it, and a queue row inserted for an id that has no event is
--    refused (SQLSTATE 23503). Cost: the key check of every queue insert, a primary-key probe of
--    the event just inserted, which also locks it FOR KEY SHARE (about +5 us and one 54-byte WAL
--    record per enqueue, measured as above). The claim, the renewals and the completions never
--    change the queue row's id, so they never run the check. TRUNCATE of the event table alone
--    is refused; truncate both (`TRUNCATE outbox, outbox_queue`).
--
-- A superuser can still bypass both (session_replication_role = replica, or ALTER TABLE ...
-- DISABLE TRIGGER), and tables upgraded from an earlier version keep what was written before:
-- `outbox doctor` finds the events and queue rows that break the rules and the tables whose
-- rules are off (docs/migrations-and-cli.md).
CREATE OR REPLACE FUNCTION outbox_queue_new_events() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO outbox_queue (id, aggregate_type, aggregate_id)
    SELECT id, aggregate_type, aggregate_id
    FROM new_events
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

-- Idempotent, as every statement of this file: the runtime's create_table runs it again on
-- every start.
DO $$
DECLARE
    -- Null while the table has no such key, then whether it is validated.
    key_validated boolean;
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_trigger
        WHERE tgrelid = 'outbox'::regclass
          AND tgname = 'outbox_queue_new_events'
    ) THEN
        CREATE TRIGGER outbox_queue_new_events
            AFTER INSERT ON outbox
            REFERENCING NEW TABLE AS new_events
            FOR EACH STATEMENT
            EXECUTE FUNCTION outbox_queue_new_events();
    END IF;
    -- Added NOT VALID, then validated only when every queue row has its event: a table upgraded
    -- from an earlier version may hold queue rows whose event an operator deleted, and they must
    -- not stop the upgrade. New rows are checked from the start either way; `outbox doctor`
    -- lists the old ones and `outbox doctor --repair` removes them and validates the key.
    SELECT convalidated INTO key_validated
    FROM pg_constraint
    WHERE conrelid = 'outbox_queue'::regclass
      AND conname = 'outbox_queue_event_fk';
    IF key_validated IS NULL THEN
        ALTER TABLE outbox_queue
            ADD CONSTRAINT outbox_queue_event_fk
            FOREIGN KEY (id) REFERENCES outbox (id) ON DELETE CASCADE
            NOT VALID;
        key_validated := false;
    END IF;
    IF NOT key_validated AND NOT EXISTS (
        SELECT 1 FROM outbox_queue AS q
        WHERE NOT EXISTS (SELECT 1 FROM outbox AS e WHERE e.id = q.id)
    ) THEN
        ALTER TABLE outbox_queue
            VALIDATE CONSTRAINT outbox_queue_event_fk;
    END IF;
END
$$;

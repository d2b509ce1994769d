-- The queue table of an outbox table: rendered after create_table.sql for a new table (store::
-- create_table_sql), and before upgrade_split_layout.sql when an existing one-table outbox is
-- upgraded. See create_table.sql for the layout and the state machine.
--
-- The delivery state of the events not delivered yet. id is the event's (one queue row per
-- event at most, inserted by the statement that inserts the event).
CREATE TABLE IF NOT EXISTS outbox_queue (
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
CREATE INDEX IF NOT EXISTS outbox_queue_open_idx
    ON outbox_queue (available_at, id)
    WHERE exhausted_at IS NULL;

-- Ordered claim: is an earlier event of the same aggregate still open?
CREATE INDEX IF NOT EXISTS outbox_queue_aggregate_idx
    ON outbox_queue (aggregate_type, aggregate_id, id)
    WHERE exhausted_at IS NULL AND aggregate_id IS NOT NULL;

-- Operator view of exhausted rows (listing, retry by type, the exhausted gauge). Rows only
-- enter it when they become exhausted, so enqueue and the claim/complete path never write it.
CREATE INDEX IF NOT EXISTS outbox_queue_exhausted_idx
    ON outbox_queue (exhausted_at) WHERE exhausted_at IS NOT NULL;

-- Upgrade an outbox table of the one-table layout (migrations/0001_outbox.sql) to the split
-- layout of create_table.sql: appended to create_queue_table.sql, which creates the queue table
-- first. Rendered for `outbox` as migrations/0004_split_layout.sql, and by the migration
-- generator for every table an earlier generated migration created (docs/split-layout.md).
--
-- Runs in the migration's transaction. The lock first: workers of the old version wait here,
-- then fail on their next statement (the columns they name are gone), loudly and with nothing
-- half-written.
LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE;

-- The state of every event that is not delivered moves to the queue, as it is (a claim in flight
-- keeps its claim_version and lease, so its worker of the new version can still complete it).
INSERT INTO outbox_queue
    (id, aggregate_type, aggregate_id, status, available_at, lease_until, claimed_by,
     claim_version, attempts, max_attempts, lease_expiries, handler_failures, last_error,
     updated_at, exhausted_at)
SELECT id, aggregate_type, aggregate_id, status, available_at, lease_until, claimed_by,
       claim_version, attempts, max_attempts, lease_expiries, handler_failures, last_error,
       updated_at, exhausted_at
FROM outbox
WHERE delivered_at IS NULL;

-- A catalog change: the payloads are not rewritten (the dropped columns' space is reused as rows
-- are written, and the purge removes the old rows anyway). The indexes and CHECKs that read
-- these columns go with them. Delivered events enqueued more than the retention ago are purged
-- at the first purge after this: the retention now counts from the enqueue.
ALTER TABLE outbox
    DROP COLUMN status, DROP COLUMN available_at, DROP COLUMN lease_until,
    DROP COLUMN claimed_by, DROP COLUMN claim_version, DROP COLUMN attempts,
    DROP COLUMN max_attempts, DROP COLUMN lease_expiries, DROP COLUMN handler_failures,
    DROP COLUMN last_error, DROP COLUMN updated_at, DROP COLUMN delivered_at,
    DROP COLUMN exhausted_at;
-- Never updated from now on: new pages are filled.
ALTER TABLE outbox RESET (fillfactor);
CREATE INDEX IF NOT EXISTS outbox_created_brin
    ON outbox USING brin (created_at)
    -- Where autovacuum runs, it summarizes each range as it fills; the workers' maintenance
    -- vacuums the table past 10,000 inserts either way (worker/vacuum.rs).
    WITH (autosummarize = on);

-- The roles `outbox grants` gave rights on outbox before its upgrade to the split layout get
-- the rights of the same role on the split tables, in the upgrade's transaction: an enqueue or
-- a worker of the new version never finds the queue table closed to it. Found by the rights
-- the earlier grants gave and the upgrade keeps: an enqueuer may INSERT the payload, a worker
-- may DELETE events (explicit grants only: not the owner, not PUBLIC).
DO $upgrade_grants$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT r.rolname
        FROM pg_class AS c
        JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attname = 'payload'
        CROSS JOIN LATERAL (SELECT * FROM aclexplode(a.attacl)
                            UNION ALL
                            SELECT * FROM aclexplode(c.relacl)) AS acl
        JOIN pg_roles AS r ON r.oid = acl.grantee
        WHERE c.oid = 'outbox'::regclass AND acl.privilege_type = 'INSERT' AND r.oid <> c.relowner
        ORDER BY 1
    LOOP
        EXECUTE replace($grants$GRANT INSERT (event_id, operation_key, payload_fingerprint, event_type, event_version,
              aggregate_type, aggregate_id, aggregate_version, payload, headers)
    ON outbox TO {enqueuer};
GRANT SELECT (id, event_id, operation_key, payload_fingerprint, aggregate_type, aggregate_id)
    ON outbox TO {enqueuer};
GRANT INSERT (id, aggregate_type, aggregate_id, max_attempts, available_at)
    ON outbox_queue TO {enqueuer};$grants$, '{enqueuer}', quote_ident(grantee));
    END LOOP;
    FOR grantee IN
        SELECT DISTINCT r.rolname
        FROM pg_class AS c
        CROSS JOIN LATERAL aclexplode(c.relacl) AS acl
        JOIN pg_roles AS r ON r.oid = acl.grantee
        WHERE c.oid = 'outbox'::regclass AND acl.privilege_type = 'DELETE' AND r.oid <> c.relowner
        ORDER BY 1
    LOOP
        EXECUTE replace($grants$GRANT SELECT, DELETE ON outbox TO {worker};
GRANT UPDATE (created_at) ON outbox TO {worker};
GRANT SELECT, DELETE ON outbox_queue TO {worker};
GRANT UPDATE (status, available_at, lease_until, claimed_by, claim_version, attempts,
              lease_expiries, handler_failures, last_error, updated_at, exhausted_at)
    ON outbox_queue TO {worker};$grants$, '{worker}', quote_ident(grantee));
    END LOOP;
END
$upgrade_grants$;

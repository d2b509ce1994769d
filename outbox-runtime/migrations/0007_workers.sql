-- The live workers of every outbox table and the events each of them claims, so that an event
-- nobody handles can be told from one that fails: `outbox status`, the dashboard and the
-- maintenance leader's `outbox_unhandled_events` gauge read it (store/sql/unhandled_events.sql).
--
-- Every worker writes its own row when it starts and again every maintenance interval (its
-- heartbeat, store/sql/worker_heartbeat.sql), and deletes it when it stops claiming
-- (worker_leave.sql). A worker that died leaves a row that counts until `expires_at` (three of
-- its intervals after its last heartbeat) and is deleted by the next heartbeat of any worker of
-- the table. Not per outbox table: a handful of rows per service, written every few seconds.
-- Workers of a library older than this table write nothing here (they claim every event).
CREATE TABLE IF NOT EXISTS outbox_workers (
    -- The outbox table the worker claims from.
    table_name   text        NOT NULL,
    -- The worker's name (`claimed_by` of its claims).
    worker       text        NOT NULL,
    -- The stored (event name, version) pairs it claims, as [{"name": ..., "version": n}, ...];
    -- NULL: every event (a publisher's worker).
    handles      jsonb,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    -- Until when the worker counts as live without another heartbeat.
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (table_name, worker)
);

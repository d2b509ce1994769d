-- Count delivered: the delivered rows still kept (not yet purged), for `Store::stats` and the
-- operator's `outbox status`. Everything else `Store::stats` reports comes from gauges.sql.
--
-- No parameters. Returns one row: (delivered bigint).
-- Index: <table>_purge_idx may be used, but delivered rows are most of the table (the whole
-- retention period), so the planner may well scan it: an operator query, never run by the
-- workers on a timer.
SELECT count(*) AS delivered
FROM /* TEMPLATE: table */outbox
WHERE delivered_at IS NOT NULL

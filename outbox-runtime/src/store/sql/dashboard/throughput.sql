-- Dashboard charts: events delivered per minute over the last hour and their enqueue-to-delivery
-- lag (delivered_at - created_at), median and 95th percentile, per minute.
--
-- No parameters. Returns 60 rows, oldest minute first: (minute timestamptz, delivered bigint,
-- lag_p50_seconds float8, lag_p95_seconds float8); a minute without deliveries has 0 and nulls.
-- Rows completed by deletion (retention zero) are gone and not counted.
-- Index: <table>_purge_idx (delivered_at) WHERE delivered_at IS NOT NULL, a range scan over the
-- last hour only.
WITH delivered AS (
    SELECT date_trunc('minute', delivered_at) AS minute,
           count(*) AS delivered,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM delivered_at - created_at))::float8 AS lag_p50_seconds,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM delivered_at - created_at))::float8 AS lag_p95_seconds
    FROM /* TEMPLATE: table */outbox
    WHERE delivered_at IS NOT NULL
      AND delivered_at >= date_trunc('minute', now()) - interval '59 minutes'
    GROUP BY 1
)
SELECT m.minute,
       coalesce(d.delivered, 0) AS delivered,
       d.lag_p50_seconds,
       d.lag_p95_seconds
FROM generate_series(date_trunc('minute', now()) - interval '59 minutes',
                     date_trunc('minute', now()),
                     interval '1 minute') AS m(minute)
LEFT JOIN delivered AS d ON d.minute = m.minute
ORDER BY m.minute

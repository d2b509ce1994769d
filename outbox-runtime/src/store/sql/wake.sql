-- Wake: notify the workers of a table, in a transaction of its own (autocommit).
--
-- Parameters: $1 the notification channel text (the table name, see store::notify_channel).
-- Sent by waker::Waker after the business transactions that enqueued without a notification
-- have committed. A notifying commit takes a database-wide lock until it is flushed; here only
-- this one-statement transaction takes it, not the business transactions.
SELECT pg_notify($1::text, '')

-- Lock wait: the longest the rest of this transaction waits for any one lock (PostgreSQL's
-- lock_timeout, for this transaction only). A statement that would wait longer fails with
-- SQLSTATE 55P03 (lock_not_available) and changes nothing.
--
-- Parameters: $1 the wait in milliseconds, as text (at least 1: 0 would mean "no limit").
SELECT set_config('lock_timeout', $1, true)

-- Make delayed events due: every pending event scheduled for later (an enqueue delay, or a
-- retry's backoff) becomes claimable now. For the test kit's `Drain::include_delayed`, which
-- lets a test deliver such events without waiting; not used by workers.
--
-- No parameters. Returns nothing; the row count is how many events were brought forward.
-- Only the schedule changes: attempts, claim_version and last_error stay as they were, so the
-- next claim is the one a worker would make once the delay had passed.
-- Index: <table>_queue_open_idx (available_at > now() on the open rows).
UPDATE /* TEMPLATE: table */outbox_queue
SET available_at = now(),
    updated_at = now()
WHERE exhausted_at IS NULL
  AND status = 'pending'
  AND available_at > now()

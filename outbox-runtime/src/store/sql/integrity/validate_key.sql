-- Doctor --repair: validate the foreign key from the queue row to its event once no orphan is
-- left (added NOT VALID by the upgrade of a table that had some). Scans the queue table under a
-- SHARE UPDATE EXCLUSIVE lock, which lets claims and completions go on.
ALTER TABLE /* TEMPLATE: table */outbox_queue
    VALIDATE CONSTRAINT /* TEMPLATE: table */outbox_queue_event_fk

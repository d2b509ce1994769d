-- Doctor: are the table's queue invariants (create_queue_invariants.sql) in place and on?
--
-- Parameters: none (the names are the template's). One row:
--   trigger        'missing', or pg_trigger.tgenabled of <table>_queue_new_events: 'O' fires in
--                  ordinary sessions (the default), 'D' disabled, 'R' only under
--                  session_replication_role = replica, 'A' always;
--   foreign_key    'missing', 'not valid' (added NOT VALID and not validated yet: rows from
--                  before it may break it), or 'valid';
--   key_disabled   whether a trigger that checks the foreign key is disabled (ALTER TABLE ...
--                  DISABLE TRIGGER ALL turns the key off without dropping it).
-- Index: the catalogs' own (by relation oid).
SELECT coalesce((SELECT t.tgenabled::text
                 FROM pg_trigger AS t
                 WHERE t.tgrelid = '/* TEMPLATE: table */outbox'::regclass
                   AND t.tgname = '/* TEMPLATE: table */outbox_queue_new_events'),
                'missing') AS trigger,
       coalesce((SELECT CASE WHEN c.convalidated THEN 'valid' ELSE 'not valid' END
                 FROM pg_constraint AS c
                 WHERE c.conrelid = '/* TEMPLATE: table */outbox_queue'::regclass
                   AND c.conname = '/* TEMPLATE: table */outbox_queue_event_fk'),
                'missing') AS foreign_key,
       EXISTS (SELECT 1
               FROM pg_constraint AS c
               JOIN pg_trigger AS t ON t.tgconstraint = c.oid
               WHERE c.conrelid = '/* TEMPLATE: table */outbox_queue'::regclass
                 AND c.conname = '/* TEMPLATE: table */outbox_queue_event_fk'
                 AND t.tgenabled = 'D') AS key_disabled

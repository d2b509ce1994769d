-- OWNER: issue 2. Base schema of the outbox.
SELECT 1;

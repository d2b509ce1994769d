-- The contract registry: one row per (event name, version) that a service's generated migration
-- (`outbox migrations generate`) has declared, with the fingerprint and shape of its payload.
--
-- Rows are written only by generated migrations (INSERT ... ON CONFLICT, so applying one twice
-- is harmless). Workers read it at start-up (`generate::verify_database_contracts`) and refuse
-- to run when a compiled contract's fingerprint differs from the registered one.
CREATE TABLE outbox_contracts (
    event_type    text        NOT NULL,
    event_version integer     NOT NULL CHECK (event_version >= 1),
    -- SHA-256 (lowercase hex) of the canonical payload shape.
    fingerprint   text        NOT NULL CHECK (fingerprint ~ '^[0-9a-f]{64}$'),
    -- The payload's JSON Schema, so a mismatch can be explained from the database alone.
    shape         jsonb       NOT NULL,
    -- The Rust type that defined the version when it was registered (for messages).
    type_name     text        NOT NULL,
    -- The outbox table the version is written to.
    table_name    text        NOT NULL DEFAULT 'outbox',
    registered_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_type, event_version)
);

-- A registered version keeps its fingerprint forever: stored rows were written in that shape.
-- A migration that tries to register another shape under the same version fails here, with a
-- message saying what to do, instead of silently replacing the contract.
CREATE FUNCTION outbox_contracts_keep_fingerprint() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.fingerprint <> OLD.fingerprint THEN
        RAISE EXCEPTION 'event % version % is already registered with fingerprint % (type %), not % (type %)',
            OLD.event_type, OLD.event_version, OLD.fingerprint, OLD.type_name, NEW.fingerprint, NEW.type_name
            USING HINT = 'a payload shape changed without a version bump: bump the event''s version, add an upcast from the old type, and generate the migrations again';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER outbox_contracts_keep_fingerprint
    BEFORE UPDATE ON outbox_contracts
    FOR EACH ROW EXECUTE FUNCTION outbox_contracts_keep_fingerprint();

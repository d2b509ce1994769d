-- outbox_enqueue(...): the supported way to enqueue an event from outside Rust (another
-- service, a SQL migration, psql), with the typed enqueue's guarantees: the event id derived
-- from the operation key (the same id the Rust side derives, so a receiver deduplicates both
-- alike), a taken key answered with the existing event or refused when the payload differs,
-- the per-aggregate producer lock, the event's queue row with its attempts and delay, and the
-- workers' wake-up at commit. See docs/sql-enqueue.md.
--
--   SELECT outbox_enqueue('outbox', 'place-order/42', 'order.placed', 1,
--                         '{"order_id": 42}', aggregate_type => 'order', aggregate_id => '42');
--
-- Every function here is SECURITY INVOKER: it runs with the caller's rights, so a role needs
-- the enqueuer's grants (`outbox grants`) and nothing more. Each resolves the names it uses
-- through the search_path of the migration that created it (SET search_path FROM CURRENT);
-- the outbox table itself is the caller's argument, resolved by the caller's search_path.

-- SHA-1 (FIPS 180-4) of `data`, for the UUID v5 below. PostgreSQL has no built-in SHA-1
-- (pgcrypto and uuid-ossp do, as extensions a service may not be allowed to create), and the
-- event id must be the one `store::enqueue::event_id_for` derives. Not used for any security
-- purpose: a name-based UUID is all it makes. tests/store_sql_enqueue.rs compares it with the
-- Rust derivation over keys of every length around the 64-byte block boundaries.
CREATE OR REPLACE FUNCTION outbox_sha1(data bytea) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path FROM CURRENT
AS $$
DECLARE
    mask constant bigint := 4294967295;
    h0 bigint := 1732584193;   -- 0x67452301
    h1 bigint := 4023233417;   -- 0xEFCDAB89
    h2 bigint := 2562383102;   -- 0x98BADCFE
    h3 bigint := 271733878;    -- 0x10325476
    h4 bigint := 3285377520;   -- 0xC3D2E1F0
    message bytea;
    w bigint[];
    a bigint; b bigint; c bigint; d bigint; e bigint; f bigint; k bigint; t bigint;
    base integer;
BEGIN
    -- Padding: a 1 bit, zeros up to 56 bytes into the last block, the bit length (64 bits).
    message := data || '\x80'::bytea
        || decode(repeat('00', (119 - length(data) % 64) % 64), 'hex')
        || int8send(length(data)::bigint * 8);
    FOR block IN 0 .. length(message) / 64 - 1 LOOP
        w := array_fill(0::bigint, ARRAY[80]);
        FOR i IN 0 .. 15 LOOP
            base := block * 64 + i * 4;
            w[i + 1] := (get_byte(message, base)::bigint << 24)
                | (get_byte(message, base + 1)::bigint << 16)
                | (get_byte(message, base + 2)::bigint << 8)
                | get_byte(message, base + 3)::bigint;
        END LOOP;
        FOR i IN 16 .. 79 LOOP
            t := w[i - 2] # w[i - 7] # w[i - 13] # w[i - 15];
            w[i + 1] := ((t << 1) | (t >> 31)) & mask;
        END LOOP;
        a := h0; b := h1; c := h2; d := h3; e := h4;
        FOR i IN 0 .. 79 LOOP
            IF i < 20 THEN
                f := (b & c) | (~b & mask & d); k := 1518500249;   -- 0x5A827999
            ELSIF i < 40 THEN
                f := b # c # d; k := 1859775393;                   -- 0x6ED9EBA1
            ELSIF i < 60 THEN
                f := (b & c) | (b & d) | (c & d); k := 2400959708; -- 0x8F1BBCDC
            ELSE
                f := b # c # d; k := 3395469782;                   -- 0xCA62C1D6
            END IF;
            t := ((((a << 5) | (a >> 27)) & mask) + f + e + k + w[i + 1]) & mask;
            e := d;
            d := c;
            c := ((b << 30) | (b >> 2)) & mask;
            b := a;
            a := t;
        END LOOP;
        h0 := (h0 + a) & mask;
        h1 := (h1 + b) & mask;
        h2 := (h2 + c) & mask;
        h3 := (h3 + d) & mask;
        h4 := (h4 + e) & mask;
    END LOOP;
    RETURN substring(int8send(h0) FROM 5) || substring(int8send(h1) FROM 5)
        || substring(int8send(h2) FROM 5) || substring(int8send(h3) FROM 5)
        || substring(int8send(h4) FROM 5);
END
$$;

-- The event id of the intention `operation_key` in the outbox table named `table_name`
-- (unqualified, as the Rust event names it): UUID v5 (RFC 9562) of "table/key" in the
-- library's namespace 6f1c2a9e-5b3d-4c8f-9e07-d1a4b2c6e835, exactly store::enqueue::event_id_for.
CREATE OR REPLACE FUNCTION outbox_event_id(table_name text, operation_key text) RETURNS uuid
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path FROM CURRENT
AS $$
DECLARE
    hash bytea := outbox_sha1(decode('6f1c2a9e5b3d4c8f9e07d1a4b2c6e835', 'hex')
                              || convert_to(table_name || '/' || operation_key, 'UTF8'));
BEGIN
    hash := set_byte(hash, 6, (get_byte(hash, 6) & 15) | 80);    -- version 5
    hash := set_byte(hash, 8, (get_byte(hash, 8) & 63) | 128);   -- RFC 9562 variant
    RETURN encode(substring(hash FROM 1 FOR 16), 'hex')::uuid;
END
$$;

-- Enqueue one event into `outbox_table` in the caller's transaction and return its event id.
--
-- A taken operation key returns the event already written under it when type, version and
-- payload are the same, and raises SQLSTATE 23505 (unique_violation) otherwise, naming the key
-- and the existing event: the caller's transaction is then aborted (a PL/pgSQL caller can catch
-- it in an EXCEPTION block). The payload is compared by this function's own fingerprint of the
-- jsonb value, which is not the Rust enqueue's canonical one: a key the Rust side wrote first
-- is always reported as reused with a different payload. Give SQL producers keys of their own.
--
-- With aggregate_id, the events of one aggregate are ordered: the function takes the same
-- transaction-scoped lock as the typed enqueue (store/sql/lock_aggregate.sql) before the row's
-- id is drawn, and an aggregate without a type is grouped under the event type, as in Rust. An
-- aggregate_type without aggregate_id is ignored (nothing to order), as in Rust.
CREATE OR REPLACE FUNCTION outbox_enqueue(
    outbox_table regclass,
    operation_key text,
    event_type text,
    event_version integer,
    payload jsonb,
    aggregate_type text DEFAULT NULL,
    aggregate_id text DEFAULT NULL,
    aggregate_version bigint DEFAULT NULL,
    headers jsonb DEFAULT '{}',
    max_attempts integer DEFAULT 10,
    delay interval DEFAULT '0 seconds',
    notify boolean DEFAULT true
) RETURNS uuid
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    table_name text;
    schema_name text;
    queue regclass;
    new_event_id uuid;
    fingerprint bytea;
    stored_fingerprint bytea;
    inserted bigint;
    name_rule constant text := '^[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)*$';
BEGIN
    IF outbox_table IS NULL THEN
        RAISE EXCEPTION 'outbox_enqueue: outbox_table is null'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass the outbox table, for example outbox_enqueue(''outbox'', ...)';
    END IF;
    SELECT c.relname, n.nspname INTO table_name, schema_name
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.oid = outbox_table;
    queue := to_regclass(format('%I.%I', schema_name, table_name || '_queue'));
    IF queue IS NULL THEN
        RAISE EXCEPTION 'outbox_enqueue: % is not an outbox table (it has no queue table %)',
            outbox_table, format('%I.%I', schema_name, table_name || '_queue')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'create outbox tables with the migrations `outbox migrations generate` writes';
    END IF;
    IF operation_key IS NULL OR operation_key = '' OR octet_length(operation_key) > 1024 THEN
        RAISE EXCEPTION 'outbox_enqueue: the operation key must be 1 to 1024 bytes, got %',
            coalesce(octet_length(operation_key)::text || ' bytes', 'null')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'name the business action, for example ''place-order/42''';
    END IF;
    IF event_type IS NULL OR length(event_type) > 128 OR event_type !~ name_rule THEN
        RAISE EXCEPTION 'outbox_enqueue: event type % is not a valid event name', quote_nullable(event_type)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = '1 to 128 characters: lowercase ASCII letters, digits, _ and -, in parts separated by single dots (for example order.confirmed)';
    END IF;
    IF aggregate_type IS NOT NULL AND (length(aggregate_type) > 128 OR aggregate_type !~ name_rule) THEN
        RAISE EXCEPTION 'outbox_enqueue: aggregate type % is not a valid name', quote_literal(aggregate_type)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'aggregate types follow the event name rule (for example order)';
    END IF;
    IF event_version IS NULL OR event_version < 1 THEN
        RAISE EXCEPTION 'outbox_enqueue: event version must be 1 or more, got %', quote_nullable(event_version)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF payload IS NULL THEN
        RAISE EXCEPTION 'outbox_enqueue: the payload is null'
            USING ERRCODE = 'invalid_parameter_value', HINT = 'pass a jsonb value, for example ''{}''';
    END IF;
    -- The typed enqueue's default limit (EnqueueOptions::max_payload_bytes): the workers read
    -- every payload whole, so one oversized row must not reach them.
    IF octet_length(payload::text) > 262144 THEN
        RAISE EXCEPTION 'outbox_enqueue: the payload is % bytes, over the limit of 262144', octet_length(payload::text)
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'store the large content elsewhere and put its reference in the event';
    END IF;
    IF headers IS NULL OR jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'outbox_enqueue: headers must be a jsonb object'
            USING ERRCODE = 'invalid_parameter_value', HINT = 'pass ''{}'' for none';
    END IF;
    IF max_attempts IS NULL OR max_attempts < 1 THEN
        RAISE EXCEPTION 'outbox_enqueue: max_attempts must be 1 or more, got %', quote_nullable(max_attempts)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF delay IS NULL OR delay < interval '0' THEN
        RAISE EXCEPTION 'outbox_enqueue: delay must be zero or more, got %', quote_nullable(delay)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF aggregate_id IS NULL THEN
        aggregate_type := NULL;
    ELSE
        aggregate_type := coalesce(aggregate_type, event_type);
        -- lock_aggregate.sql, with the table's oid as the seed.
        PERFORM pg_advisory_xact_lock(hashtextextended(
            length(aggregate_type)::text || ':' || aggregate_type || aggregate_id,
            outbox_table::oid::bigint));
    END IF;

    new_event_id := outbox_event_id(table_name, operation_key);
    fingerprint := sha256(convert_to(
        'outbox sql enqueue fingerprint v1' || chr(10) || event_type || chr(10)
            || event_version::text || chr(10) || payload::text,
        'UTF8'));
    EXECUTE format(
        'WITH event AS (
             INSERT INTO %s (event_id, operation_key, payload_fingerprint, event_type,
                             event_version, aggregate_type, aggregate_id, aggregate_version,
                             payload, headers)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
             ON CONFLICT (event_id) DO NOTHING
             RETURNING id, aggregate_type, aggregate_id
         )
         INSERT INTO %s (id, aggregate_type, aggregate_id, max_attempts, available_at)
         SELECT id, aggregate_type, aggregate_id, $11, now() + $12 FROM event
         RETURNING id',
        outbox_table, queue)
    INTO inserted
    USING new_event_id, operation_key, fingerprint, event_type, event_version, aggregate_type,
          aggregate_id, aggregate_version, payload, headers, max_attempts, delay;
    IF inserted IS NOT NULL THEN
        IF notify THEN
            -- store::notify_channel: the table's name. Delivered at commit, dropped on rollback.
            PERFORM pg_notify(table_name, '');
        END IF;
        RETURN new_event_id;
    END IF;

    -- The key is taken. This statement's snapshot is newer than the insert's, so it sees an
    -- event another transaction committed meanwhile.
    EXECUTE format('SELECT payload_fingerprint FROM %s WHERE event_id = $1', outbox_table)
    INTO stored_fingerprint USING new_event_id;
    IF stored_fingerprint IS NULL THEN
        RAISE EXCEPTION 'outbox_enqueue: the event of operation key % was deleted while this enqueue ran', quote_literal(operation_key)
            USING ERRCODE = 'serialization_failure', HINT = 'retry the transaction';
    ELSIF stored_fingerprint <> fingerprint THEN
        RAISE EXCEPTION 'outbox_enqueue: operation key % is already used by event % with another type, version or payload',
            quote_literal(operation_key), new_event_id
            USING ERRCODE = 'unique_violation',
                  HINT = 'an operation key names one business action: use a new key for a different event';
    END IF;
    RETURN new_event_id;
END
$$;

//! The generated SQL against a real PostgreSQL: it applies with sqlx's migrator next to the
//! base schema, creates the tables and indexes it names, upgrades the tables an earlier
//! generator created in the one-table layout, fills the contract registry, and the start-up
//! check agrees with it until a contract drifts. Hostile names never reach the
//! database, and hostile free text (type names, shapes) is stored as data.

mod generate_support;

use generate_support::*;
use outbox_runtime::generate::{
    CompiledEvent, ContractLock, GenerateError, LOCK_FILE, LOCK_FORMAT, check_migrations,
    compare_registry, generate_migrations, registry_rows, verify_contracts,
};
use outbox_runtime::store::{Claim, EventStatus, Ownership};
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::{Error, Event, Store};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::Row;

/// The indexes of an outbox table `shipping_outbox` in the split layout, on both its tables.
const SPLIT_LAYOUT_INDEXES: [&str; 7] = [
    "shipping_outbox_created_brin",
    "shipping_outbox_event_id_key",
    "shipping_outbox_pkey",
    "shipping_outbox_queue_aggregate_idx",
    "shipping_outbox_queue_exhausted_idx",
    "shipping_outbox_queue_open_idx",
    "shipping_outbox_queue_pkey",
];

/// The indexes of `table` and of its queue table, sorted by name.
async fn indexes_of(db: &TestDatabase, table: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes WHERE tablename IN ($1, $1 || '_queue') ORDER BY 1",
    )
    .bind(table)
    .fetch_all(db.pool())
    .await
    .unwrap()
}

async fn apply_folder(db: &TestDatabase, dir: &TempDir) {
    let migrator = sqlx::migrate::Migrator::new(dir.path())
        .await
        .expect("sqlx reads the generated folder");
    migrator
        .run(db.pool())
        .await
        .expect("the generated migrations apply");
}

#[tokio::test]
async fn generated_migrations_apply_and_create_what_they_declare() {
    let db = TestDatabase::new().await;
    let dir = TempDir::new();
    // A service's own migration first, as in a real folder: both go through sqlx's default
    // `_sqlx_migrations`, the base schema through its own table.
    dir.write(
        "0001_orders.sql",
        "CREATE TABLE orders (id bigint PRIMARY KEY);\n",
    );
    generate_migrations(dir.path(), &[order_confirmed_v1(), shipment_sent()]).unwrap();
    apply_folder(&db, &dir).await;

    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    for expected in [
        "orders",
        "outbox",
        "outbox_contracts",
        "shipping_outbox",
        "shipping_outbox_queue",
    ] {
        assert!(
            tables.iter().any(|t| t == expected),
            "{expected} missing from {tables:?}"
        );
    }
    assert_eq!(
        indexes_of(&db, "shipping_outbox").await,
        SPLIT_LAYOUT_INDEXES,
        "a new table is created in the split layout"
    );

    let rows = sqlx::query(
        "SELECT event_type, event_version, fingerprint, type_name, table_name, shape FROM outbox_contracts ORDER BY 1, 2",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(rows.len(), 2);
    let first = &rows[0];
    assert_eq!(first.get::<String, _>("event_type"), "order.confirmed");
    assert_eq!(first.get::<i32, _>("event_version"), 1);
    assert_eq!(
        first.get::<String, _>("fingerprint"),
        order_confirmed_v1().contract.fingerprint()
    );
    assert_eq!(
        first.get::<String, _>("type_name"),
        "shop::OrderConfirmedV1"
    );
    assert_eq!(first.get::<String, _>("table_name"), "outbox");
    assert_eq!(
        first.get::<serde_json::Value, _>("shape"),
        order_confirmed_v1_shape()
    );
    assert_eq!(rows[1].get::<String, _>("table_name"), "shipping_outbox");

    // The start-up check agrees.
    let compiled = [order_confirmed_v1().contract, shipment_sent().contract];
    let comparison = verify_contracts(db.pool(), &compiled).await.unwrap();
    assert!(comparison.mismatched.is_empty() && comparison.unregistered.is_empty());

    // A new version: a second migration, applied on top.
    generate_migrations(
        dir.path(),
        &[order_confirmed_v1(), order_confirmed_v2(), shipment_sent()],
    )
    .unwrap();
    apply_folder(&db, &dir).await;
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_contracts")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(count, 3);

    // The base schema can be applied again: the two migrators do not see each other's rows.
    outbox_runtime::migrate(db.pool())
        .await
        .expect("base schema re-applies next to the service's migrations");
}

#[tokio::test]
async fn applying_a_generated_migration_twice_is_harmless() {
    let db = TestDatabase::new().await;
    let dir = TempDir::new();
    generate_migrations(dir.path(), &[order_confirmed_v1(), shipment_sent()]).unwrap();
    let sql = dir.read("0001_outbox_events.sql");
    for _ in 0..2 {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
            .execute(db.pool())
            .await
            .expect("re-applies");
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_contracts")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(count, 2);
}

#[tokio::test]
async fn the_registry_refuses_another_shape_under_a_registered_version() {
    let db = TestDatabase::new().await;
    let dir = TempDir::new();
    generate_migrations(dir.path(), &[order_confirmed_v1()]).unwrap();
    apply_folder(&db, &dir).await;

    // Another service (or a hand-edited lock) generates a different shape under version 1.
    let other = TempDir::new();
    let mut changed = order_confirmed_v1();
    changed.contract.shape["properties"]["total_cents"] = json!({"type": "string"});
    generate_migrations(other.path(), &[changed]).unwrap();
    let err = sqlx::raw_sql(sqlx::AssertSqlSafe(other.read("0001_outbox_events.sql")))
        .execute(db.pool())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("event order.confirmed version 1 is already registered with fingerprint"),
        "{text}"
    );
    let fingerprint: String = sqlx::query_scalar(
        "SELECT fingerprint FROM outbox_contracts WHERE event_type = 'order.confirmed'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        fingerprint,
        order_confirmed_v1().contract.fingerprint(),
        "the registered contract is unchanged"
    );
}

#[tokio::test]
async fn the_startup_check_refuses_a_drifted_contract() {
    let db = TestDatabase::new().await;
    let dir = TempDir::new();
    generate_migrations(dir.path(), &[order_confirmed_v1(), shipment_sent()]).unwrap();
    apply_folder(&db, &dir).await;

    // The binary now compiles order.confirmed v1 with another shape (nobody regenerated).
    let mut drifted = order_confirmed_v1().contract;
    drifted.shape["properties"]["total_cents"] = json!({"type": "string"});
    drifted.type_name = "shop::OrderConfirmedEdited";
    let err = verify_contracts(db.pool(), &[drifted.clone(), shipment_sent().contract])
        .await
        .unwrap_err();
    let Error::ContractMismatch(message) = &err else {
        panic!("expected ContractMismatch, got {err}")
    };
    for expected in [
        "event `order.confirmed` version 1 is registered in the database with fingerprint",
        "(type `shop::OrderConfirmedV1`)",
        "(type `shop::OrderConfirmedEdited`)",
        "Refusing to start",
        "bump the version",
    ] {
        assert!(
            message.contains(expected),
            "missing `{expected}` in: {message}"
        );
    }

    // A compiled version the registry does not hold is allowed (documented), and so is a
    // registered one the binary dropped; both are reported.
    let comparison = verify_contracts(db.pool(), &[order_confirmed_v2().contract])
        .await
        .unwrap();
    assert_eq!(comparison.unregistered, [("order.confirmed".to_owned(), 2)]);
    assert_eq!(
        comparison.not_compiled,
        [
            ("order.confirmed".to_owned(), 1),
            ("shipment.sent".to_owned(), 1)
        ]
    );

    // The pure comparison says the same as the database one.
    let rows = registry_rows(db.pool()).await.unwrap();
    assert_eq!(compare_registry(&[drifted], &rows).mismatched.len(), 1);
}

#[tokio::test]
async fn the_startup_check_passes_on_an_empty_registry_and_explains_a_missing_one() {
    let db = TestDatabase::new().await;
    // No generated migration applied: everything is unregistered, nothing mismatches.
    outbox_runtime::generate::verify_database_contracts(db.pool())
        .await
        .expect("an empty registry is accepted");

    let empty = TestDatabase::empty(2).await;
    let err = outbox_runtime::generate::verify_database_contracts(empty.pool())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("`outbox_contracts` does not exist: apply the base schema first"),
        "{err}"
    );
}

/// A `victim` table with one row, for the hostile-name tests.
async fn create_victim(db: &TestDatabase) {
    sqlx::raw_sql("CREATE TABLE victim (id int PRIMARY KEY); INSERT INTO victim VALUES (1);")
        .execute(db.pool())
        .await
        .unwrap();
}

async fn victim_survives(db: &TestDatabase) -> bool {
    sqlx::query_scalar::<_, Option<String>>("SELECT to_regclass('victim')::text")
        .fetch_one(db.pool())
        .await
        .unwrap()
        .is_some()
}

#[tokio::test]
async fn a_hostile_event_name_never_reaches_the_database() {
    let db = TestDatabase::new().await;
    create_victim(&db).await;
    for name in hostile_texts() {
        let dir = TempDir::new();
        let hostile = event(
            leak(name.clone()),
            1,
            "outbox",
            "shop::OrderConfirmed",
            order_confirmed_v1_shape(),
        );
        let result = generate_migrations(dir.path(), &[hostile]);
        if result.is_ok() {
            // What `outbox migrate` would do with what was written.
            let migrator = sqlx::migrate::Migrator::new(dir.path()).await.unwrap();
            let applied = migrator.run(db.pool()).await;
            assert!(
                victim_survives(&db).await,
                "the migration generated for event name {name:?} dropped the victim table (apply: {applied:?})"
            );
        }
        let err = result.expect_err("a hostile event name is refused");
        assert!(
            matches!(err, GenerateError::InvalidEventName { .. }),
            "{name:?}: {err}"
        );
        assert!(dir.names().is_empty());
    }
    assert!(victim_survives(&db).await);
}

#[tokio::test]
async fn hostile_type_names_and_shapes_are_applied_as_data() {
    let db = TestDatabase::new().await;
    create_victim(&db).await;
    let dir = TempDir::new();
    // Free text (not a name): type names and field names of every hostile kind, NUL aside
    // (PostgreSQL cannot store it; the generator refuses it).
    let cases: Vec<(String, String, serde_json::Value)> = hostile_texts()
        .into_iter()
        .filter(|t| !t.contains('\0'))
        .enumerate()
        .map(|(i, text)| {
            let shape = json!({
                "type": "object",
                "properties": {text.clone(): {"type": "string", "format": text.clone()}},
                "required": [text.clone()],
            });
            (format!("hostile.case{i}"), text, shape)
        })
        .collect();
    let events: Vec<_> = cases
        .iter()
        .map(|(name, text, shape)| {
            event(
                leak(name.clone()),
                1,
                "outbox",
                leak(text.clone()),
                shape.clone(),
            )
        })
        .collect();
    generate_migrations(dir.path(), &events).unwrap();

    // Applied on a connection that reads backslashes in plain strings as escapes: literals
    // must mean the same text under either setting of standard_conforming_strings.
    let mut conn = db.pool().acquire().await.unwrap();
    sqlx::query("SET standard_conforming_strings = off")
        .execute(&mut *conn)
        .await
        .unwrap();
    let migrator = sqlx::migrate::Migrator::new(dir.path()).await.unwrap();
    let applied = migrator.run(&mut *conn).await;
    drop(conn);
    assert!(victim_survives(&db).await, "the victim table was dropped");
    applied.expect("the generated migration applies");

    for (name, text, shape) in &cases {
        let row = sqlx::query(
            "SELECT fingerprint, type_name, shape FROM outbox_contracts WHERE event_type = $1 AND event_version = 1",
        )
        .bind(name)
        .fetch_one(db.pool())
        .await
        .unwrap_or_else(|e| panic!("{name} ({text:?}) is registered: {e}"));
        assert_eq!(&row.get::<String, _>("type_name"), text, "{name}");
        assert_eq!(&row.get::<serde_json::Value, _>("shape"), shape, "{name}");
    }
    let compiled: Vec<_> = events.iter().map(|e| e.contract.clone()).collect();
    let comparison = verify_contracts(db.pool(), &compiled).await.unwrap();
    assert!(
        comparison.mismatched.is_empty() && comparison.unregistered.is_empty(),
        "{comparison:?}"
    );
    let lock = outbox_runtime::generate::ContractLock::parse(
        &dir.read(outbox_runtime::generate::LOCK_FILE),
    )
    .expect("the lock reads back");
    for (name, text, shape) in &cases {
        let locked = lock.contract(name, 1).expect("locked");
        assert_eq!((&locked.type_name, &locked.shape), (text, shape));
    }
}

#[tokio::test]
async fn the_startup_check_refuses_a_registry_row_with_a_hostile_name() {
    let db = TestDatabase::new().await;
    sqlx::query(
        "INSERT INTO outbox_contracts (event_type, event_version, fingerprint, type_name, table_name, shape) \
         VALUES ($1, 1, repeat('a', 64), 't', 'outbox', '{}')",
    )
    .bind("x\nDROP TABLE victim; --")
    .execute(db.pool())
    .await
    .unwrap();
    let err = verify_contracts(db.pool(), &[order_confirmed_v1().contract])
        .await
        .unwrap_err();
    let Error::ContractMismatch(message) = &err else {
        panic!("expected ContractMismatch, got {err}")
    };
    assert!(
        message.contains("holds version 1 of an event whose name cannot be used: \"x\\nDROP TABLE victim; --\" is not a valid event name"),
        "{message}"
    );
    assert!(!message.contains('\n'), "{message}");
}

/// The grants `outbox grants` printed for an outbox table before the split layout (the
/// registry's have not changed).
fn earlier_grants(table: &str, enqueuer: &str, worker: &str) -> String {
    format!(
        "GRANT INSERT (event_id, operation_key, payload_fingerprint, event_type, event_version,
                       aggregate_type, aggregate_id, aggregate_version, payload, headers, max_attempts,
                       available_at)
             ON {table} TO {enqueuer};
         GRANT SELECT (event_id, operation_key, payload_fingerprint) ON {table} TO {enqueuer};
         GRANT SELECT, DELETE ON {table} TO {worker};
         GRANT UPDATE (status, available_at, lease_until, claimed_by, claim_version, attempts,
                       lease_expiries, handler_failures, last_error, updated_at, delivered_at,
                       exhausted_at)
             ON {table} TO {worker};
         GRANT SELECT ON outbox_contracts TO {worker};
         GRANT SELECT (event_type, event_version, fingerprint, type_name) ON outbox_contracts TO {enqueuer};"
    )
}

/// An event written to `shipping_outbox`, to enqueue into the upgraded table through the
/// library (a name of its own: the registry holds `shipment.sent` with a hand-built shape).
#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "shipment.relabelled", version = 1, table = "shipping_outbox")]
struct Relabelled {
    tracking: String,
}

/// The DDL the generator wrote for a new outbox table before the split layout: the base
/// schema's `migrations/0001_outbox.sql` (that template rendered for `outbox`), without its
/// comments and with the table renamed.
fn one_table_layout_ddl(table: &str) -> String {
    include_str!("../outbox-runtime/migrations/0001_outbox.sql")
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .map(|line| line.replace("outbox", table))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A migrations folder as the generator left it before the split layout, for `events`, one of
/// which names `shipping_outbox`: its migration created that table in the one-table layout and
/// registered the contracts, and its lock (format 1) lists the table and the migration's
/// SHA-256.
async fn one_table_layout_folder(db: &TestDatabase, events: &[CompiledEvent]) -> TempDir {
    let dir = TempDir::new();
    generate_migrations(dir.path(), events).unwrap();
    // Today's migration with the table's DDL as the earlier generator wrote it: the header, the
    // section's comment and the contract rows are what it wrote too.
    let file = "0001_outbox_events.sql";
    let sql = dir.read(file);
    let section = sql
        .find("\n-- ==== Outbox table shipping_outbox, written by:")
        .expect("the table's section");
    let ddl_start = section + sql[section..].find("====\n\n").unwrap() + "====\n\n".len();
    let ddl_end = sql
        .find("\n-- ==== Contract registry")
        .expect("the contracts' section");
    let old = format!(
        "{}{}\n{}",
        &sql[..ddl_start],
        one_table_layout_ddl("shipping_outbox"),
        &sql[ddl_end..]
    );
    as_an_earlier_generator_wrote_it(db, &dir, file, &old, 1).await;
    dir
}

/// Replace the folder's first migration by `sql` and its lock's record of it, with the lock's
/// format `format`: the folder as an earlier generator left it.
async fn as_an_earlier_generator_wrote_it(
    db: &TestDatabase,
    dir: &TempDir,
    file: &str,
    sql: &str,
    format: u32,
) {
    dir.write(file, sql);
    let sha256: String = sqlx::query_scalar("SELECT encode(sha256(convert_to($1, 'UTF8')), 'hex')")
        .bind(sql)
        .fetch_one(db.pool())
        .await
        .unwrap();
    let mut lock = ContractLock::parse(&dir.read(LOCK_FILE)).unwrap();
    lock.format = format;
    lock.migrations[0].sha256 = sha256;
    dir.write(LOCK_FILE, &lock.render());
}

/// Events of `shipping_outbox` in the one-table layout in each state, as the earlier version's
/// statements left them: pending (in an aggregate), processing (a claim in flight, version 1),
/// delivered an hour ago but enqueued ten days ago, and exhausted.
const ONE_TABLE_LAYOUT_EVENTS: &str = "
INSERT INTO shipping_outbox (event_id, operation_key, payload_fingerprint, event_type, event_version,
                             aggregate_type, aggregate_id, payload, headers)
VALUES ('00000000-0000-0000-0000-000000000001', 'pending', '\\x01', 'shipment.sent', 1,
        'shipment', 's-1', '{\"tracking\": \"T-pending\", \"note\": \"caf\u{e9} \u{1F4E6}\"}', '{\"trace\": \"a\"}');
INSERT INTO shipping_outbox (event_id, operation_key, payload_fingerprint, event_type, event_version,
                             payload, status, lease_until, claimed_by, claim_version, attempts)
VALUES ('00000000-0000-0000-0000-000000000002', 'processing', '\\x02', 'shipment.sent', 1,
        '{\"tracking\": \"T-processing\"}', 'processing', now() + interval '1 hour', 'old-worker', 1, 1);
INSERT INTO shipping_outbox (event_id, operation_key, payload_fingerprint, event_type, event_version,
                             payload, status, claimed_by, claim_version, attempts, created_at,
                             delivered_at)
VALUES ('00000000-0000-0000-0000-000000000003', 'delivered', '\\x03', 'shipment.sent', 1,
        '{\"tracking\": \"T-delivered\"}', 'delivered', 'old-worker', 1, 1, now() - interval '10 days',
        now() - interval '1 hour');
INSERT INTO shipping_outbox (event_id, operation_key, payload_fingerprint, event_type, event_version,
                             payload, status, claimed_by, claim_version, attempts, max_attempts,
                             handler_failures, last_error, exhausted_at)
VALUES ('00000000-0000-0000-0000-000000000004', 'exhausted', '\\x04', 'shipment.sent', 1,
        '{\"tracking\": \"T-exhausted\"}', 'exhausted', 'old-worker', 3, 3, 3, 3, 'receiver said 422',
        now());
";

fn event_id(n: u8) -> uuid::Uuid {
    uuid::Uuid::from_u128(u128::from(n))
}

/// Every row of the query, each as its record's text: compared as they are, byte for byte.
async fn rows_as_text(db: &TestDatabase, query: &'static str) -> Vec<String> {
    sqlx::query_scalar(query)
        .fetch_all(db.pool())
        .await
        .unwrap()
}

/// The event columns of every event of `shipping_outbox`, payloads included.
const EVENTS: &str = "SELECT row(id, event_id, operation_key, payload_fingerprint, event_type, event_version, \
                      aggregate_type, aggregate_id, aggregate_version, payload, headers, created_at)::text \
                      FROM shipping_outbox ORDER BY id";
/// The delivery state, in the one table before the upgrade (of the events not delivered).
const STATE_BEFORE: &str = "SELECT row(id, aggregate_type, aggregate_id, status, available_at, lease_until, claimed_by, \
                            claim_version, attempts, max_attempts, lease_expiries, handler_failures, last_error, \
                            updated_at, exhausted_at)::text \
                            FROM shipping_outbox WHERE delivered_at IS NULL ORDER BY id";
/// The same state in the queue table after it.
const STATE_AFTER: &str = "SELECT row(id, aggregate_type, aggregate_id, status, available_at, lease_until, claimed_by, \
                           claim_version, attempts, max_attempts, lease_expiries, handler_failures, last_error, \
                           updated_at, exhausted_at)::text \
                           FROM shipping_outbox_queue ORDER BY id";

/// The columns (name, type, nullability, default) and storage options of `table`, for
/// comparing two tables' layouts.
async fn layout_of(db: &TestDatabase, table: &str) -> (Vec<String>, Option<Vec<String>>) {
    let columns = sqlx::query_scalar(
        "SELECT concat_ws(' ', column_name, data_type, is_nullable, column_default, is_identity)
         FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position",
    )
    .bind(table)
    .fetch_all(db.pool())
    .await
    .unwrap();
    let options = sqlx::query_scalar("SELECT reloptions::text[] FROM pg_class WHERE relname = $1")
        .bind(table)
        .fetch_one(db.pool())
        .await
        .unwrap();
    (columns, options)
}

/// A service whose earlier generator created `shipping_outbox` in the one-table layout: the
/// next generation writes one migration that upgrades it, and no more after that; applied, it
/// keeps every event and payload and the state of every event not delivered, and leaves the
/// layout a new table gets, which the library then works on.
#[tokio::test]
async fn a_table_of_the_one_table_layout_is_upgraded_once_and_keeps_its_events() {
    let db = TestDatabase::new().await;
    let events = [order_confirmed_v1(), shipment_sent()];
    let dir = one_table_layout_folder(&db, &events).await;
    apply_folder(&db, &dir).await;
    assert!(
        indexes_of(&db, "shipping_outbox")
            .await
            .contains(&"shipping_outbox_open_idx".to_owned()),
        "the fixture creates the one-table layout"
    );
    sqlx::raw_sql(ONE_TABLE_LAYOUT_EVENTS)
        .execute(db.pool())
        .await
        .unwrap();
    // An enqueuer and a worker role with the grants `outbox grants` printed before.
    let roles = Roles::create(&db).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(earlier_grants(
        "shipping_outbox",
        &roles.enqueuer,
        &roles.worker,
    )))
    .execute(db.pool())
    .await
    .unwrap();
    let events_before = rows_as_text(&db, EVENTS).await;
    let state_before = rows_as_text(&db, STATE_BEFORE).await;
    assert_eq!((events_before.len(), state_before.len()), (4, 3));

    // The next generation upgrades the table, and only that: nothing else is due.
    let out = generate_migrations(dir.path(), &events).unwrap();
    assert_eq!(
        out.written_migration.as_deref(),
        Some("0002_outbox_events.sql")
    );
    let upgrade = dir.read("0002_outbox_events.sql");
    assert!(
        upgrade.contains("-- Upgrades outbox tables to the split layout: shipping_outbox\n"),
        "{upgrade}"
    );
    assert!(
        upgrade.contains("-- ==== Outbox table shipping_outbox: upgrade to the split layout (shipping_outbox_queue) ====")
            && upgrade.contains("DO $upgrade_grants$"),
        "{upgrade}"
    );
    assert!(
        !upgrade.contains("-- Creates") && !upgrade.contains("INSERT INTO outbox_contracts"),
        "{upgrade}"
    );
    let lock = ContractLock::parse(&dir.read(LOCK_FILE)).unwrap();
    assert_eq!(
        (lock.format, lock.tables.as_slice()),
        (LOCK_FORMAT, ["shipping_outbox".to_owned()].as_slice())
    );

    // Stable: the table is upgraded once.
    let files = dir.files();
    let again = generate_migrations(dir.path(), &events).unwrap();
    assert_eq!((again.written_migration, again.lock_written), (None, false));
    assert_eq!(dir.files(), files, "a second run writes nothing");
    assert!(
        check_migrations(dir.path(), &events)
            .unwrap()
            .is_up_to_date()
    );

    // Applied by sqlx's migrator (in its transaction) on the database that holds the events.
    apply_folder(&db, &dir).await;
    assert_eq!(
        rows_as_text(&db, EVENTS).await,
        events_before,
        "every event is kept, its payload byte for byte"
    );
    assert_eq!(
        rows_as_text(&db, STATE_AFTER).await,
        state_before,
        "the queue holds exactly the state of the events not delivered"
    );
    assert_eq!(
        indexes_of(&db, "shipping_outbox").await,
        SPLIT_LAYOUT_INDEXES
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(
        outbox_runtime::store::create_table_sql("fresh_outbox").unwrap(),
    ))
    .execute(db.pool())
    .await
    .unwrap();
    for (upgraded, fresh) in [
        ("shipping_outbox", "fresh_outbox"),
        ("shipping_outbox_queue", "fresh_outbox_queue"),
    ] {
        assert_eq!(
            layout_of(&db, upgraded).await,
            layout_of(&db, fresh).await,
            "{upgraded} has the layout a new table gets"
        );
    }

    // A worker of the earlier version stops at its first statement, on a dropped column.
    let old_completion = sqlx::query(
        "UPDATE shipping_outbox SET status = 'delivered', delivered_at = now() WHERE event_id = $1",
    )
    .bind(event_id(2))
    .execute(db.pool())
    .await
    .unwrap_err();
    assert_eq!(
        old_completion
            .as_database_error()
            .and_then(|e| e.code())
            .as_deref(),
        Some("42703"),
        "{old_completion}"
    );

    // The library works on the upgraded table, as the roles whose grants the upgrade carried
    // over: every event where it stood, the claim in flight still completes, an enqueue goes
    // through, a pending event is claimed with its payload.
    let crossed: (bool, bool) = sqlx::query_as(
        "SELECT has_any_column_privilege($1, 'shipping_outbox_queue', 'INSERT'),
                has_any_column_privilege($2, 'shipping_outbox_queue', 'SELECT, UPDATE')",
    )
    .bind(&roles.worker)
    .bind(&roles.enqueuer)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(crossed, (false, false), "each role got its own grants only");
    let worker = pool_as(&db, &roles.worker).await;
    let enqueuer = pool_as(&db, &roles.enqueuer).await;
    let store = Store::for_table(worker.clone(), "shipping_outbox").unwrap();
    let mut statuses = Vec::new();
    for n in 1..=4 {
        statuses.push(store.event_status(event_id(n)).await.unwrap());
    }
    assert_eq!(
        statuses,
        [
            Some(EventStatus::Pending),
            Some(EventStatus::Processing),
            Some(EventStatus::Delivered),
            Some(EventStatus::Exhausted)
        ]
    );
    let in_flight: i64 = sqlx::query_scalar("SELECT id FROM shipping_outbox WHERE event_id = $1")
        .bind(event_id(2))
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(
        store
            .complete_if_owned(Claim {
                id: in_flight,
                claim_version: 1
            })
            .await
            .unwrap(),
        Ownership::Owned
    );
    let mut tx = enqueuer.begin().await.unwrap();
    let enqueued = Relabelled {
        tracking: "T-new".into(),
    }
    .enqueue(&mut tx, "relabel-1")
    .await
    .expect("the enqueuer may enqueue into the upgraded table");
    tx.commit().await.unwrap();
    let mut claimed = store
        .claim_batch("new-worker", 10, std::time::Duration::from_secs(30), true)
        .await
        .unwrap();
    claimed.sort_by_key(|c| c.id);
    assert_eq!(
        claimed.iter().map(|c| c.event_id).collect::<Vec<_>>(),
        [event_id(1), enqueued]
    );
    assert_eq!(
        claimed[0].payload,
        json!({"tracking": "T-pending", "note": "caf\u{e9} \u{1F4E6}"})
    );
    // The retention counts from the enqueue now: delivered an hour ago, enqueued ten days ago,
    // the event goes with the first purge of a seven-day retention (the delivered one of the
    // two; the other delivered event is recent).
    assert_eq!(
        store
            .purge_delivered(std::time::Duration::from_secs(7 * 24 * 3600), 10)
            .await
            .unwrap(),
        1
    );
    assert_eq!(store.event_status(event_id(3)).await.unwrap(), None);
    enqueuer.close().await;
    worker.close().await;
    roles.drop_all(&db).await;

    // A database deployed from scratch applies the old migration and its upgrade in a row.
    let fresh = TestDatabase::new().await;
    apply_folder(&fresh, &dir).await;
    assert_eq!(
        indexes_of(&fresh, "shipping_outbox").await,
        SPLIT_LAYOUT_INDEXES
    );
}

/// A migrations folder as the generator left it before the queue invariants: its migration
/// created `shipping_outbox` in the split layout without the trigger and the foreign key, and
/// its lock (format 2) lists the table and the migration's SHA-256.
async fn split_layout_folder_without_invariants(
    db: &TestDatabase,
    events: &[CompiledEvent],
) -> TempDir {
    let dir = TempDir::new();
    generate_migrations(dir.path(), events).unwrap();
    let file = "0001_outbox_events.sql";
    let sql = dir.read(file);
    let invariants_start = sql
        .find("-- The invariants of an outbox table that PostgreSQL keeps itself")
        .expect("the table's invariants");
    let contracts = sql
        .find("\n-- ==== Contract registry")
        .expect("the contracts' section");
    let old = format!("{}{}", &sql[..invariants_start], &sql[contracts..]);
    as_an_earlier_generator_wrote_it(db, &dir, file, &old, 2).await;
    dir
}

/// A service whose earlier generator created `shipping_outbox` without the queue invariants:
/// an event inserted by SQL there reads as delivered. The next generation writes one migration
/// that adds them, and no more after that; applied, an event inserted by SQL gets its queue row
/// and is delivered, a queue row cannot be inserted for an event that does not exist, and
/// deleting an event deletes its delivery state.
#[tokio::test]
async fn a_table_without_the_queue_invariants_gets_them_once() {
    let db = TestDatabase::new().await;
    let events = [order_confirmed_v1(), shipment_sent()];
    let dir = split_layout_folder_without_invariants(&db, &events).await;
    apply_folder(&db, &dir).await;
    let raw_insert = |key: &'static str| {
        sqlx::query(
            "INSERT INTO shipping_outbox (event_id, operation_key, payload_fingerprint, event_type,
                                          event_version, payload)
             VALUES (gen_random_uuid(), $1, '\\x00', 'shipment.sent', 1, '{\"tracking\": \"T\"}')",
        )
        .bind(key)
    };
    let queued = |key: &'static str| {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM shipping_outbox e JOIN shipping_outbox_queue q USING (id)
                            WHERE e.operation_key = $1)",
        )
        .bind(key)
    };
    raw_insert("before").execute(db.pool()).await.unwrap();
    assert!(
        !queued("before").fetch_one(db.pool()).await.unwrap(),
        "the fixture is the table before the invariants: a raw event gets no queue row"
    );

    let out = generate_migrations(dir.path(), &events).unwrap();
    assert_eq!(
        out.written_migration.as_deref(),
        Some("0002_outbox_events.sql")
    );
    let upgrade = dir.read("0002_outbox_events.sql");
    assert!(
        upgrade.contains("-- Upgrades outbox tables with the queue invariants: shipping_outbox\n")
            && upgrade.contains(
                "-- ==== Outbox table shipping_outbox: the queue invariants (shipping_outbox_queue) ===="
            )
            && !upgrade.contains("split layout")
            && !upgrade.contains("INSERT INTO outbox_contracts"),
        "{upgrade}"
    );
    let lock = ContractLock::parse(&dir.read(LOCK_FILE)).unwrap();
    assert_eq!(
        (lock.format, lock.tables.as_slice()),
        (LOCK_FORMAT, ["shipping_outbox".to_owned()].as_slice())
    );
    let files = dir.files();
    let again = generate_migrations(dir.path(), &events).unwrap();
    assert_eq!((again.written_migration, again.lock_written), (None, false));
    assert_eq!(dir.files(), files, "a second run writes nothing");

    apply_folder(&db, &dir).await;
    raw_insert("after").execute(db.pool()).await.unwrap();
    assert!(
        queued("after").fetch_one(db.pool()).await.unwrap(),
        "an event inserted by SQL gets its queue row"
    );
    let store = Store::for_table(db.pool().clone(), "shipping_outbox").unwrap();
    let claimed = store
        .claim_batch("w", 10, std::time::Duration::from_secs(30), false)
        .await
        .unwrap();
    assert_eq!(
        claimed
            .iter()
            .map(|c| c.payload["tracking"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["T"],
        "the raw event is claimable (the one from before stays as it was: `outbox doctor`)"
    );
    let orphan = sqlx::query("INSERT INTO shipping_outbox_queue (id) VALUES (999999)")
        .execute(db.pool())
        .await
        .unwrap_err();
    assert_eq!(
        orphan.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("23503"),
        "{orphan}"
    );
    sqlx::query("DELETE FROM shipping_outbox WHERE operation_key = 'after'")
        .execute(db.pool())
        .await
        .unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM shipping_outbox_queue")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(left, 0, "deleting the event deleted its queue row");
}

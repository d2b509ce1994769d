//! The generated SQL against a real PostgreSQL: it applies with sqlx's migrator next to the
//! base schema, creates the tables and indexes it names, fills the contract registry, and the
//! start-up check agrees with it until a contract drifts. Hostile names never reach the
//! database, and hostile free text (type names, shapes) is stored as data.

mod generate_support;

use generate_support::*;
use outbox_runtime::Error;
use outbox_runtime::generate::{
    GenerateError, compare_registry, generate_migrations, registry_rows, verify_contracts,
};
use outbox_runtime::testing::TestDatabase;
use serde_json::json;
use sqlx::Row;

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
    for expected in ["orders", "outbox", "outbox_contracts", "shipping_outbox"] {
        assert!(
            tables.iter().any(|t| t == expected),
            "{expected} missing from {tables:?}"
        );
    }
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes WHERE tablename = 'shipping_outbox' ORDER BY 1",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    for expected in [
        "shipping_outbox_open_idx",
        "shipping_outbox_exhausted_idx",
        "shipping_outbox_purge_idx",
    ] {
        assert!(
            indexes.iter().any(|i| i == expected),
            "{expected} missing from {indexes:?}"
        );
    }

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

//! The example service's committed migrations folder is what its events generate: CI fails
//! here when someone changes an event in `examples/order_service/events.rs` without running
//! `cargo run --example order_outbox -- migrations generate` and committing the result.

#[path = "../examples/order_service/events.rs"]
#[allow(
    dead_code,
    reason = "linked for the registrations `#[derive(Event)]` submits"
)]
mod events;

use outbox_runtime::cli::{Exit, Outbox};
use outbox_runtime::generate::{check_migrations, compiled_events, verify_database_contracts};
use outbox_runtime::testing::TestDatabase;

const FOLDER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/order_service/migrations"
);

#[test]
fn the_example_services_migrations_are_up_to_date() {
    let events = compiled_events();
    assert!(
        events.iter().any(|e| e.contract.name == "order.confirmed"),
        "the example's events are linked into this test: {events:?}"
    );
    let check = check_migrations(FOLDER.as_ref(), &events).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        check.is_up_to_date(),
        "{FOLDER} is stale: {:?}\nrun `cargo run --example order_outbox -- migrations generate` and commit the result",
        check.stale
    );
}

#[tokio::test]
async fn the_check_command_passes_on_the_committed_folder() {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let exit = Outbox::new()
        .run_with(
            ["outbox", "migrations", "check", "--dir", FOLDER],
            &mut out,
            &mut err,
        )
        .await;
    assert_eq!(exit, Exit::Ok, "{}", String::from_utf8_lossy(&err));
}

#[tokio::test]
async fn the_committed_folder_applies_and_the_worker_check_accepts_it() {
    let db = TestDatabase::new().await;
    let migrator = sqlx::migrate::Migrator::new(std::path::Path::new(FOLDER))
        .await
        .unwrap();
    migrator
        .run(db.pool())
        .await
        .expect("the example's migrations apply");
    let registered: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_contracts")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(registered as usize, compiled_events().len());
    verify_database_contracts(db.pool())
        .await
        .expect("the registry agrees with the compiled events");
}

/// A sink that must never be reached: the worker refuses to start first.
struct Unreachable;

impl outbox_runtime::Sink for Unreachable {
    fn deliver<'a>(
        &'a self,
        _event: &'a outbox_runtime::store::ClaimedEvent,
        _delivery: &'a outbox_runtime::Delivery,
    ) -> futures::future::BoxFuture<'a, Result<(), outbox_runtime::HandlerError>> {
        panic!("a worker that refused to start delivered an event")
    }
}

#[tokio::test]
async fn a_worker_refuses_to_start_when_the_registry_disagrees() {
    let db = TestDatabase::new().await;
    // The database was migrated by a binary whose order.confirmed v1 had another shape.
    sqlx::query(
        "INSERT INTO outbox_contracts (event_type, event_version, fingerprint, shape, type_name)
         VALUES ('order.confirmed', 1, repeat('0', 64), '{}', 'older_binary::OrderConfirmed')",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let started = outbox_runtime::worker::Worker::builder(db.pool().clone(), Unreachable)
        .start()
        .await;
    let Err(err) = started else {
        panic!("the worker started against a drifted registry")
    };
    let message = err.to_string();
    assert!(
        message.starts_with("contract mismatch: event `order.confirmed` version 1 is registered"),
        "{message}"
    );
    assert!(
        message.contains("older_binary::OrderConfirmed") && message.contains("Refusing to start"),
        "{message}"
    );
}

//! Least privilege: the generated grants, applied to two real roles. An enqueue runs as the
//! enqueuer role and a claim, renewal, failure, recovery, completion and purge run as the
//! worker role; what each role must not do is refused by PostgreSQL.

mod generate_support;

use std::time::Duration;

use generate_support::*;
use outbox_runtime::generate::{grants_sql, verify_contracts};
use outbox_runtime::store::{FailOutcome, Ownership, RecoveryBackoff};
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::{Event, Store};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// Two login roles with unique names (roles are cluster-wide; tests run in parallel), dropped
/// at the end of the test.
struct Roles {
    enqueuer: String,
    worker: String,
}

impl Roles {
    async fn create(db: &TestDatabase) -> Roles {
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let roles = Roles {
            enqueuer: format!("enq_{}", &suffix[..12]),
            worker: format!("wrk_{}", &suffix[..12]),
        };
        for role in [&roles.enqueuer, &roles.worker] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE ROLE {role} LOGIN")))
                .execute(db.pool())
                .await
                .unwrap();
        }
        roles
    }

    async fn drop_all(self, db: &TestDatabase) {
        for role in [&self.enqueuer, &self.worker] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP OWNED BY {role}; DROP ROLE {role}"
            )))
            .execute(db.pool())
            .await
            .unwrap();
        }
    }
}

async fn pool_as(db: &TestDatabase, role: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect_with(db.connect_options().clone().username(role))
        .await
        .unwrap()
}

/// The SQLSTATE of a refused statement.
fn sqlstate(result: Result<sqlx::postgres::PgQueryResult, sqlx::Error>) -> String {
    match result {
        Ok(_) => "succeeded".to_owned(),
        Err(e) => e
            .as_database_error()
            .and_then(|d| d.code())
            .map(|c| c.into_owned())
            .unwrap_or_else(|| e.to_string()),
    }
}

const DENIED: &str = "42501";

#[tokio::test]
async fn enqueuer_and_worker_roles_can_do_their_job_and_nothing_else() {
    let db = TestDatabase::new().await;
    let roles = Roles::create(&db).await;
    let grants = grants_sql(&["outbox"], &roles.enqueuer, &roles.worker).unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(grants))
        .execute(db.pool())
        .await
        .expect("the grants apply");

    // Enqueue as the enqueuer, including the operation-key idempotency path.
    let enqueuer = pool_as(&db, &roles.enqueuer).await;
    let parcel = Parcel {
        tracking: "T-1".into(),
    };
    let mut tx = enqueuer.begin().await.unwrap();
    let id = parcel
        .enqueue(&mut tx, "ship-1")
        .await
        .expect("the enqueuer may enqueue");
    tx.commit().await.unwrap();
    let mut tx = enqueuer.begin().await.unwrap();
    assert_eq!(
        parcel
            .enqueue(&mut tx, "ship-1")
            .await
            .expect("same key, same payload"),
        id
    );
    let reused = Parcel {
        tracking: "T-2".into(),
    }
    .enqueue(&mut tx, "ship-1")
    .await;
    assert!(
        matches!(
            reused,
            Err(outbox_runtime::Error::OperationKeyReused { .. })
        ),
        "{reused:?}"
    );
    tx.commit().await.unwrap();

    // What the enqueuer must not do.
    for (what, sql) in [
        (
            "update delivery state",
            "UPDATE outbox SET status = 'delivered'",
        ),
        ("read payloads", "SELECT payload FROM outbox"),
        ("delete events", "DELETE FROM outbox"),
        (
            "insert an event as delivered",
            "INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload, status) \
             VALUES (gen_random_uuid(), 'k', '\\x00', 't', 1, '{}', 'delivered')",
        ),
        (
            "read the contract registry's shapes",
            "SELECT shape FROM outbox_contracts",
        ),
        (
            "change the contract registry",
            "DELETE FROM outbox_contracts",
        ),
    ] {
        assert_eq!(
            sqlstate(
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(&enqueuer)
                    .await
            ),
            DENIED,
            "enqueuer may not {what}"
        );
    }

    // Work as the worker: claim, renew, fail and retry later, recover an expired lease,
    // complete, purge.
    let worker_pool = pool_as(&db, &roles.worker).await;
    let worker = Store::new(worker_pool.clone());
    let claimed = worker
        .claim_batch("w1", 10, Duration::from_secs(30), false)
        .await
        .expect("the worker may claim");
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].event_id, id);
    assert_eq!(
        worker
            .renew_if_owned(claimed[0].claim(), Duration::from_secs(30))
            .await
            .unwrap(),
        Ownership::Owned
    );
    let failed = worker
        .fail_if_owned(claimed[0].claim(), "receiver down", Duration::ZERO, false)
        .await
        .unwrap();
    assert_eq!(failed, FailOutcome::Rescheduled);

    let again = worker
        .claim_batch("w1", 10, Duration::from_millis(1), false)
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    tokio::time::sleep(Duration::from_millis(20)).await; // let the 1 ms lease run out
    let recovered = worker
        .recover_expired(10, RecoveryBackoff::NONE)
        .await
        .expect("the worker may recover");
    assert_eq!(recovered.requeued, 1);

    let last = worker
        .claim_batch("w1", 10, Duration::from_secs(30), false)
        .await
        .unwrap();
    assert_eq!(
        worker.complete_if_owned(last[0].claim()).await.unwrap(),
        Ownership::Owned
    );
    assert_eq!(
        worker
            .purge_delivered(Duration::ZERO, 10)
            .await
            .expect("the worker may purge"),
        1
    );
    verify_contracts(&worker_pool, &[Parcel::contract()])
        .await
        .expect("the worker may read the registry");

    // What the worker must not do.
    for (what, sql) in [
        (
            "insert events",
            "INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload) VALUES (gen_random_uuid(), 'k2', '\\x00', 't', 1, '{}')",
        ),
        ("rewrite payloads", "UPDATE outbox SET payload = '{}'"),
        (
            "rename event types",
            "UPDATE outbox SET event_type = 'other'",
        ),
        ("change the registry", "DELETE FROM outbox_contracts"),
    ] {
        assert_eq!(
            sqlstate(
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(&worker_pool)
                    .await
            ),
            DENIED,
            "worker may not {what}"
        );
    }

    let status: Vec<String> = sqlx::query_scalar("SELECT status FROM outbox")
        .fetch_all(db.pool())
        .await
        .unwrap();
    assert!(
        status.is_empty(),
        "the one event was delivered and purged: {status:?}"
    );

    enqueuer.close().await;
    worker_pool.close().await;
    roles.drop_all(&db).await;
}

/// A sink that records what it was given.
struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<uuid::Uuid>>>);

impl outbox_runtime::Sink for Recorder {
    fn deliver<'a>(
        &'a self,
        event: &'a outbox_runtime::store::ClaimedEvent,
        _delivery: &'a outbox_runtime::Delivery,
    ) -> futures::future::BoxFuture<'a, Result<(), outbox_runtime::HandlerError>> {
        self.0.lock().unwrap().push(event.event_id);
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test]
async fn a_worker_runs_as_the_worker_role() {
    let db = TestDatabase::new().await;
    let roles = Roles::create(&db).await;
    let grants = grants_sql(&["outbox"], &roles.enqueuer, &roles.worker).unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(grants))
        .execute(db.pool())
        .await
        .unwrap();

    let enqueuer = pool_as(&db, &roles.enqueuer).await;
    let ids = enqueue_parcels(&enqueuer, "worker-role", 3).await;

    // The whole worker (start-up contract check, listener, claimer, completer, maintenance
    // leader election) under the worker role.
    let worker_pool = pool_as(&db, &roles.worker).await;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let worker =
        outbox_runtime::worker::Worker::builder(worker_pool.clone(), Recorder(seen.clone()))
            .events(tx)
            .start()
            .await
            .expect("the worker starts as the worker role");
    let mut completed = 0;
    while completed < ids.len() {
        let event = tokio::time::timeout(Duration::from_secs(30), events.recv())
            .await
            .expect("the worker reports progress")
            .expect("the worker is running");
        match event {
            outbox_runtime::worker::WorkerEvent::CompletedBatch {
                completed: done,
                stale,
            } => {
                assert!(stale.is_empty());
                completed += done.len();
            }
            outbox_runtime::worker::WorkerEvent::Failed(claim, outcome) => {
                panic!("{claim:?} failed: {outcome:?}")
            }
            _ => {}
        }
    }
    worker.shutdown().await;

    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(seen, expected);
    let delivered: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE status = 'delivered'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(delivered, 3);

    enqueuer.close().await;
    worker_pool.close().await;
    roles.drop_all(&db).await;
}

#[test]
fn hostile_table_and_role_names_are_refused_with_a_message_that_shows_them_escaped() {
    for hostile in hostile_texts()
        .into_iter()
        .chain(["current_user".to_owned(), "Shop_App".to_owned()])
    {
        for (tables, enqueuer, worker) in [
            (vec![hostile.as_str()], "shop_app", "shop_worker"),
            (vec!["outbox"], hostile.as_str(), "shop_worker"),
            (vec!["outbox"], "shop_app", hostile.as_str()),
        ] {
            let err = grants_sql(&tables, enqueuer, worker)
                .expect_err(&format!("{hostile:?} must be refused"));
            let message = err.to_string();
            assert!(
                message.contains("is not a usable role name")
                    || message.contains("is not a role of its own")
                    || message.contains("is not a valid outbox table name")
                    || message.contains("is a reserved word"),
                "{hostile:?}: {message}"
            );
            assert!(
                !message.contains(['\n', '\r', '\0', '\u{2028}', '\u{85}']) && message.len() < 1000,
                "the message shows the name escaped and short: {message}"
            );
        }
    }
}

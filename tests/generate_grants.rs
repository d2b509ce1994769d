//! Least privilege: the generated grants, applied to two real roles, on both tables of the
//! split layout (the event table `outbox` and its queue table `outbox_queue`). An enqueue runs
//! as the enqueuer role, and every statement of the store a worker or the operator command runs
//! (claims, renewals, failures, recovery, completions, retries, the purge) as the worker role;
//! what each role must not do is refused by PostgreSQL.

mod generate_support;

use std::time::Duration;

use generate_support::*;
use outbox_runtime::generate::{grants_sql, verify_contracts};
use outbox_runtime::store::{EventStatus, FailOutcome, Ownership, RecoveryBackoff};
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::{Event, Store};
use sqlx::PgPool;

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

/// Assert that PostgreSQL refuses each statement to `role` (on `pool`) for lack of a privilege.
async fn assert_denied(pool: &PgPool, role: &str, cases: &[(&str, &str)]) {
    for (what, sql) in cases {
        assert_eq!(
            sqlstate(sqlx::raw_sql(sqlx::AssertSqlSafe(*sql)).execute(pool).await),
            DENIED,
            "{role} may not {what}"
        );
    }
}

/// The roles, the generated grants applied for `outbox`, and a pool logged in as each role.
struct Granted {
    roles: Roles,
    enqueuer: PgPool,
    worker: PgPool,
}

impl Granted {
    async fn new(db: &TestDatabase) -> Granted {
        let roles = Roles::create(db).await;
        let grants = grants_sql(&["outbox"], &roles.enqueuer, &roles.worker).unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(grants))
            .execute(db.pool())
            .await
            .expect("the grants apply");
        Granted {
            enqueuer: pool_as(db, &roles.enqueuer).await,
            worker: pool_as(db, &roles.worker).await,
            roles,
        }
    }

    async fn drop_all(self, db: &TestDatabase) {
        self.enqueuer.close().await;
        self.worker.close().await;
        self.roles.drop_all(db).await;
    }
}

/// A raw enqueue of one event whose queue row also sets `extra` (columns) to `values`: what an
/// enqueuer would write to put an event into the queue in a state only a worker may give it.
fn enqueue_with_queue_columns(extra: &str, values: &str) -> String {
    format!(
        "WITH e AS (INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload) \
         VALUES (gen_random_uuid(), 'k', '\\x00', 'parcel.sent', 1, '{{}}') RETURNING id, aggregate_type, aggregate_id) \
         INSERT INTO outbox_queue (id, aggregate_type, aggregate_id, {extra}) SELECT id, aggregate_type, aggregate_id, {values} FROM e"
    )
}

#[tokio::test]
async fn enqueuer_and_worker_roles_can_do_their_job_and_nothing_else() {
    let db = TestDatabase::new().await;
    let granted = Granted::new(&db).await;
    let enqueuer = &granted.enqueuer;

    // Enqueue as the enqueuer (the event and its queue row in one statement, notifying),
    // including the operation-key idempotency path.
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

    // What the enqueuer must not do. The raw enqueues below differ from the library's only in
    // the column named: each is refused for that column.
    let as_processing = enqueue_with_queue_columns(
        "status, lease_until",
        "'processing', now() + interval '1 hour'",
    );
    let as_exhausted = enqueue_with_queue_columns("status, exhausted_at", "'exhausted', now()");
    let as_claimed = enqueue_with_queue_columns("claim_version", "7");
    let with_attempts_used = enqueue_with_queue_columns("attempts", "10");
    assert_denied(
        enqueuer,
        "the enqueuer",
        &[
            (
                "update delivery state",
                "UPDATE outbox_queue SET status = 'exhausted', exhausted_at = now()",
            ),
            ("read delivery state", "SELECT status FROM outbox_queue"),
            ("read payloads", "SELECT payload FROM outbox"),
            ("delete events", "DELETE FROM outbox"),
            ("delete queue rows (deliver)", "DELETE FROM outbox_queue"),
            ("rewrite an event", "UPDATE outbox SET payload = '{}'"),
            ("insert an event's queue row as processing", &as_processing),
            ("insert an event's queue row as exhausted", &as_exhausted),
            ("insert an event's queue row with a claim version", &as_claimed),
            ("insert an event's queue row with its attempts used", &with_attempts_used),
            (
                "backdate an event (so the purge takes it early)",
                "INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload, created_at) \
                 VALUES (gen_random_uuid(), 'k', '\\x00', 't', 1, '{}', now() - interval '30 days')",
            ),
            (
                "read the contract registry's shapes",
                "SELECT shape FROM outbox_contracts",
            ),
            (
                "change the contract registry",
                "DELETE FROM outbox_contracts",
            ),
        ],
    )
    .await;
    // The same raw enqueue without the extra column is allowed: the refusals above are the
    // columns', not the statement's.
    sqlx::raw_sql(sqlx::AssertSqlSafe(enqueue_with_queue_columns(
        "max_attempts",
        "3",
    )))
    .execute(enqueuer)
    .await
    .expect("the enqueuer may insert what an enqueue inserts");
    sqlx::raw_sql("DELETE FROM outbox_queue WHERE id = (SELECT id FROM outbox WHERE operation_key = 'k'); DELETE FROM outbox WHERE operation_key = 'k'")
        .execute(db.pool())
        .await
        .unwrap();

    // Work as the worker: claim, renew (one and a batch, which locks its free rows first), fail
    // and retry later, recover an expired lease, complete, tell a lost answer, purge.
    let worker = Store::new(granted.worker.clone());
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
    let renewal = worker
        .renew_many_if_owned_skipping_held(&[claimed[0].claim()], Duration::from_secs(30))
        .await
        .expect("the worker may lock and renew its claims");
    assert!(
        renewal.lost.is_empty() && renewal.held.is_empty(),
        "{renewal:?}"
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
        .claim_batch("w1", 10, Duration::from_secs(30), true)
        .await
        .expect("the worker may claim in aggregate order");
    assert_eq!(
        worker.complete_if_owned(last[0].claim()).await.unwrap(),
        Ownership::Owned
    );
    assert_eq!(
        worker.completed_earlier(&[last[0].claim()]).await.unwrap(),
        [last[0].claim()],
        "the worker may ask whether a lost answer's claim was settled"
    );
    assert_eq!(
        worker.event_status(id).await.unwrap(),
        Some(EventStatus::Delivered)
    );
    assert_eq!(worker.stats().await.unwrap().delivered, 1);
    assert_eq!(
        worker
            .purge_delivered(Duration::ZERO, 10)
            .await
            .expect("the worker may purge (it locks the rows it deletes)"),
        1
    );
    verify_contracts(&granted.worker, &[Parcel::contract()])
        .await
        .expect("the worker may read the registry");

    // What the worker must not do.
    assert_denied(
        &granted.worker,
        "the worker",
        &[
            (
                "insert events",
                "INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload) VALUES (gen_random_uuid(), 'k2', '\\x00', 't', 1, '{}')",
            ),
            (
                "put a delivered event back in the queue",
                "INSERT INTO outbox_queue (id) SELECT id FROM outbox",
            ),
            ("rewrite payloads", "UPDATE outbox SET payload = '{}'"),
            ("rename event types", "UPDATE outbox SET event_type = 'other'"),
            ("rewrite operation keys", "UPDATE outbox SET operation_key = 'other'"),
            ("tie a queue row to another event", "UPDATE outbox_queue SET id = id + 1"),
            (
                "move a queue row to another aggregate",
                "UPDATE outbox_queue SET aggregate_id = 'other'",
            ),
            ("raise the attempts allowed", "UPDATE outbox_queue SET max_attempts = 1000"),
            ("change the registry", "DELETE FROM outbox_contracts"),
        ],
    )
    .await;

    let left: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM outbox) + (SELECT count(*) FROM outbox_queue)",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(left, 0, "the one event was delivered and purged");
    granted.drop_all(&db).await;
}

/// The worker's statements for exhausted events (they read the event table for the id and the
/// type), releasing a claim, making delayed events due, and completion under retention zero
/// (the queue row and the event row in one statement), as the worker role.
#[tokio::test]
async fn the_worker_role_exhausts_retries_releases_and_forgets() {
    let db = TestDatabase::new().await;
    let granted = Granted::new(&db).await;
    let ids = enqueue_parcels(&granted.enqueuer, "exhaust", 2).await;
    let worker = Store::new(granted.worker.clone());

    let claimed = worker
        .claim_batch("w1", 10, Duration::from_secs(30), false)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    for claim in &claimed {
        assert_eq!(
            worker
                .fail_if_owned(claim.claim(), "422", Duration::ZERO, true)
                .await
                .unwrap(),
            FailOutcome::Exhausted
        );
    }
    let exhausted = worker
        .exhausted_events(10)
        .await
        .expect("the worker may list them");
    assert_eq!(exhausted.len(), 2);
    assert_eq!(worker.gauges().await.unwrap().exhausted, 2);
    assert!(
        worker
            .retry_exhausted(ids[0])
            .await
            .expect("retry by event id")
    );
    assert_eq!(
        worker
            .retry_exhausted_of_type("parcel.sent")
            .await
            .expect("retry by type"),
        1
    );

    let claimed = worker
        .claim_batch("w1", 10, Duration::from_secs(30), false)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    assert_eq!(
        worker.release_if_owned(claimed[0].claim()).await.unwrap(),
        Ownership::Owned
    );
    sqlx::query(
        "UPDATE outbox_queue SET available_at = now() + interval '1 hour' WHERE status = 'pending'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    assert_eq!(
        worker
            .make_delayed_due()
            .await
            .expect("make delayed events due"),
        1
    );
    let mut claims: Vec<_> = claimed[1..].iter().map(|c| c.claim()).collect();
    claims.extend(
        worker
            .claim_batch("w1", 10, Duration::from_secs(30), false)
            .await
            .unwrap()
            .iter()
            .map(|c| c.claim()),
    );
    assert_eq!(claims.len(), 2);
    assert_eq!(
        worker
            .complete_many_by_deleting_if_owned(&claims)
            .await
            .expect("the worker may complete under retention zero"),
        [],
        "no claim was lost"
    );
    let left: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM outbox) + (SELECT count(*) FROM outbox_queue)",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        left, 0,
        "retention zero deleted both events with their queue rows"
    );
    granted.drop_all(&db).await;
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
    let granted = Granted::new(&db).await;
    let ids = enqueue_parcels(&granted.enqueuer, "worker-role", 3).await;

    // The whole worker (start-up contract check, listener, claimer, completer, maintenance
    // leader election) under the worker role.
    let worker_pool = granted.worker.clone();
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
    // Delivered: kept as events, with no queue row left.
    let delivered: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox e WHERE NOT EXISTS (SELECT 1 FROM outbox_queue q WHERE q.id = e.id)",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(delivered, 3);

    drop(worker_pool);
    granted.drop_all(&db).await;
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

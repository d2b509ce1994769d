//! Enqueue: the event commits or rolls back with the business change, operation keys are
//! idempotent or rejected, payloads are bounded, and the wake-up is one NOTIFY per commit.

mod store_support;

use std::time::Duration;

use outbox_runtime::store::enqueue::event_id_for;
use outbox_runtime::store::{EnqueueOptions, notify_channel};
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::{Error, Event};
use sqlx::postgres::PgListener;
use sqlx::{PgPool, Row};
use store_support::{
    Note, OrderPlaced, count_queue_rows, count_rows, orphan_queue_rows, wait_until_blocked,
};

async fn create_orders(pool: &PgPool) {
    sqlx::query("CREATE TABLE orders (id text PRIMARY KEY, total_cents bigint NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
}

async fn count_orders(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn place_order(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, id: &str, total: i64) {
    sqlx::query("INSERT INTO orders (id, total_cents) VALUES ($1, $2)")
        .bind(id)
        .bind(total)
        .execute(&mut **tx)
        .await
        .unwrap();
}

#[tokio::test]
async fn rolled_back_business_transaction_leaves_no_event_and_committed_leaves_exactly_one() {
    let db = TestDatabase::new().await;
    create_orders(db.pool()).await;
    let event = OrderPlaced {
        order_id: "o-1".into(),
        total_cents: 1250,
    };

    let mut tx = db.pool().begin().await.unwrap();
    place_order(&mut tx, "o-1", 1250).await;
    event.enqueue(&mut tx, "place-order/o-1").await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(count_orders(db.pool()).await, 0);
    assert_eq!(
        (
            count_rows(db.pool()).await,
            count_queue_rows(db.pool()).await
        ),
        (0, 0),
        "a rolled-back transaction must leave neither an event nor a queue row"
    );

    let mut tx = db.pool().begin().await.unwrap();
    place_order(&mut tx, "o-1", 1250).await;
    let id = event.enqueue(&mut tx, "place-order/o-1").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(count_orders(db.pool()).await, 1);
    assert_eq!(count_rows(db.pool()).await, 1);

    // The event and its queue row (pending, with the event's aggregate for the ordered claim).
    let row = sqlx::query(
        "SELECT e.event_id, e.event_type, e.event_version, e.aggregate_type, e.aggregate_id,
                e.payload, e.headers, q.status, q.attempts, q.max_attempts, q.claim_version,
                q.available_at <= now() AS available,
                (q.aggregate_type, q.aggregate_id) IS NOT DISTINCT FROM (e.aggregate_type, e.aggregate_id)
                    AS same_aggregate
         FROM outbox e JOIN outbox_queue q ON q.id = e.id",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(row.get::<uuid::Uuid, _>("event_id"), id);
    assert_eq!(
        id,
        event_id_for("outbox", "place-order/o-1"),
        "the event id is derived from table and key"
    );
    assert_eq!(row.get::<String, _>("event_type"), "order_placed");
    assert_eq!(row.get::<i32, _>("event_version"), 1);
    assert_eq!(
        row.get::<Option<String>, _>("aggregate_type").as_deref(),
        Some("order")
    );
    assert_eq!(
        row.get::<Option<String>, _>("aggregate_id").as_deref(),
        Some("o-1")
    );
    assert_eq!(
        row.get::<serde_json::Value, _>("payload"),
        serde_json::json!({"order_id": "o-1", "total_cents": 1250})
    );
    assert_eq!(
        row.get::<serde_json::Value, _>("headers"),
        serde_json::json!({})
    );
    assert_eq!(row.get::<String, _>("status"), "pending");
    assert_eq!(row.get::<i32, _>("attempts"), 0);
    assert_eq!(row.get::<i32, _>("max_attempts"), 10);
    assert_eq!(row.get::<i64, _>("claim_version"), 0);
    assert!(row.get::<bool, _>("available"));
    assert!(row.get::<bool, _>("same_aggregate"));
}

/// An enqueue rolled back (with its transaction, or to a savepoint the caller set before it)
/// leaves neither of its two rows, and the transaction's other events are kept whole.
#[tokio::test]
async fn a_rolled_back_enqueue_leaves_neither_the_event_nor_its_queue_row() {
    let db = TestDatabase::new().await;
    let mut tx = db.pool().begin().await.unwrap();
    Note {
        text: "kept".into(),
    }
    .enqueue(&mut tx, "kept")
    .await
    .unwrap();
    sqlx::query("SAVEPOINT before_the_second")
        .execute(&mut *tx)
        .await
        .unwrap();
    Note {
        text: "dropped".into(),
    }
    .enqueue(&mut tx, "dropped")
    .await
    .unwrap();
    // Inside the transaction, both events and both queue rows exist.
    let inside: (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM outbox), (SELECT count(*) FROM outbox_queue)")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    assert_eq!(inside, (2, 2));
    sqlx::query("ROLLBACK TO SAVEPOINT before_the_second")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let kept: Vec<String> = sqlx::query_scalar(
        "SELECT e.operation_key FROM outbox e JOIN outbox_queue q ON q.id = e.id",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(kept, ["kept"]);
    assert_eq!(
        (
            count_rows(db.pool()).await,
            count_queue_rows(db.pool()).await
        ),
        (1, 1)
    );

    // The same key again, in a transaction that rolls back: nothing of it stays either.
    let mut tx = db.pool().begin().await.unwrap();
    Note {
        text: "dropped".into(),
    }
    .enqueue(&mut tx, "dropped")
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(
        (
            count_rows(db.pool()).await,
            count_queue_rows(db.pool()).await
        ),
        (1, 1)
    );
    assert!(orphan_queue_rows(db.pool()).await.is_empty());
}

#[tokio::test]
async fn same_key_same_payload_returns_the_existing_id_and_writes_nothing() {
    let db = TestDatabase::new().await;
    let event = OrderPlaced {
        order_id: "o-2".into(),
        total_cents: 99,
    };

    let mut tx = db.pool().begin().await.unwrap();
    let first = event.enqueue(&mut tx, "k").await.unwrap();
    let again_same_tx = event.enqueue(&mut tx, "k").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(first, again_same_tx);

    // The versions of the event and of its queue row.
    let versions = "SELECT e.xmin::text || '/' || q.xmin::text FROM outbox e JOIN outbox_queue q ON q.id = e.id";
    let version_before: String = sqlx::query_scalar(versions)
        .fetch_one(db.pool())
        .await
        .unwrap();
    // A retried business command, in a later transaction.
    let mut tx = db.pool().begin().await.unwrap();
    let again_later = event.enqueue(&mut tx, "k").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(first, again_later);

    assert_eq!(
        (
            count_rows(db.pool()).await,
            count_queue_rows(db.pool()).await
        ),
        (1, 1)
    );
    let version_after: String = sqlx::query_scalar(versions)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(
        version_before, version_after,
        "the idempotent repeat must rewrite neither the event nor its queue row"
    );
}

#[tokio::test]
async fn same_key_different_payload_is_rejected_and_the_transaction_still_commits() {
    let db = TestDatabase::new().await;
    create_orders(db.pool()).await;
    let original = OrderPlaced {
        order_id: "o-3".into(),
        total_cents: 100,
    };
    let different = OrderPlaced {
        order_id: "o-3".into(),
        total_cents: 200,
    };

    let mut tx = db.pool().begin().await.unwrap();
    let original_id = original.enqueue(&mut tx, "k").await.unwrap();
    tx.commit().await.unwrap();

    let mut tx = db.pool().begin().await.unwrap();
    place_order(&mut tx, "o-3", 200).await;
    match different.enqueue(&mut tx, "k").await {
        Err(Error::OperationKeyReused {
            operation_key,
            existing_event_id,
        }) => {
            assert_eq!(operation_key, "k");
            assert_eq!(existing_event_id, original_id);
        }
        other => panic!("expected OperationKeyReused, got {other:?}"),
    }
    // Also a different event type under the same key.
    let note = Note { text: "x".into() };
    assert!(matches!(
        note.enqueue(&mut tx, "k").await,
        Err(Error::OperationKeyReused { .. })
    ));
    // The transaction is not aborted: it can still write and commit its other work.
    place_order(&mut tx, "o-4", 1).await;
    Note {
        text: "other".into(),
    }
    .enqueue(&mut tx, "other-key")
    .await
    .unwrap();
    tx.commit().await.unwrap();

    assert_eq!(count_orders(db.pool()).await, 2);
    assert_eq!(count_rows(db.pool()).await, 2);
    let payload: serde_json::Value =
        sqlx::query_scalar("SELECT payload FROM outbox WHERE operation_key = 'k'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(
        payload["total_cents"], 100,
        "the stored event keeps the original payload"
    );

    // Within one transaction as well.
    let mut tx = db.pool().begin().await.unwrap();
    original.enqueue(&mut tx, "k2").await.unwrap();
    assert!(matches!(
        different.enqueue(&mut tx, "k2").await,
        Err(Error::OperationKeyReused { .. })
    ));
    tx.commit().await.unwrap();
    assert_eq!(count_rows(db.pool()).await, 3);
}

/// The READ COMMITTED corner: the conflicting row is committed by another transaction after
/// the enqueue statement took its snapshot, so the statement cannot see it and must look again.
#[tokio::test]
async fn a_key_committed_concurrently_is_found_without_aborting_the_transaction() {
    let db = TestDatabase::new().await;
    let event = OrderPlaced {
        order_id: "o-5".into(),
        total_cents: 5,
    };
    let different = OrderPlaced {
        order_id: "o-5".into(),
        total_cents: 6,
    };

    for (second, expect_same) in [(&event, true), (&different, false)] {
        let key = format!("race-{expect_same}");
        let mut first_tx = db.pool().begin().await.unwrap();
        let first_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *first_tx)
            .await
            .unwrap();
        let first_id = event.enqueue(&mut first_tx, &key).await.unwrap();

        let pool = db.pool().clone();
        let second = second.clone();
        let key2 = key.clone();
        let (racer_pid_tx, racer_pid) = tokio::sync::oneshot::channel::<i32>();
        let racer = tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            racer_pid_tx.send(pid).unwrap();
            // Blocks on the first transaction's uncommitted row until it commits.
            let outcome = second.enqueue(&mut tx, &key2).await;
            sqlx::query("SELECT 1")
                .execute(&mut *tx)
                .await
                .expect("the transaction is still usable");
            tx.commit().await.unwrap();
            outcome
        });
        // Make sure the racer is waiting on our row lock before we commit.
        let racer_pid = racer_pid.await.expect("the racer reports its backend");
        wait_until_blocked(db.pool(), racer_pid, Some(first_pid)).await;
        first_tx.commit().await.unwrap();

        match (racer.await.unwrap(), expect_same) {
            (Ok(id), true) => assert_eq!(id, first_id),
            (
                Err(Error::OperationKeyReused {
                    existing_event_id, ..
                }),
                false,
            ) => assert_eq!(existing_event_id, first_id),
            (other, _) => panic!("unexpected outcome {other:?} (same payload: {expect_same})"),
        }
        // One event under the key, and one queue row for it.
        let n: (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(q.id) FROM outbox e LEFT JOIN outbox_queue q ON q.id = e.id
             WHERE e.operation_key = $1",
        )
        .bind(&key)
        .fetch_one(db.pool())
        .await
        .unwrap();
        assert_eq!(n, (1, 1));
    }
}

#[tokio::test]
async fn payload_over_the_limit_is_refused_before_anything_is_written() {
    let db = TestDatabase::new().await;
    let mut tx = db.pool().begin().await.unwrap();

    let small_limit = EnqueueOptions {
        max_payload_bytes: 100,
        ..Default::default()
    };
    let note = Note {
        text: "x".repeat(200),
    };
    match note.enqueue_with(&mut tx, "big", &small_limit).await {
        Err(Error::PayloadTooLarge {
            event_type,
            size,
            limit,
        }) => {
            assert_eq!(event_type, "note");
            assert_eq!(size, serde_json::to_vec(&note).unwrap().len());
            assert_eq!(limit, 100);
        }
        other => panic!("expected PayloadTooLarge, got {other:?}"),
    }
    // The limit itself is allowed: a payload of exactly 100 bytes is written.
    let exact = Note {
        text: "e".repeat(89),
    };
    assert_eq!(serde_json::to_vec(&exact).unwrap().len(), 100);
    exact
        .enqueue_with(&mut tx, "exact", &small_limit)
        .await
        .expect("a payload of exactly the limit is accepted");
    // The default limit is 256 KiB.
    let huge = Note {
        text: "y".repeat(300 * 1024),
    };
    assert!(matches!(
        huge.enqueue(&mut tx, "huge").await,
        Err(Error::PayloadTooLarge { limit: 262_144, .. })
    ));
    let just_fits = Note {
        text: "z".repeat(256 * 1024 - 20),
    };
    just_fits.enqueue(&mut tx, "fits").await.unwrap();
    tx.commit().await.unwrap();

    let keys: Vec<String> = sqlx::query_scalar("SELECT operation_key FROM outbox ORDER BY id")
        .fetch_all(db.pool())
        .await
        .unwrap();
    assert_eq!(keys, vec!["exact".to_owned(), "fits".to_owned()]);
}

#[tokio::test]
async fn options_set_attempts_headers_and_delay() {
    let db = TestDatabase::new().await;
    let options = EnqueueOptions {
        max_attempts: 3,
        headers: Some(serde_json::json!({"traceparent": "00-abc-def-01"})),
        delay: Duration::from_secs(3600),
        ..Default::default()
    };
    let mut tx = db.pool().begin().await.unwrap();
    Note {
        text: "later".into(),
    }
    .enqueue_with(&mut tx, "later", &options)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let row = sqlx::query(
        "SELECT q.max_attempts, e.headers, extract(epoch FROM q.available_at - now())::float8 AS delay_s
         FROM outbox e JOIN outbox_queue q ON q.id = e.id",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(row.get::<i32, _>("max_attempts"), 3);
    assert_eq!(
        row.get::<serde_json::Value, _>("headers")["traceparent"],
        "00-abc-def-01"
    );
    let delay: f64 = row.get("delay_s");
    assert!(
        (3590.0..=3600.0).contains(&delay),
        "available_at is now() + delay by the database clock, got {delay}"
    );

    let mut tx = db.pool().begin().await.unwrap();
    let bad = EnqueueOptions {
        max_attempts: 0,
        ..Default::default()
    };
    assert!(matches!(
        Note { text: "x".into() }
            .enqueue_with(&mut tx, "x", &bad)
            .await,
        Err(Error::Config(_))
    ));
}

/// Receive notifications on the default channel for a moment; returns how many arrived.
async fn drain_notifications(listener: &mut PgListener, wait: Duration) -> usize {
    let mut n = 0;
    while let Ok(received) = tokio::time::timeout(wait, listener.recv()).await {
        let notification = received.unwrap();
        assert_eq!(notification.channel(), "outbox");
        assert_eq!(notification.payload(), "");
        n += 1;
    }
    n
}

#[tokio::test]
async fn one_notification_per_committed_transaction_none_when_off_or_rolled_back() {
    let db = TestDatabase::new().await;
    let mut listener = PgListener::connect(&db.url()).await.unwrap();
    // The channel as a store reports it is the one enqueue notifies on.
    let channel = outbox_runtime::Store::new(db.pool().clone()).notify_channel();
    assert_eq!(channel, notify_channel("outbox"));
    listener.listen(&channel).await.unwrap();
    let wait = Duration::from_millis(500);

    // Three events in one transaction: nothing before commit, exactly one after.
    let mut tx = db.pool().begin().await.unwrap();
    for i in 0..3 {
        Note {
            text: format!("n{i}"),
        }
        .enqueue(&mut tx, &format!("n{i}"))
        .await
        .unwrap();
    }
    assert_eq!(
        drain_notifications(&mut listener, wait).await,
        0,
        "NOTIFY is delivered on commit, not before"
    );
    tx.commit().await.unwrap();
    assert_eq!(drain_notifications(&mut listener, wait).await, 1);

    // Notify switched off (`without_notify()`: the defaults with `notify: false`).
    let quiet = EnqueueOptions::without_notify();
    let mut tx = db.pool().begin().await.unwrap();
    for i in 0..3 {
        Note {
            text: format!("q{i}"),
        }
        .enqueue_with(&mut tx, &format!("q{i}"), &quiet)
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    assert_eq!(drain_notifications(&mut listener, wait).await, 0);

    // Rolled back.
    let mut tx = db.pool().begin().await.unwrap();
    for i in 0..3 {
        Note {
            text: format!("r{i}"),
        }
        .enqueue(&mut tx, &format!("r{i}"))
        .await
        .unwrap();
    }
    tx.rollback().await.unwrap();
    assert_eq!(drain_notifications(&mut listener, wait).await, 0);

    // An idempotent repeat writes nothing and wakes nobody.
    let mut tx = db.pool().begin().await.unwrap();
    Note { text: "n0".into() }
        .enqueue(&mut tx, "n0")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(drain_notifications(&mut listener, wait).await, 0);

    assert_eq!(count_rows(db.pool()).await, 6);
}

/// NOTIFY serialises committing transactions: measure its cost (printed, not asserted).
#[tokio::test]
async fn measure_notify_cost() {
    let db = TestDatabase::with_pool_size(8).await;
    for notify in [false, true, false, true] {
        let started = std::time::Instant::now();
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let pool = db.pool().clone();
                tokio::spawn(async move {
                    let options = EnqueueOptions {
                        notify,
                        ..Default::default()
                    };
                    for i in 0..250 {
                        let mut tx = pool.begin().await.unwrap();
                        Note {
                            text: format!("{t}/{i}"),
                        }
                        .enqueue_with(
                            &mut tx,
                            &format!("{notify}/{t}/{i}/{}", started.elapsed().as_nanos()),
                            &options,
                        )
                        .await
                        .unwrap();
                        tx.commit().await.unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let elapsed = started.elapsed();
        println!(
            "notify={notify}: 2000 single-event transactions on 8 connections in {elapsed:?} ({:.0} tx/s)",
            2000.0 / elapsed.as_secs_f64()
        );
    }
    assert_eq!(count_rows(db.pool()).await, 8000);
}

#[tokio::test]
async fn an_empty_operation_key_is_refused_and_the_transaction_still_commits() {
    let db = TestDatabase::new().await;
    create_orders(db.pool()).await;
    let mut tx = db.pool().begin().await.unwrap();
    place_order(&mut tx, "o-empty", 1).await;
    let refused = Note { text: "x".into() }.enqueue(&mut tx, "").await;
    match &refused {
        Err(Error::OperationKeyEmpty { event_type }) => assert_eq!(event_type, "note"),
        other => panic!("expected OperationKeyEmpty, got {other:?}"),
    }
    let message = refused.unwrap_err().to_string();
    assert!(
        message.contains("operation key of event `note` is empty")
            && message.contains("confirm-order/<order id>"),
        "{message}"
    );
    tx.commit().await.unwrap();
    assert_eq!(count_orders(db.pool()).await, 1);
    assert_eq!(count_rows(db.pool()).await, 0);
}

/// Events of the contract-check tests, one type per test: the enqueue-side verdict is kept per
/// process and event type.
mod drift {
    use outbox_runtime::Event;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(name = "drift.refused", version = 1)]
    pub struct Refused {
        pub total_cents: i64,
    }

    #[derive(Debug, Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(name = "drift.agreed", version = 1)]
    pub struct Agreed {
        pub total_cents: i64,
    }

    #[derive(Debug, Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(name = "drift.no_registry", version = 1)]
    pub struct NoRegistry {
        pub total_cents: i64,
    }

    #[derive(Debug, Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(name = "drift.registry_denied", version = 1)]
    pub struct RegistryDenied {
        pub total_cents: i64,
    }

    #[derive(Debug, Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(name = "drift.kept_agreed", version = 1)]
    pub struct KeptAgreed {
        pub total_cents: i64,
    }

    #[derive(Debug, Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(name = "drift.kept_unregistered", version = 1)]
    pub struct KeptUnregistered {
        pub total_cents: i64,
    }
}

/// Registers `contract` in the database's registry with `fingerprint`, as a generated migration
/// would (with another fingerprint: as a migration generated from another shape would).
async fn register(pool: &PgPool, contract: &outbox_runtime::contract::Contract, fingerprint: &str) {
    sqlx::query(
        "INSERT INTO outbox_contracts (event_type, event_version, fingerprint, shape, type_name) \
         VALUES ($1, $2, $3, '{}', 'shop::Before')",
    )
    .bind(contract.name)
    .bind(i32::try_from(contract.version).unwrap())
    .bind(fingerprint)
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn an_event_registered_with_another_shape_is_refused_before_anything_is_written() {
    let db = TestDatabase::new().await;
    create_orders(db.pool()).await;
    let contract = drift::Refused::contract();
    register(db.pool(), &contract, &"0".repeat(64)).await;

    for attempt in 0..2 {
        let mut tx = db.pool().begin().await.unwrap();
        place_order(&mut tx, &format!("o-drift-{attempt}"), 1).await;
        let refused = drift::Refused { total_cents: 1 }
            .enqueue(&mut tx, &format!("k-{attempt}"))
            .await;
        let message = match refused {
            Err(Error::ContractMismatch(message)) => message,
            other => panic!("attempt {attempt}: expected ContractMismatch, got {other:?}"),
        };
        assert!(
            message.contains("refusing to enqueue event `drift.refused` version 1")
                && message.contains(&"0".repeat(64))
                && message.contains(&contract.fingerprint())
                && message.contains("shop::Before")
                && message.contains("#[outbox(version = 2)]")
                && message.contains("Nothing was written and the transaction is still usable"),
            "{message}"
        );
        // The business transaction goes on and commits; the refusal was not cached as a pass.
        tx.commit().await.unwrap();
    }
    assert_eq!(count_orders(db.pool()).await, 2);
    assert_eq!(count_rows(db.pool()).await, 0);
}

#[tokio::test]
async fn an_event_registered_with_its_shape_or_not_registered_is_enqueued() {
    let db = TestDatabase::new().await;
    let contract = drift::Agreed::contract();
    register(db.pool(), &contract, &contract.fingerprint()).await;
    for key in ["a", "b"] {
        let mut tx = db.pool().begin().await.unwrap();
        drift::Agreed { total_cents: 1 }
            .enqueue(&mut tx, key)
            .await
            .unwrap();
        // Not registered at all: allowed, like the worker allows it.
        Note { text: key.into() }
            .enqueue(&mut tx, &format!("note-{key}"))
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    assert_eq!(count_rows(db.pool()).await, 4);
}

#[tokio::test]
async fn a_missing_registry_is_a_clear_error_and_the_transaction_still_commits() {
    let db = TestDatabase::new().await;
    create_orders(db.pool()).await;
    sqlx::query("DROP TABLE outbox_contracts")
        .execute(db.pool())
        .await
        .unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    place_order(&mut tx, "o-noreg", 1).await;
    let refused = drift::NoRegistry { total_cents: 1 }
        .enqueue(&mut tx, "k")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("`outbox_contracts` does not exist")
            && refused.contains("outbox_runtime::migrate"),
        "{refused}"
    );
    tx.commit().await.unwrap();
    assert_eq!(count_orders(db.pool()).await, 1);
    assert_eq!(count_rows(db.pool()).await, 0);
}

/// A role that may write events but not read the registry gets an error that names the grant,
/// and its business transaction goes on.
#[tokio::test]
async fn a_registry_the_role_may_not_read_is_a_clear_error_and_the_transaction_still_commits() {
    let db = TestDatabase::new().await;
    create_orders(db.pool()).await;
    let role = format!("noreg_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {role}; \
         GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}; \
         GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}; \
         REVOKE ALL ON outbox_contracts FROM {role}"
    )))
    .execute(db.pool())
    .await
    .unwrap();

    let mut tx = db.pool().begin().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SET LOCAL ROLE {role}")))
        .execute(&mut *tx)
        .await
        .unwrap();
    place_order(&mut tx, "o-denied", 1).await;
    let refused = drift::RegistryDenied { total_cents: 1 }
        .enqueue(&mut tx, "k")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("may not read the contract registry `outbox_contracts`")
            && refused.contains("outbox grants --enqueuer"),
        "{refused}"
    );
    tx.commit().await.unwrap();
    assert_eq!(count_orders(db.pool()).await, 1);
    assert_eq!(count_rows(db.pool()).await, 0);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP OWNED BY {role}; DROP ROLE {role}"
    )))
    .execute(db.pool())
    .await
    .unwrap();
}

/// The registry is read once per event type and process: once an enqueue has found the type
/// registered with its shape, or not registered (for `RECHECK_UNREGISTERED`), later enqueues
/// run no statement against it. Dropping the registry after the first enqueue shows it: a read
/// would now fail with "does not exist".
#[tokio::test]
async fn the_registry_is_read_by_the_first_enqueue_of_a_type_only() {
    let db = TestDatabase::new().await;
    let agreed = drift::KeptAgreed::contract();
    register(db.pool(), &agreed, &agreed.fingerprint()).await;
    let mut tx = db.pool().begin().await.unwrap();
    drift::KeptAgreed { total_cents: 1 }
        .enqueue(&mut tx, "agreed-1")
        .await
        .unwrap();
    drift::KeptUnregistered { total_cents: 1 }
        .enqueue(&mut tx, "unregistered-1")
        .await
        .unwrap();
    tx.commit().await.unwrap();

    sqlx::query("DROP TABLE outbox_contracts")
        .execute(db.pool())
        .await
        .unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    let agreed_again = drift::KeptAgreed { total_cents: 2 }
        .enqueue(&mut tx, "agreed-2")
        .await;
    let unregistered_again = drift::KeptUnregistered { total_cents: 2 }
        .enqueue(&mut tx, "unregistered-2")
        .await;
    assert!(
        agreed_again.is_ok(),
        "the agreeing verdict was not kept: {agreed_again:?}"
    );
    assert!(
        unregistered_again.is_ok(),
        "the not-registered verdict was not kept: {unregistered_again:?}"
    );
    tx.commit().await.unwrap();
    assert_eq!(count_rows(db.pool()).await, 4);
}

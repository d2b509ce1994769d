//! The consumer-side inbox against a real PostgreSQL: an event applied inside the consumer's
//! transaction takes effect once, however often and however concurrently it is delivered.

use std::time::Duration;

use outbox_runtime::inbox::{self, ApplyOutcome};
use outbox_runtime::testing::TestDatabase;
use sqlx::{Connection, PgPool};
use uuid::Uuid;

const CONSUMER: &str = "invoicing";

/// The consumer's own table: one row per effect applied. No unique key on purpose, so a second
/// application would show up as a second row.
async fn create_effects(pool: &PgPool) {
    sqlx::query("CREATE TABLE invoices (event_id uuid NOT NULL, amount_cents bigint NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
}

async fn effects(pool: &PgPool, event_id: Uuid) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM invoices WHERE event_id = $1")
        .bind(event_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn inbox_rows(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_inbox")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// What a consumer does with one delivery: record it in the inbox and, the first time only,
/// apply the effect, all in one transaction.
async fn consume(pool: &PgPool, event_id: Uuid) -> ApplyOutcome {
    let mut tx = pool.begin().await.unwrap();
    let outcome = inbox::apply_once(&mut tx, CONSUMER, event_id)
        .await
        .unwrap();
    if outcome == ApplyOutcome::Applied {
        sqlx::query("INSERT INTO invoices (event_id, amount_cents) VALUES ($1, 4200)")
            .bind(event_id)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    outcome
}

#[tokio::test]
async fn redeliveries_are_applied_once() {
    let db = TestDatabase::new().await;
    create_effects(db.pool()).await;
    let event_id = Uuid::new_v4();

    assert_eq!(consume(db.pool(), event_id).await, ApplyOutcome::Applied);
    for _ in 0..3 {
        assert_eq!(consume(db.pool(), event_id).await, ApplyOutcome::Duplicate);
    }

    assert_eq!(effects(db.pool(), event_id).await, 1);
    assert_eq!(inbox_rows(db.pool()).await, 1);
    assert!(
        inbox::is_applied(db.pool(), CONSUMER, event_id)
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn a_duplicate_leaves_the_consumers_transaction_usable() {
    let db = TestDatabase::new().await;
    create_effects(db.pool()).await;
    let event_id = Uuid::new_v4();
    assert_eq!(consume(db.pool(), event_id).await, ApplyOutcome::Applied);

    let mut tx = db.pool().begin().await.unwrap();
    assert_eq!(
        inbox::apply_once(&mut tx, CONSUMER, event_id)
            .await
            .unwrap(),
        ApplyOutcome::Duplicate
    );
    // Same transaction, same event again: still a duplicate, still no error.
    assert_eq!(
        inbox::apply_once(&mut tx, CONSUMER, event_id)
            .await
            .unwrap(),
        ApplyOutcome::Duplicate
    );
    // A transaction aborted by a unique violation would refuse this statement and the commit.
    let other = Uuid::new_v4();
    assert_eq!(
        inbox::apply_once(&mut tx, CONSUMER, other).await.unwrap(),
        ApplyOutcome::Applied
    );
    sqlx::query("INSERT INTO invoices (event_id, amount_cents) VALUES ($1, 1)")
        .bind(other)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    assert_eq!(effects(db.pool(), event_id).await, 1);
    assert_eq!(effects(db.pool(), other).await, 1);
    assert_eq!(inbox_rows(db.pool()).await, 2);
}

#[tokio::test]
async fn a_rolled_back_consumer_leaves_no_inbox_row_and_the_redelivery_applies() {
    let db = TestDatabase::new().await;
    create_effects(db.pool()).await;
    let event_id = Uuid::new_v4();

    // The consumer records the event and applies the effect, then fails before committing.
    let mut tx = db.pool().begin().await.unwrap();
    assert_eq!(
        inbox::apply_once(&mut tx, CONSUMER, event_id)
            .await
            .unwrap(),
        ApplyOutcome::Applied
    );
    sqlx::query("INSERT INTO invoices (event_id, amount_cents) VALUES ($1, 4200)")
        .bind(event_id)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    assert_eq!(
        inbox_rows(db.pool()).await,
        0,
        "the inbox row rolled back with the effect"
    );
    assert_eq!(effects(db.pool(), event_id).await, 0);
    assert!(
        !inbox::is_applied(db.pool(), CONSUMER, event_id)
            .await
            .unwrap()
    );

    // The redelivery applies it.
    assert_eq!(consume(db.pool(), event_id).await, ApplyOutcome::Applied);
    assert_eq!(effects(db.pool(), event_id).await, 1);
}

/// Two deliveries of one event at the same time, on two connections: the second waits for the
/// first transaction and then sees the duplicate (or, if the first rolled back, applies it).
#[tokio::test]
async fn concurrent_duplicates_on_two_connections_apply_one_effect() {
    for first_commits in [true, false] {
        let db = TestDatabase::new().await;
        create_effects(db.pool()).await;
        let event_id = Uuid::new_v4();

        let mut first = db.connect().await;
        let mut first_tx = first.begin().await.unwrap();
        assert_eq!(
            inbox::apply_once(&mut first_tx, CONSUMER, event_id)
                .await
                .unwrap(),
            ApplyOutcome::Applied
        );
        sqlx::query("INSERT INTO invoices (event_id, amount_cents) VALUES ($1, 4200)")
            .bind(event_id)
            .execute(&mut *first_tx)
            .await
            .unwrap();

        // The second delivery, on its own connection, while the first is still open.
        let mut second = db.connect().await;
        let second_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut second)
            .await
            .unwrap();
        let second_delivery = tokio::spawn(async move {
            let mut tx = second.begin().await.unwrap();
            let outcome = inbox::apply_once(&mut tx, CONSUMER, event_id)
                .await
                .unwrap();
            if outcome == ApplyOutcome::Applied {
                sqlx::query("INSERT INTO invoices (event_id, amount_cents) VALUES ($1, 4200)")
                    .bind(event_id)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
            }
            tx.commit().await.unwrap();
            outcome
        });

        // Wait (on the database's word, not a timer) until the second is blocked on the first's
        // key; bounded, so a second apply that neither waits nor finishes fails the test.
        let blocked = async {
            loop {
                let waiting: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock')",
                )
                .bind(second_pid)
                .fetch_one(db.pool())
                .await
                .unwrap();
                if waiting {
                    break;
                }
                assert!(
                    !second_delivery.is_finished(),
                    "the second apply must wait for the first transaction"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), blocked)
            .await
            .expect("the second apply waits on the first's lock within 10 s");

        if first_commits {
            first_tx.commit().await.unwrap();
            assert_eq!(second_delivery.await.unwrap(), ApplyOutcome::Duplicate);
        } else {
            first_tx.rollback().await.unwrap();
            assert_eq!(second_delivery.await.unwrap(), ApplyOutcome::Applied);
        }
        assert_eq!(
            effects(db.pool(), event_id).await,
            1,
            "first_commits = {first_commits}"
        );
        assert_eq!(inbox_rows(db.pool()).await, 1);
    }
}

#[tokio::test]
async fn many_concurrent_deliveries_of_one_event_apply_it_once() {
    let db = TestDatabase::with_pool_size(12).await;
    create_effects(db.pool()).await;
    let event_id = Uuid::new_v4();

    let deliveries: Vec<_> = (0..10)
        .map(|_| {
            let pool = db.pool().clone();
            tokio::spawn(async move { consume(&pool, event_id).await })
        })
        .collect();
    let mut applied = 0;
    for d in deliveries {
        if d.await.unwrap() == ApplyOutcome::Applied {
            applied += 1;
        }
    }

    assert_eq!(applied, 1);
    assert_eq!(effects(db.pool(), event_id).await, 1);
}

#[tokio::test]
async fn consumers_apply_the_same_event_independently() {
    let db = TestDatabase::new().await;
    let event_id = Uuid::new_v4();
    let mut tx = db.pool().begin().await.unwrap();
    assert_eq!(
        inbox::apply_once(&mut tx, "invoicing", event_id)
            .await
            .unwrap(),
        ApplyOutcome::Applied
    );
    assert_eq!(
        inbox::apply_once(&mut tx, "shipping", event_id)
            .await
            .unwrap(),
        ApplyOutcome::Applied
    );
    assert_eq!(
        inbox::apply_once(&mut tx, "shipping", event_id)
            .await
            .unwrap(),
        ApplyOutcome::Duplicate
    );
    tx.commit().await.unwrap();
    assert_eq!(inbox_rows(db.pool()).await, 2);
}

#[tokio::test]
async fn an_invalid_consumer_name_is_an_error_that_leaves_the_transaction_usable() {
    let db = TestDatabase::new().await;
    let mut tx = db.pool().begin().await.unwrap();
    let err = inbox::apply_once(&mut tx, "", Uuid::new_v4())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("consumer name must be 1 to 200 characters"),
        "{err}"
    );
    let err = inbox::apply_once(&mut tx, &"x".repeat(201), Uuid::new_v4())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("got 201 characters"), "{err}");
    assert_eq!(
        inbox::apply_once(&mut tx, CONSUMER, Uuid::new_v4())
            .await
            .unwrap(),
        ApplyOutcome::Applied
    );
    tx.commit().await.unwrap();
    assert_eq!(inbox_rows(db.pool()).await, 1);
}

#[tokio::test]
async fn purge_deletes_only_rows_older_than_the_retention() {
    let db = TestDatabase::new().await;
    create_effects(db.pool()).await;
    let old: Vec<Uuid> = (0..3).map(|_| Uuid::new_v4()).collect();
    let recent = Uuid::new_v4();
    for id in old.iter().chain([&recent]) {
        assert_eq!(consume(db.pool(), *id).await, ApplyOutcome::Applied);
    }
    // Age three rows by the database clock (the test cannot wait two days).
    sqlx::query(
        "UPDATE outbox_inbox SET received_at = now() - interval '2 days' WHERE event_id = ANY($1)",
    )
    .bind(&old)
    .execute(db.pool())
    .await
    .unwrap();

    let deleted = inbox::purge(db.pool(), Duration::from_secs(24 * 3600))
        .await
        .unwrap();

    assert_eq!(deleted, 3);
    assert_eq!(inbox_rows(db.pool()).await, 1);
    assert!(
        inbox::is_applied(db.pool(), CONSUMER, recent)
            .await
            .unwrap()
    );
    for id in &old {
        assert!(!inbox::is_applied(db.pool(), CONSUMER, *id).await.unwrap());
    }
    // A retention shorter than the redelivery horizon has a price, which the docs name: a
    // duplicate arriving after its row was purged is applied again.
    assert_eq!(consume(db.pool(), old[0]).await, ApplyOutcome::Applied);
    assert_eq!(effects(db.pool(), old[0]).await, 2);
    // The recent row is still within retention.
    assert_eq!(
        inbox::purge(db.pool(), Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
}

//! Claiming: competing connections never share a row, many workers drain a queue exactly once,
//! per-aggregate order holds, and the lease comes from the database clock.

mod store_support;

use std::collections::HashSet;
use std::time::Duration;

use outbox_runtime::Store;
use outbox_runtime::store::sql::{STATEMENTS, TABLE_PLACEHOLDER};
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::{Event, store::FailOutcome, store::Ownership};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, Row};
use store_support::{
    Note, OrderPlaced, all_rows, count_queue_rows, count_rows, count_status, enqueue_notes,
};

fn statement(name: &str) -> String {
    let (_, sql) = STATEMENTS
        .iter()
        .find(|(n, _)| *n == name)
        .expect("statement exists");
    sql.replace(TABLE_PLACEHOLDER, "outbox")
}

const LONG_LEASE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn an_open_claim_transaction_is_skipped_by_a_competing_connection() {
    let db = TestDatabase::new().await;
    enqueue_notes(db.pool(), "skip", 10).await;
    let store = Store::new(db.pool().clone());

    // Connection A runs the claim statement inside a transaction it does not commit yet.
    let mut a = db.connect().await;
    let mut a_tx = a.begin().await.unwrap();
    let claim_sql = statement("claim_batch");
    let a_ids: HashSet<i64> = sqlx::query(sqlx::AssertSqlSafe(claim_sql))
        .bind(4_i64)
        .bind(60_000_000_i64)
        .bind("worker-a")
        .fetch_all(&mut *a_tx)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get("id"))
        .collect();
    assert_eq!(a_ids.len(), 4);

    // Connection B (the store, on the pool) claims everything it can while A holds its rows.
    let b = store
        .claim_batch("worker-b", 100, LONG_LEASE, false)
        .await
        .unwrap();
    let b_ids: HashSet<i64> = b.iter().map(|e| e.id).collect();
    assert_eq!(b_ids.len(), 6, "B gets exactly the rows A does not hold");
    assert!(a_ids.is_disjoint(&b_ids), "no row may be claimed by both");
    assert!(
        store
            .claim_batch("worker-b", 100, LONG_LEASE, false)
            .await
            .unwrap()
            .is_empty()
    );

    // B's claim is committed; A's is not visible to others yet.
    for row in all_rows(db.pool()).await {
        if b_ids.contains(&row.id) {
            assert_eq!(
                (
                    row.status.as_str(),
                    row.claimed_by.as_deref(),
                    row.claim_version
                ),
                ("processing", Some("worker-b"), Some(1))
            );
        } else {
            assert!(a_ids.contains(&row.id));
            assert_eq!(
                (row.status.as_str(), row.claim_version),
                ("pending", Some(0))
            );
        }
    }

    a_tx.commit().await.unwrap();
    for row in all_rows(db.pool()).await {
        let owner = if a_ids.contains(&row.id) {
            "worker-a"
        } else {
            "worker-b"
        };
        assert_eq!(
            (
                row.status.as_str(),
                row.claimed_by.as_deref(),
                row.claim_version,
                row.attempts
            ),
            ("processing", Some(owner), Some(1), Some(1))
        );
    }
    assert!(
        store
            .claim_batch("worker-b", 100, LONG_LEASE, false)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn eight_connections_deliver_twenty_thousand_events_exactly_once() {
    const EVENTS: usize = 20_000;
    const WORKERS: usize = 8;
    let db = TestDatabase::new().await;
    enqueue_notes(db.pool(), "bulk", EVENTS).await;

    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        // Each worker has a connection of its own.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(db.connect_options().clone())
            .await
            .unwrap();
        let store = Store::new(pool);
        tasks.push(tokio::spawn(async move {
            let name = format!("worker-{w}");
            let mut delivered = Vec::new();
            loop {
                let batch = store
                    .claim_batch(&name, 100, LONG_LEASE, false)
                    .await
                    .unwrap();
                if batch.is_empty() {
                    break;
                }
                let claims: Vec<_> = batch.iter().map(|e| e.claim()).collect();
                let lost = store.complete_many_if_owned(&claims).await.unwrap();
                assert!(lost.is_empty(), "{name} lost live claims: {lost:?}");
                // A delivered event keeps no claim version or attempt count, so the claim
                // itself says whether it was the event's first.
                for e in &batch {
                    assert_eq!(
                        (e.claim_version, e.attempts),
                        (1, 1),
                        "{name} claimed event {} a second time",
                        e.id
                    );
                }
                delivered.extend(batch.iter().map(|e| e.id));
            }
            delivered
        }));
    }
    let mut seen = HashSet::new();
    let mut per_worker = Vec::new();
    for t in tasks {
        let delivered = t.await.unwrap();
        per_worker.push(delivered.len());
        for id in delivered {
            assert!(seen.insert(id), "event {id} was delivered twice");
        }
    }
    let elapsed = started.elapsed();
    println!(
        "8 workers claimed+completed {EVENTS} events in {elapsed:?} ({:.0} events/s); per worker: {per_worker:?}",
        EVENTS as f64 / elapsed.as_secs_f64()
    );
    assert_eq!(seen.len(), EVENTS);
    assert!(
        per_worker.iter().filter(|&&n| n > 0).count() >= 2,
        "the workers ran in parallel"
    );

    // The database's record: every event kept and delivered (no queue row left), nothing left
    // over.
    assert_eq!(count_rows(db.pool()).await, EVENTS as i64);
    assert_eq!(count_status(db.pool(), "delivered").await, EVENTS as i64);
    assert_eq!(count_queue_rows(db.pool()).await, 0);
    assert_eq!(count_status(db.pool(), "pending").await, 0);
    assert_eq!(count_status(db.pool(), "processing").await, 0);
}

#[tokio::test]
async fn ordered_claim_delivers_an_aggregate_one_event_at_a_time() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let mut tx = db.pool().begin().await.unwrap();
    for (key, order) in [("a1", "A"), ("a2", "A"), ("b1", "B"), ("a3", "A")] {
        OrderPlaced {
            order_id: order.into(),
            total_cents: 1,
        }
        .enqueue(&mut tx, key)
        .await
        .unwrap();
    }
    Note {
        text: "free".into(),
    }
    .enqueue(&mut tx, "n1")
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let pool = db.pool().clone();
    let key_of = |id: i64| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT operation_key FROM outbox WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };

    let first = store.claim_batch("w", 10, LONG_LEASE, true).await.unwrap();
    let mut keys = Vec::new();
    for e in &first {
        keys.push(key_of(e.id).await);
    }
    assert_eq!(
        keys,
        ["a1", "b1", "n1"],
        "only the first event of each aggregate, plus events without one"
    );
    assert!(
        store
            .claim_batch("w", 10, LONG_LEASE, true)
            .await
            .unwrap()
            .is_empty(),
        "a2 waits while a1 is processing"
    );

    let a1 = first[0].claim();
    assert_eq!(store.complete_if_owned(a1).await.unwrap(), Ownership::Owned);
    let second = store.claim_batch("w", 10, LONG_LEASE, true).await.unwrap();
    assert_eq!(second.len(), 1);
    assert_eq!(key_of(second[0].id).await, "a2");

    // a2 fails for good: exhausted events do not block the rest of their aggregate.
    assert_eq!(
        store
            .fail_if_owned(second[0].claim(), "poison", Duration::ZERO, true)
            .await
            .unwrap(),
        FailOutcome::Exhausted
    );
    let third = store.claim_batch("w", 10, LONG_LEASE, true).await.unwrap();
    assert_eq!(third.len(), 1);
    assert_eq!(key_of(third[0].id).await, "a3");

    // A retried (pending again) earlier event blocks the later ones again.
    let mut tx = db.pool().begin().await.unwrap();
    OrderPlaced {
        order_id: "C".into(),
        total_cents: 1,
    }
    .enqueue(&mut tx, "c1")
    .await
    .unwrap();
    OrderPlaced {
        order_id: "C".into(),
        total_cents: 2,
    }
    .enqueue(&mut tx, "c2")
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let c1 = store.claim_batch("w", 10, LONG_LEASE, true).await.unwrap();
    assert_eq!(c1.len(), 1);
    assert_eq!(key_of(c1[0].id).await, "c1");
    assert_eq!(
        store
            .fail_if_owned(
                c1[0].claim(),
                "receiver down",
                Duration::from_secs(3600),
                false
            )
            .await
            .unwrap(),
        FailOutcome::Rescheduled
    );
    assert!(
        store
            .claim_batch("w", 10, LONG_LEASE, true)
            .await
            .unwrap()
            .is_empty(),
        "c2 waits for c1's retry"
    );
    // Unordered claims do not wait.
    let unordered = store.claim_batch("w", 10, LONG_LEASE, false).await.unwrap();
    assert_eq!(unordered.len(), 1);
    assert_eq!(key_of(unordered[0].id).await, "c2");
}

/// The lease is the database's now() + lease: the API takes a duration and no timestamp, so
/// the worker's clock (and its session's time zone) cannot move it.
#[tokio::test]
async fn the_lease_is_computed_by_the_database_clock() {
    let db = TestDatabase::new().await;
    enqueue_notes(db.pool(), "clock", 4).await;

    // Through the store: the lease ends lease after the database's now(), within the time
    // the statement and the round trip took.
    let store = Store::new(db.pool().clone());
    let lease = Duration::from_secs(90);
    let claimed = store.claim_batch("w", 1, lease, false).await.unwrap();
    let db_now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(db.pool())
        .await
        .unwrap();
    let remaining = (claimed[0].lease_until - db_now).to_std().unwrap();
    assert!(
        remaining <= lease && remaining > lease - Duration::from_secs(5),
        "lease_until - now() = {remaining:?}"
    );

    // Exactly: the claim statement inside a transaction, whose now() is fixed, from a session
    // whose time zone is 14 hours ahead; then from one 10 hours behind.
    for zone in ["Pacific/Kiritimati", "Pacific/Honolulu"] {
        let mut conn = db.connect().await;
        sqlx::query(sqlx::AssertSqlSafe(format!("SET TIME ZONE '{zone}'")))
            .execute(&mut conn)
            .await
            .unwrap();
        let mut tx = conn.begin().await.unwrap();
        let lease_until: chrono::DateTime<chrono::Utc> =
            sqlx::query(sqlx::AssertSqlSafe(statement("claim_batch")))
                .bind(1_i64)
                .bind(90_000_000_i64)
                .bind("w-tz")
                .fetch_one(&mut *tx)
                .await
                .unwrap()
                .get("lease_until");
        let db_now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_eq!(
            lease_until - db_now,
            chrono::Duration::seconds(90),
            "session time zone {zone}"
        );
        tx.commit().await.unwrap();
    }

    // Availability is the database's decision too: an event scheduled an hour ahead by the
    // database clock is not claimable, whatever the caller believes the time is.
    sqlx::query(
        "UPDATE outbox_queue SET available_at = now() + interval '1 hour' WHERE status = 'pending'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    assert!(
        store
            .claim_batch("w", 10, lease, false)
            .await
            .unwrap()
            .is_empty()
    );
    sqlx::query(
        "UPDATE outbox_queue SET available_at = now() - interval '1 second' WHERE status = 'pending'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    assert_eq!(
        store
            .claim_batch("w", 10, lease, false)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(count_status(db.pool(), "processing").await, 4);
}

/// Behind one aggregate's backlog far longer than a claim's limit (and than any bounded first
/// walk a cheaper claim might make, see docs/ordering.md), the ordered claim still finds the
/// other aggregates' heads and the events without an aggregate queued after it, and the chain's
/// head; it never returns an event while an earlier event of its aggregate is open, and drains
/// the chain one event at a time in id order.
#[tokio::test]
async fn ordered_claim_behind_a_long_backlog_finds_heads_and_never_a_blocked_event() {
    const CHAIN: usize = 200;
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let mut tx = db.pool().begin().await.unwrap();
    for i in 0..CHAIN {
        OrderPlaced {
            order_id: "L".into(),
            total_cents: i as i64,
        }
        .enqueue(&mut tx, &format!("l{i}"))
        .await
        .unwrap();
    }
    for (key, order) in [("b1", "B"), ("b2", "B")] {
        OrderPlaced {
            order_id: order.into(),
            total_cents: 1,
        }
        .enqueue(&mut tx, key)
        .await
        .unwrap();
    }
    Note {
        text: "free".into(),
    }
    .enqueue(&mut tx, "n1")
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let pool = db.pool().clone();
    let keys_of = |ids: Vec<i64>| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT operation_key FROM outbox WHERE id = ANY ($1) ORDER BY id",
            )
            .bind(ids)
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    // Claimed events whose aggregate has an earlier open event: must stay empty. The aggregate
    // is read from the events themselves (not the queue's copy of it); open is a queue row that
    // is not exhausted.
    let blocked_among = |ids: Vec<i64>| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT o.operation_key FROM outbox o
                 WHERE o.id = ANY ($1) AND EXISTS (
                     SELECT 1 FROM outbox e JOIN outbox_queue q ON q.id = e.id
                     WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id
                       AND e.id < o.id AND q.exhausted_at IS NULL)",
            )
            .bind(ids)
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };

    let first = store.claim_batch("w", 10, LONG_LEASE, true).await.unwrap();
    let ids: Vec<i64> = first.iter().map(|e| e.id).collect();
    assert_eq!(
        keys_of(ids.clone()).await,
        ["l0", "b1", "n1"],
        "the chain's head, the head of B and the event without aggregate, all queued behind \
         or after {CHAIN} events of L"
    );
    assert_eq!(blocked_among(ids).await, Vec::<String>::new());
    let b1 = first
        .iter()
        .find(|e| e.aggregate_id.as_deref() == Some("B"))
        .unwrap();
    assert_eq!(
        store.complete_if_owned(b1.claim()).await.unwrap(),
        Ownership::Owned
    );
    let second = store.claim_batch("w", 10, LONG_LEASE, true).await.unwrap();
    assert_eq!(
        keys_of(second.iter().map(|e| e.id).collect()).await,
        ["b2"],
        "b2 follows b1 while l0 is still processing and l1.. wait behind it"
    );

    // Drain the chain: every claim returns exactly the next event of L, and nothing blocked.
    let mut held = first
        .into_iter()
        .find(|e| e.aggregate_id.as_deref() == Some("L"))
        .unwrap();
    for i in 1..CHAIN {
        assert_eq!(
            store.complete_if_owned(held.claim()).await.unwrap(),
            Ownership::Owned
        );
        let next = store.claim_batch("w", 10, LONG_LEASE, true).await.unwrap();
        let ids: Vec<i64> = next.iter().map(|e| e.id).collect();
        assert_eq!(blocked_among(ids.clone()).await, Vec::<String>::new());
        assert_eq!(
            keys_of(ids).await,
            [format!("l{i}")],
            "claim {i} of the chain"
        );
        held = next.into_iter().next().unwrap();
    }
}

/// A claim reports how long the event waited to be claimed (since it became claimable) and how
/// old it is (since its enqueue), both by the database clock: the worker's claim-wait and
/// end-to-end latency histograms are built from these two. The rows are backdated, so the
/// expected figures are known without waiting, and the two are distinguishable.
#[tokio::test]
async fn a_claim_reports_the_wait_and_the_age_by_the_database_clock() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    for ordered in [false, true] {
        enqueue_notes(db.pool(), &format!("aged, ordered: {ordered}"), 1).await;
        sqlx::query(
            "WITH due AS (
                 UPDATE outbox_queue SET available_at = now() - interval '30 minutes'
                 WHERE status = 'pending' RETURNING id
             )
             UPDATE outbox SET created_at = now() - interval '1 hour'
             WHERE id IN (SELECT id FROM due)",
        )
        .execute(db.pool())
        .await
        .unwrap();
        let claimed = store
            .claim_batch("worker-a", 10, LONG_LEASE, ordered)
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1, "ordered: {ordered}");
        let event = &claimed[0];
        // The claim's statement runs within a minute of the backdating one.
        let within_a_minute_after =
            |d: Duration, of: u64| d >= Duration::from_secs(of) && d < Duration::from_secs(of + 60);
        assert!(
            within_a_minute_after(event.since_enqueue, 3600),
            "ordered: {ordered}: since_enqueue {:?}, expected an hour",
            event.since_enqueue
        );
        assert!(
            within_a_minute_after(event.waited, 1800),
            "ordered: {ordered}: waited {:?}, expected half an hour",
            event.waited
        );
        assert_eq!(
            store.complete_if_owned(event.claim()).await.unwrap(),
            Ownership::Owned
        );
    }
}

//! In-process workers: shutdown (unstarted claims handed back uncharged, in-flight deliveries
//! finished, the deadline cancelling the rest), lease loss found by the renewer, and the
//! maintenance leader (one at a time, recovery, purge, hand-over).

mod worker_support;

use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::worker::{Worker, WorkerEvent};
use tokio::sync::Semaphore;
use worker_support::receiver::{Knobs, Receiver};
use worker_support::*;

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_hands_back_unstarted_claims_without_charging_an_attempt() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 6, false).await;
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    // A closed gate: claimed deliveries wait before the sink, i.e. claimed but not started.
    let worker = Worker::builder(
        pool.clone(),
        Receiver::new(pool.clone(), "gated", Knobs::default()),
    )
    .name("gated")
    .concurrency(4)
    .start_gate(Arc::new(Semaphore::new(0)))
    .events(tx)
    .start()
    .await
    .unwrap();
    let claimed = wait_event(&mut events, WAIT, "a claimed batch", |e| {
        matches!(e, WorkerEvent::ClaimedBatch(_))
    })
    .await;
    let WorkerEvent::ClaimedBatch(claims) = claimed else {
        unreachable!()
    };
    assert_eq!(claims.len(), 4, "claims only its 4 free slots");
    assert_eq!(count_claimed_by(&pool, "gated", "processing").await, 4);
    worker.shutdown().await;
    worker.shutdown().await; // idempotent

    let after = rows(&pool).await;
    assert!(
        after
            .iter()
            .all(|r| r.status == "pending" && r.attempts == 0),
        "{after:?}"
    );
    assert_eq!(
        received(&pool).await.len(),
        0,
        "the receiver never saw them"
    );
    assert_eq!(worker.counters().released, 4);

    let next = Worker::builder(
        pool.clone(),
        Receiver::new(pool.clone(), "next", Knobs::default()),
    )
    .start()
    .await
    .unwrap();
    wait_until(WAIT, "another worker delivers all 6", || async {
        count_status(&pool, "delivered").await == 6
    })
    .await;
    next.shutdown().await;
    assert!(rows(&pool).await.iter().all(|r| r.attempts == 1));
    assert_eq!(received(&pool).await.len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_running_deliveries_finish() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 4, false).await;
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let knobs = Knobs {
        delay: Duration::from_millis(800),
        ..Default::default()
    };
    let worker = Worker::builder(pool.clone(), Receiver::new(pool.clone(), "w", knobs))
        .concurrency(4)
        .events(tx)
        .start()
        .await
        .unwrap();
    wait_event(
        &mut events,
        WAIT,
        "a claimed batch",
        |e| matches!(e, WorkerEvent::ClaimedBatch(c) if c.len() == 4),
    )
    .await;
    // The hook fires when the claim returns; give the delivery tasks a moment to start, or
    // shutdown would (rightly) hand them back unstarted.
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.shutdown().await;
    assert!(worker.is_stopped());
    assert_eq!(
        count_status(&pool, "delivered").await,
        4,
        "in-flight deliveries were finished and completed"
    );
    assert_eq!(received(&pool).await.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_deadline_running_deliveries_are_told_to_stop_and_handed_back() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 2, false).await;
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let knobs = Knobs {
        delay: Duration::from_secs(60),
        stop_on_lease_lost: true,
        ..Default::default()
    };
    let worker = Worker::builder(pool.clone(), Receiver::new(pool.clone(), "w", knobs))
        .shutdown_deadline(Duration::from_millis(300))
        .events(tx)
        .start()
        .await
        .unwrap();
    wait_event(
        &mut events,
        WAIT,
        "a claimed batch",
        |e| matches!(e, WorkerEvent::ClaimedBatch(c) if c.len() == 2),
    )
    .await;
    // The hook fires when the claim returns; give the delivery tasks a moment to start, or
    // shutdown would (rightly) hand them back unstarted.
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.shutdown().await;
    let after = rows(&pool).await;
    assert!(
        after
            .iter()
            .all(|r| r.status == "pending" && r.attempts == 1 && r.handler_failures == 1),
        "{after:?}"
    );
    let log = received(&pool).await;
    assert_eq!(
        log.iter()
            .filter(|r| r.outcome == "stopped_lease_lost")
            .count(),
        2,
        "{log:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_renewer_tells_a_handler_its_lease_was_lost() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 1, false).await;
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let knobs = Knobs {
        delay: Duration::from_secs(60),
        stop_on_lease_lost: true,
        ..Default::default()
    };
    let worker = Worker::builder(pool.clone(), Receiver::new(pool.clone(), "w", knobs))
        .lease(Duration::from_secs(3))
        .renew_interval(Duration::from_millis(200))
        .maintenance(false)
        .events(tx)
        .start()
        .await
        .unwrap();
    wait_event(&mut events, WAIT, "a claimed batch", |e| {
        matches!(e, WorkerEvent::ClaimedBatch(_))
    })
    .await;
    // Another claim takes the row (as after recovery): the fencing token moves on.
    sqlx::query("UPDATE outbox SET claim_version = claim_version + 1, claimed_by = 'thief'")
        .execute(&pool)
        .await
        .unwrap();
    wait_event(&mut events, WAIT, "lease lost", |e| {
        matches!(e, WorkerEvent::LeaseLost(_))
    })
    .await;
    wait_until(WAIT, "the handler stopped", || async {
        received(&pool).await.len() == 1
    })
    .await;
    worker.shutdown().await;
    let row = rows(&pool).await.remove(0);
    assert_eq!(
        (
            row.status.as_str(),
            row.claimed_by.as_deref(),
            row.handler_failures
        ),
        ("processing", Some("thief"), 0)
    );
    assert_eq!(received(&pool).await[0].outcome, "stopped_lease_lost");
    let c = worker.counters();
    assert_eq!(c.lease_lost, 1);
    assert_eq!(c.stale_completions, 1, "its failure report was refused too");
}

async fn maintenance_leaders(pool: &sqlx::PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'advisory' AND l.granted AND a.datname = current_database()",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_maintenance_leader_recovers_purges_and_hands_over() {
    let db = database().await;
    let pool = db.pool().clone();
    let start = |name: &str| {
        Worker::builder(
            pool.clone(),
            Receiver::new(pool.clone(), name, Knobs::default()),
        )
        .name(name)
        .maintenance_interval(Duration::from_millis(100))
        .retention(Some(Duration::from_secs(1)))
        .poll_interval(Duration::from_millis(100))
        .start()
    };
    // An orphaned claim (a worker that died): claimed with a short lease by nobody alive, before
    // any worker runs (a running worker, woken by the enqueue, could claim the rows first).
    enqueue_jobs(&pool, 0, 3, false).await;
    let store = outbox_runtime::Store::new(pool.clone());
    let orphans = store
        .claim_batch("dead-worker", 3, Duration::from_millis(300), false)
        .await
        .unwrap();
    assert_eq!(orphans.len(), 3);
    let a = start("m-a").await.unwrap();
    let b = start("m-b").await.unwrap();
    let c = start("m-c").await.unwrap();
    wait_until(WAIT, "a maintenance leader is elected", || async {
        maintenance_leaders(&pool).await.len() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await; // several ticks of all three
    let leaders = maintenance_leaders(&pool).await;
    assert_eq!(leaders.len(), 1, "exactly one leader: {leaders:?}");

    wait_until(WAIT, "recovered and delivered", || async {
        received(&pool).await.len() == 3
    })
    .await;
    for r in rows(&pool).await {
        assert_eq!(r.lease_expiries, 1, "{r:?}");
    }
    // Delivered rows go after retention (1 s).
    wait_until(WAIT, "delivered rows purged", || async {
        rows(&pool).await.is_empty()
    })
    .await;
    assert_eq!(effects(&pool).await, 3);

    // The leader stops: another worker takes over.
    let leader = leaders[0].clone();
    let (stop_first, rest): (Vec<_>, Vec<_>) = [a, b, c]
        .into_iter()
        .partition(|w| leader.ends_with(w.name()));
    for w in &stop_first {
        w.shutdown().await;
    }
    wait_until(WAIT, "a new leader", || async {
        let now = maintenance_leaders(&pool).await;
        now.len() == 1 && now[0] != leader
    })
    .await;
    for w in &rest {
        w.shutdown().await;
    }
    assert!(
        maintenance_leaders(&pool).await.is_empty(),
        "leadership released at shutdown"
    );
}

//! In-process workers delivering end to end: everything enqueued arrives once, completions are
//! batched, claiming respects free capacity, wake-ups come from NOTIFY, and poll-only works.

mod worker_support;

use std::collections::HashMap;
use std::time::Duration;

use outbox_runtime::worker::Worker;
use worker_support::receiver::{Knobs, Receiver};
use worker_support::*;

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivers_every_event_once_and_marks_it_delivered() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 200, true).await;

    let worker = Worker::builder(
        pool.clone(),
        Receiver::new(pool.clone(), "w1", Knobs::default()),
    )
    .name("w1")
    .concurrency(8)
    .start()
    .await
    .unwrap();
    wait_until(WAIT, "all 200 events are delivered", || async {
        count_status(&pool, "delivered").await == 200
    })
    .await;
    worker.shutdown().await;

    let rows = rows(&pool).await;
    assert!(rows.iter().all(|r| r.status == "delivered"
        && r.attempts == 1
        && r.claimed_by.as_deref() == Some("w1")));
    let log = received(&pool).await;
    assert_eq!(log.len(), 200, "the receiver saw each event exactly once");
    let mut per_event: HashMap<uuid::Uuid, usize> = HashMap::new();
    for r in &log {
        *per_event.entry(r.event_id).or_default() += 1;
        assert_eq!(r.idempotency_key, r.event_id.to_string());
        assert_eq!(r.attempt, 1);
        assert_eq!(r.outcome, "ok");
    }
    assert!(rows.iter().all(|r| per_event.get(&r.event_id) == Some(&1)));
    assert_eq!(effects(&pool).await, 200);
    let c = worker.counters();
    assert_eq!(c.delivered, 200);
    assert_eq!(c.stale_completions, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retention_of_zero_deletes_each_row_as_its_delivery_completes() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 300, true).await;
    let event_ids: std::collections::HashSet<uuid::Uuid> =
        rows(&pool).await.iter().map(|r| r.event_id).collect();
    assert_eq!(event_ids.len(), 300);

    let worker = Worker::builder(
        pool.clone(),
        Receiver::new(pool.clone(), "w1", Knobs::default()),
    )
    .name("w1")
    .concurrency(16)
    .batch_size(8)
    .retention(Some(Duration::ZERO))
    .start()
    .await
    .unwrap();
    wait_until(WAIT, "all 300 rows are gone", || async {
        rows(&pool).await.is_empty()
    })
    .await;
    worker.shutdown().await;

    // Gone from the table, and every one of them reached the receiver exactly once.
    let log = received(&pool).await;
    assert_eq!(log.len(), 300, "the receiver saw each event exactly once");
    let seen: std::collections::HashSet<uuid::Uuid> = log.iter().map(|r| r.event_id).collect();
    assert_eq!(seen, event_ids);
    assert_eq!(effects(&pool).await, 300);
    let c = worker.counters();
    assert_eq!(c.delivered, 300);
    assert_eq!(c.stale_completions, 0);
}

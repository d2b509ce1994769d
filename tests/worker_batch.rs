//! A worker whose sink has a batch API (`Sink::max_batch() > 1`) delivers chunks through
//! `Sink::deliver_batch`, and applies each item's result on its own: accepted items are
//! delivered, refused ones retried or exhausted, items without a result retried, none lost.

mod worker_support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use outbox_runtime::store::ClaimedEvent;
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::worker::{RetryPolicy, Worker, WorkerHandle};
use outbox_runtime::{Delivery, HandlerError, Sink};
use sqlx::PgPool;

const MAX_BATCH: usize = 10;
const WAIT: Duration = Duration::from_secs(60);

/// How the test sink answers a batch.
#[derive(Clone, Copy)]
enum Answer {
    /// Every item accepted.
    AcceptAll,
    /// Items whose payload number is odd are refused permanently.
    RefuseOdd,
    /// The first call (the first recorded) returns three results too few; later calls answer
    /// every item.
    ShortOnce,
}

/// One item of a `deliver_batch` call, as the sink saw it.
#[derive(Debug, Clone)]
struct Item {
    /// The payload number.
    n: i64,
    /// The attempt this delivery is (charged by its claim).
    attempt: i32,
    /// The reason the last failure stored on the event's queue row. Read during the delivery:
    /// once delivered, the event keeps no queue row, so no reason either.
    last_error: Option<String>,
}

/// Records every `deliver_batch` call: its size and the items it carried.
struct BatchSink {
    answer: Answer,
    pool: PgPool,
    calls: Mutex<Vec<Vec<Item>>>,
}

impl BatchSink {
    fn new(answer: Answer, pool: &PgPool) -> Arc<Self> {
        Arc::new(BatchSink {
            answer,
            pool: pool.clone(),
            calls: Mutex::new(Vec::new()),
        })
    }

    /// The payload numbers of every call.
    fn calls(&self) -> Vec<Vec<i64>> {
        self.items()
            .iter()
            .map(|call| call.iter().map(|i| i.n).collect())
            .collect()
    }

    fn items(&self) -> Vec<Vec<Item>> {
        self.calls.lock().unwrap().clone()
    }

    /// Every delivery of item `n`, in call order.
    fn deliveries_of(&self, n: i64) -> Vec<Item> {
        self.items()
            .concat()
            .into_iter()
            .filter(|i| i.n == n)
            .collect()
    }
}

fn number(event: &ClaimedEvent) -> i64 {
    event.payload["n"].as_i64().expect("test payloads carry n")
}

impl Sink for BatchSink {
    fn deliver<'a>(
        &'a self,
        _event: &'a ClaimedEvent,
        _delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async { panic!("a sink with a batch API must be called through deliver_batch") })
    }

    fn max_batch(&self) -> usize {
        MAX_BATCH
    }

    fn deliver_batch<'a>(
        &'a self,
        items: &'a [(ClaimedEvent, Delivery)],
    ) -> BoxFuture<'a, Vec<Result<(), HandlerError>>> {
        Box::pin(async move {
            let ids: Vec<i64> = items.iter().map(|(e, _)| e.id).collect();
            let reasons: HashMap<i64, Option<String>> =
                sqlx::query_as("SELECT id, last_error FROM outbox_queue WHERE id = ANY($1)")
                    .bind(&ids)
                    .fetch_all(&self.pool)
                    .await
                    .expect("reading the items' queue rows")
                    .into_iter()
                    .collect();
            let numbers: Vec<i64> = items.iter().map(|(e, _)| number(e)).collect();
            let seen = items
                .iter()
                .map(|(e, _)| Item {
                    n: number(e),
                    attempt: e.attempts,
                    last_error: reasons.get(&e.id).cloned().flatten(),
                })
                .collect();
            // Chunks run concurrently: the call that is recorded first must be the one that is
            // shortened, so both happen under the one lock.
            let mut calls = self.calls.lock().unwrap();
            calls.push(seen);
            let mut results: Vec<Result<(), HandlerError>> = numbers
                .iter()
                .map(|n| match self.answer {
                    Answer::RefuseOdd if n % 2 == 1 => Err(HandlerError::permanent(format!(
                        "receiver refused odd item {n}"
                    ))),
                    _ => Ok(()),
                })
                .collect();
            if matches!(self.answer, Answer::ShortOnce) && calls.len() == 1 && results.len() > 3 {
                results.truncate(results.len() - 3);
            }
            drop(calls);
            results
        })
    }
}

async fn insert_events(pool: &PgPool, n: i64) {
    worker_support::insert_pings(pool, "batch", n).await;
}

async fn start(pool: &PgPool, sink: Arc<BatchSink>) -> WorkerHandle {
    Worker::builder(pool.clone(), sink)
        .concurrency(32)
        .batch_size(32)
        .retry(RetryPolicy {
            base: Duration::from_millis(50),
            max: Duration::from_millis(200),
            jitter: true,
        })
        .start()
        .await
        .unwrap()
}

/// Wait until no event is pending or processing; returns (payload n -> (status, last_error)),
/// `delivered` for an event without a queue row (and so without a reason).
async fn settled(pool: &PgPool) -> HashMap<i64, (String, Option<String>)> {
    let started = Instant::now();
    loop {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM outbox_queue WHERE status IN ('pending', 'processing')",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if open == 0 {
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "{open} events still open after {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rows: Vec<(i64, String, Option<String>)> = sqlx::query_as(
        "SELECT (e.payload->>'n')::bigint, coalesce(q.status, 'delivered'), q.last_error
         FROM outbox AS e LEFT JOIN outbox_queue AS q ON q.id = e.id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(n, status, error)| (n, (status, error)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_delivered_in_chunks_of_at_most_max_batch() {
    const EVENTS: i64 = 45;
    let db = TestDatabase::new().await;
    insert_events(db.pool(), EVENTS).await;
    let sink = BatchSink::new(Answer::AcceptAll, db.pool());
    let worker = start(db.pool(), Arc::clone(&sink)).await;
    let rows = settled(db.pool()).await;
    worker.shutdown().await;

    let calls = sink.calls();
    assert!(
        calls.iter().all(|c| !c.is_empty() && c.len() <= MAX_BATCH),
        "chunk sizes {:?}",
        calls.iter().map(Vec::len).collect::<Vec<_>>()
    );
    assert!(
        calls.len() < EVENTS as usize,
        "{} calls for {EVENTS} events: not batched",
        calls.len()
    );
    let mut seen: Vec<i64> = calls.concat();
    seen.sort_unstable();
    assert_eq!(
        seen,
        (1..=EVENTS).collect::<Vec<_>>(),
        "each event exactly once"
    );
    assert_eq!(rows.len(), EVENTS as usize);
    assert!(
        rows.values().all(|(status, _)| status == "delivered"),
        "{rows:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_accepted_items_are_delivered_and_refused_ones_keep_the_reason() {
    const EVENTS: i64 = 30;
    let db = TestDatabase::new().await;
    insert_events(db.pool(), EVENTS).await;
    let sink = BatchSink::new(Answer::RefuseOdd, db.pool());
    let worker = start(db.pool(), Arc::clone(&sink)).await;
    let rows = settled(db.pool()).await;
    worker.shutdown().await;

    for (n, (status, error)) in &rows {
        if n % 2 == 1 {
            assert_eq!(status, "exhausted", "odd item {n}");
            let error = error.as_deref().unwrap_or_default();
            assert!(
                error.contains(&format!("refused odd item {n}")),
                "item {n}: {error}"
            );
        } else {
            assert_eq!(status, "delivered", "even item {n}");
        }
    }
    assert_eq!(rows.len(), EVENTS as usize);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_without_a_result_are_retried_and_none_is_lost() {
    const EVENTS: i64 = 20;
    let db = TestDatabase::new().await;
    insert_events(db.pool(), EVENTS).await;
    let sink = BatchSink::new(Answer::ShortOnce, db.pool());
    let worker = start(db.pool(), Arc::clone(&sink)).await;
    let rows = settled(db.pool()).await;
    worker.shutdown().await;

    assert_eq!(rows.len(), EVENTS as usize);
    assert!(
        rows.values().all(|(status, _)| status == "delivered"),
        "{rows:?}"
    );
    // The first call's last three items got no result: retried once, and the retry saw the
    // reason kept on the queue row.
    let first = &sink.calls()[0];
    assert!(first.len() > 3, "first chunk {first:?}");
    for n in &first[first.len() - 3..] {
        let deliveries = sink.deliveries_of(*n);
        let attempts: Vec<i32> = deliveries.iter().map(|i| i.attempt).collect();
        assert_eq!(attempts, [1, 2], "item {n} was retried once");
        let error = deliveries[1].last_error.as_deref().unwrap_or_default();
        assert!(error.contains("results for"), "item {n}: {error}");
    }
    for n in &first[..first.len() - 3] {
        let attempts: Vec<i32> = sink.deliveries_of(*n).iter().map(|i| i.attempt).collect();
        assert_eq!(attempts, [1], "item {n} was answered the first time");
    }
}

/// A sink whose calls can outlast the lease is refused at start, before anything is claimed.
#[tokio::test]
async fn a_publisher_timeout_not_shorter_than_the_lease_is_refused_at_start() {
    use outbox_runtime::publish::http::{HttpConfig, HttpPublisher};
    let db = TestDatabase::new().await;
    insert_events(db.pool(), 1).await;
    let slow = HttpPublisher::new(
        "http://127.0.0.1:9/events",
        HttpConfig {
            timeout: Duration::from_secs(30),
            ..HttpConfig::default()
        },
    )
    .unwrap();
    let error = Worker::builder(db.pool().clone(), slow)
        .lease(Duration::from_secs(30))
        .start()
        .await
        .expect_err("a 30 s timeout with a 30 s lease must be refused");
    let message = error.to_string();
    assert!(
        message.contains("must be shorter than the worker's lease")
            && message.contains("HttpConfig::timeout"),
        "{message}"
    );
    let claimed: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_queue WHERE attempts > 0")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(claimed, 0, "nothing was claimed");

    let fast = HttpPublisher::new(
        "http://127.0.0.1:9/events",
        HttpConfig {
            timeout: Duration::from_secs(5),
            ..HttpConfig::default()
        },
    )
    .unwrap();
    let worker = Worker::builder(db.pool().clone(), fast)
        .lease(Duration::from_secs(30))
        .maintenance(false)
        .start()
        .await
        .expect("a 5 s timeout fits a 30 s lease");
    worker.shutdown().await;
}

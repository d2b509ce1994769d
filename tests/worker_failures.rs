//! In-process workers facing failing receivers: retries with exponential backoff (and a
//! receiver's own Retry-After), exhaustion, permanent failures, panicking handlers,
//! configuration errors, and a network that fails between the worker and PostgreSQL (a
//! partition; a connection that dies before the answer to a committed completion arrives).

mod worker_support;

use std::time::Duration;

use outbox_runtime::worker::{RetryPolicy, Worker, WorkerEvent};
use worker_support::proxy::Proxy;
use worker_support::receiver::{Knobs, Receiver};
use worker_support::*;

const WAIT: Duration = Duration::from_secs(30);

fn gaps_ms(pool_log: &[(i32, f64)]) -> Vec<f64> {
    pool_log
        .windows(2)
        .map(|w| (w[1].1 - w[0].1) * 1000.0)
        .collect()
}

async fn attempt_times(pool: &sqlx::PgPool) -> Vec<(i32, f64)> {
    sqlx::query_as(
        "SELECT attempt, extract(epoch FROM received_at)::float8 FROM receiver_log ORDER BY seq",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_retried_with_exponential_backoff() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 1, false).await;
    let knobs = Knobs {
        fail_first: 2,
        ..Default::default()
    };
    let worker = Worker::builder(pool.clone(), Receiver::new(pool.clone(), "w", knobs))
        .retry(RetryPolicy {
            base: Duration::from_millis(400),
            max: Duration::from_secs(10),
            jitter: false,
        })
        .poll_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    wait_until(WAIT, "the event is delivered", || async {
        count_status(&pool, "delivered").await == 1
    })
    .await;
    worker.shutdown().await;

    let row = rows(&pool).await.remove(0);
    assert_eq!((row.attempts, row.handler_failures), (3, 2));
    assert_eq!(row.last_error.as_deref(), Some("receiver unavailable"));
    let times = attempt_times(&pool).await;
    assert_eq!(times.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    let gaps = gaps_ms(&times);
    // The second attempt waits at least base, the third at least twice base.
    assert!(gaps[0] >= 400.0, "first backoff {gaps:?}");
    assert!(gaps[1] >= 800.0, "second backoff doubles {gaps:?}");
    let c = worker.counters();
    assert_eq!((c.retried, c.delivered, c.exhausted), (2, 1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receivers_retry_after_is_honoured() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 1, false).await;
    let knobs = Knobs {
        fail_first: 1,
        retry_after: Some(Duration::from_millis(1500)),
        ..Default::default()
    };
    let worker = Worker::builder(pool.clone(), Receiver::new(pool.clone(), "w", knobs))
        .retry(RetryPolicy {
            base: Duration::from_millis(10),
            max: Duration::from_millis(20),
            jitter: false,
        })
        .poll_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    wait_until(WAIT, "the event is delivered", || async {
        count_status(&pool, "delivered").await == 1
    })
    .await;
    worker.shutdown().await;
    let gaps = gaps_ms(&attempt_times(&pool).await);
    assert_eq!(gaps.len(), 1);
    assert!(
        gaps[0] >= 1500.0,
        "the retry waited for the receiver's delay, not the 10 ms policy: {gaps:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_that_keeps_failing_is_exhausted_after_its_attempts() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs_with_attempts(&pool, 0, 2, 3).await;
    let knobs = Knobs {
        fail_first: u32::MAX,
        ..Default::default()
    };
    let worker = Worker::builder(pool.clone(), Receiver::new(pool.clone(), "w", knobs))
        .retry(RetryPolicy {
            base: Duration::from_millis(20),
            max: Duration::from_millis(50),
            jitter: true,
        })
        .poll_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    wait_until(WAIT, "both events are exhausted", || async {
        count_status(&pool, "exhausted").await == 2
    })
    .await;
    worker.shutdown().await;
    for r in rows(&pool).await {
        assert_eq!(
            (r.status.as_str(), r.attempts, r.handler_failures),
            ("exhausted", 3, 3),
            "{r:?}"
        );
    }
    let log = received(&pool).await;
    assert_eq!(log.len(), 6, "three attempts each, no fourth");
    assert!(log.iter().all(|r| r.outcome == "failed"));
    assert_eq!(effects(&pool).await, 0);
    let c = worker.counters();
    assert_eq!((c.retried, c.exhausted, c.delivered), (4, 2, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_exhausts_at_once() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 1, false).await;
    let knobs = Knobs {
        permanent: true,
        ..Default::default()
    };
    let worker = Worker::builder(pool.clone(), Receiver::new(pool.clone(), "w", knobs))
        .start()
        .await
        .unwrap();
    wait_until(WAIT, "the event is exhausted", || async {
        count_status(&pool, "exhausted").await == 1
    })
    .await;
    worker.shutdown().await;
    let row = rows(&pool).await.remove(0);
    assert_eq!(row.attempts, 1);
    assert_eq!(
        row.last_error.as_deref(),
        Some("receiver rejects this payload")
    );
    assert_eq!(received(&pool).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_fails_its_event_and_the_worker_goes_on() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 3, false).await;
    let knobs = Knobs {
        panic_first: 1,
        ..Default::default()
    };
    let worker = Worker::builder(pool.clone(), Receiver::new(pool.clone(), "w", knobs))
        .concurrency(2)
        .start()
        .await
        .unwrap();
    wait_until(WAIT, "all three are exhausted", || async {
        count_status(&pool, "exhausted").await == 3
    })
    .await;
    // The worker survived its panicking handlers: it still delivers.
    enqueue_jobs_with_attempts(&pool, 10, 11, 5).await;
    sqlx::query("UPDATE outbox SET attempts = 1 WHERE status = 'pending'")
        .execute(&pool)
        .await
        .unwrap();
    wait_until(WAIT, "a later event is delivered", || async {
        count_status(&pool, "delivered").await == 1
    })
    .await;
    worker.shutdown().await;
    for r in rows(&pool)
        .await
        .into_iter()
        .filter(|r| r.status == "exhausted")
    {
        assert_eq!(r.attempts, 1);
        let err = r.last_error.unwrap_or_default();
        assert!(
            err.starts_with("handler panicked: receiver panics on attempt 1"),
            "{err}"
        );
    }
    let log = received(&pool).await;
    assert_eq!(log.iter().filter(|r| r.outcome == "panic").count(), 3);
    assert_eq!(log.iter().filter(|r| r.outcome == "ok").count(), 1);
    assert_eq!(worker.counters().panics, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_configuration_is_refused_with_the_knob_named() {
    let db = database().await;
    let pool = db.pool().clone();
    let sink = || Receiver::new(pool.clone(), "w", Knobs::default());
    let err = Worker::builder(pool.clone(), sink())
        .concurrency(0)
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("concurrency"), "{err}");
    let err = Worker::builder(pool.clone(), sink())
        .lease(Duration::from_secs(1))
        .renew_interval(Duration::from_secs(2))
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("renew_interval") && err.contains("lease"),
        "{err}"
    );
    let err = Worker::builder(pool.clone(), sink())
        .table("Robert'); DROP TABLE")
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a valid outbox table name"), "{err}");
    let err = Worker::builder(pool.clone(), sink())
        .retry(RetryPolicy {
            base: Duration::from_secs(5),
            max: Duration::from_secs(1),
            jitter: true,
        })
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("retry.max"), "{err}");
    // Nothing was started: no row, no receiver record.
    assert_eq!(received(&pool).await.len(), 0);
}

/// A partition between the worker and PostgreSQL: every statement hangs, renewal included, and
/// nothing reports an error. The lease still ends (by the database clock, and another worker's
/// maintenance may then hand the event out again), so the handler must be told by the worker's
/// own monotonic clock: lease_lost is cancelled once the lease of the last renewal sent would
/// have ended, while the database is still unreachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_partition_the_handler_is_told_when_its_lease_ends_by_the_local_clock() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 1, false).await;
    let proxy = Proxy::start(db.connect_options()).await;
    let worker_pool = proxy.pool(db.connect_options(), 4).await;
    let lease = Duration::from_secs(3);
    let knobs = Knobs {
        delay: Duration::from_secs(300),
        stop_on_lease_lost: true,
        ..Default::default()
    };
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    // The receiver records through the direct pool, so it can report during the partition.
    let receiver = Receiver::new(pool.clone(), "partitioned", knobs);
    let worker = Worker::builder(worker_pool, receiver.clone())
        .name("partitioned")
        .lease(lease)
        .renew_interval(Duration::from_millis(300))
        .maintenance(false)
        .listen(false)
        .poll_interval(Duration::from_secs(120))
        .events(tx)
        .start()
        .await
        .unwrap();
    wait_event(&mut events, WAIT, "the claim", |e| {
        matches!(e, WorkerEvent::ClaimedBatch(_))
    })
    .await;
    wait_event(&mut events, WAIT, "a renewal through the proxy", |e| {
        matches!(e, WorkerEvent::Renewed(_))
    })
    .await;

    proxy.black_hole();
    let cut = std::time::Instant::now();
    // Every renewal from here on hangs, so the lease cannot be extended past the one whose
    // renewal was sent before the cut: bounded by the lease plus a generous allowance.
    wait_event(
        &mut events,
        lease + Duration::from_secs(10),
        "lease_lost cancelled during the partition",
        |e| matches!(e, WorkerEvent::LeaseLost(_)),
    )
    .await;
    let told_after = cut.elapsed();
    wait_until(WAIT, "the handler stopped", || async {
        received(&pool)
            .await
            .iter()
            .any(|r| r.outcome == "stopped_lease_lost")
    })
    .await;
    assert_eq!(proxy.replies_lost(), 0);
    // The handler heard before the lease ended by the database clock: the worker's deadline is
    // the send time of the last renewal plus the lease, minus a safety margin.
    let before_the_end: bool = sqlx::query_scalar(
        "SELECT l.received_at < o.lease_until FROM receiver_log l, outbox o
         WHERE l.outcome = 'stopped_lease_lost'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        before_the_end,
        "the handler was told {told_after:?} after the cut, later than the lease ended in the database"
    );

    proxy.heal();
    worker.shutdown().await;
    let c = worker.counters();
    assert_eq!(c.lease_lost, 1, "{c:?}");
    assert_eq!(c.delivered, 0, "{c:?}");
}

/// A worker behind a proxy that drops the answer to the first statement containing `statement`,
/// with one job enqueued; no renewal, maintenance or LISTEN, so the completion is the only
/// statement that can meet the dropped answer.
async fn worker_losing_an_answer(
    db: &outbox_runtime::testing::TestDatabase,
    statement: &[u8],
    retention: Option<Duration>,
    knobs: Knobs,
) -> (
    Proxy,
    outbox_runtime::worker::WorkerHandle,
    tokio::sync::mpsc::UnboundedReceiver<WorkerEvent>,
) {
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 1, false).await;
    let proxy = Proxy::start(db.connect_options()).await;
    let worker_pool = proxy.pool(db.connect_options(), 4).await;
    proxy.lose_reply_to(statement);
    let (tx, events) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::builder(worker_pool, Receiver::new(pool, "w", knobs))
        .retention(retention)
        .maintenance(false)
        .listen(false)
        .renewal(false)
        .poll_interval(Duration::from_secs(120))
        .events(tx)
        .start()
        .await
        .unwrap();
    (proxy, worker, events)
}

/// The completed and stale claims of the batch whose first answer the proxy dropped (checked:
/// exactly one answer was dropped).
async fn outcome_after_the_lost_answer(
    proxy: &Proxy,
    events: &mut tokio::sync::mpsc::UnboundedReceiver<WorkerEvent>,
) -> (
    Vec<outbox_runtime::store::Claim>,
    Vec<outbox_runtime::store::Claim>,
) {
    let outcome = wait_event(events, WAIT, "the completion's outcome", |e| {
        matches!(e, WorkerEvent::CompletedBatch { .. })
    })
    .await;
    assert_eq!(
        proxy.replies_lost(),
        1,
        "the first completion's answer was thrown away"
    );
    let WorkerEvent::CompletedBatch { completed, stale } = outcome else {
        unreachable!()
    };
    (completed, stale)
}

/// The completion commits, then the connection dies before its answer arrives. The completer
/// retries; the retry finds the row already settled by this very claim (delivered under the
/// same claim_version, or deleted with a retention of zero). That is a completed delivery, not
/// a stale one.
async fn completion_whose_answer_was_lost(retention: Option<Duration>, statement: &[u8]) {
    let db = database().await;
    let pool = db.pool().clone();
    let (proxy, worker, mut events) =
        worker_losing_an_answer(&db, statement, retention, Knobs::default()).await;
    let (completed, stale) = outcome_after_the_lost_answer(&proxy, &mut events).await;
    assert_eq!(
        (completed.len(), stale.len()),
        (1, 0),
        "completed {completed:?}, stale {stale:?}"
    );
    worker.shutdown().await;
    let c = worker.counters();
    assert_eq!((c.delivered, c.stale_completions), (1, 0), "{c:?}");
    let left: Vec<String> = rows(&pool).await.into_iter().map(|r| r.status).collect();
    let expected: &[&str] = if retention == Some(Duration::ZERO) {
        &[]
    } else {
        &["delivered"]
    };
    assert_eq!(left, expected);
    assert_eq!(received(&pool).await.len(), 1, "delivered once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_whose_answer_was_lost_counts_as_delivered_not_stale() {
    completion_whose_answer_was_lost(None, b"SET status = 'delivered'").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleting_completion_whose_answer_was_lost_counts_as_delivered_not_stale() {
    completion_whose_answer_was_lost(Some(Duration::ZERO), b"USING unnest(").await;
}

/// The other side of the lost answer: the claim was taken by another worker before the
/// completion was written, so the first write completed nothing, and then its answer was lost
/// too. The retry finds the claim gone; the check for an earlier write must not turn that into
/// a delivery: it stays stale, and the row stays the other worker's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_completion_whose_answer_was_lost_stays_stale() {
    let db = database().await;
    let pool = db.pool().clone();
    // The handler takes long enough for the test to steal its claim first.
    let knobs = Knobs {
        delay: Duration::from_secs(1),
        ..Default::default()
    };
    let (proxy, worker, mut events) =
        worker_losing_an_answer(&db, b"SET status = 'delivered'", None, knobs).await;
    wait_event(&mut events, WAIT, "the claim", |e| {
        matches!(e, WorkerEvent::ClaimedBatch(_))
    })
    .await;
    sqlx::query("UPDATE outbox SET claim_version = claim_version + 1, claimed_by = 'thief'")
        .execute(&pool)
        .await
        .unwrap();
    let (completed, stale) = outcome_after_the_lost_answer(&proxy, &mut events).await;
    assert_eq!(
        (completed.len(), stale.len()),
        (0, 1),
        "completed {completed:?}, stale {stale:?}"
    );
    worker.shutdown().await;
    let c = worker.counters();
    assert_eq!((c.delivered, c.stale_completions), (0, 1), "{c:?}");
    let row = rows(&pool).await.remove(0);
    assert_eq!(
        (row.status.as_str(), row.claimed_by.as_deref()),
        ("processing", Some("thief"))
    );
}

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

    // Delivered, so its queue row is gone: the claim that delivered it saw the two failures
    // recorded, with the receiver's reason.
    let delivered = accepted(&pool).await.remove(0);
    assert_eq!(
        (delivered.attempt, delivered.handler_failures),
        (3, Some(2))
    );
    assert_eq!(
        delivered.last_error.as_deref(),
        Some("receiver unavailable")
    );
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
    let exhausted = queue_rows(&pool).await;
    assert_eq!(exhausted.len(), 2);
    for r in exhausted {
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
    let row = queue_rows(&pool).await.remove(0);
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
    sqlx::query("UPDATE outbox_queue SET attempts = 1 WHERE status = 'pending'")
        .execute(&pool)
        .await
        .unwrap();
    wait_until(WAIT, "a later event is delivered", || async {
        count_status(&pool, "delivered").await == 1
    })
    .await;
    worker.shutdown().await;
    let exhausted: Vec<QueueRow> = queue_rows(&pool)
        .await
        .into_iter()
        .filter(|r| r.status == "exhausted")
        .collect();
    assert_eq!(exhausted.len(), 3);
    for r in exhausted {
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
        "SELECT l.received_at < q.lease_until FROM receiver_log l, outbox_queue q
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

/// Bytes that only the completion statement holds: complete_many.sql (the event is kept) and
/// complete_many_delete.sql (retention zero: the event is deleted too).
const COMPLETE_MANY: &[u8] = b"DELETE FROM outbox_queue AS q\nUSING unnest(";
const COMPLETE_MANY_DELETE: &[u8] = b"WITH completed AS (";

/// The completion commits, then the connection dies before its answer arrives. The completer
/// retries; the retry finds the queue row already gone, and a queue row is only ever deleted by
/// a completion: the event is delivered, so the claim is counted completed, not stale.
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
    let left: Vec<String> = worker_support::events(&pool)
        .await
        .into_iter()
        .map(|r| r.status)
        .collect();
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
    completion_whose_answer_was_lost(None, COMPLETE_MANY).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleting_completion_whose_answer_was_lost_counts_as_delivered_not_stale() {
    completion_whose_answer_was_lost(Some(Duration::ZERO), COMPLETE_MANY_DELETE).await;
}

/// A worker whose handler takes a second, losing the answer to its completion, and whose claim
/// the test takes over while the handler runs (`steal`: a statement on the queue row).
/// Returns the completed and stale claims the worker reported, after checking its counters
/// agree.
async fn completion_of_a_stolen_claim_whose_answer_was_lost(
    db: &outbox_runtime::testing::TestDatabase,
    steal: &str,
) -> (
    Vec<outbox_runtime::store::Claim>,
    Vec<outbox_runtime::store::Claim>,
) {
    let knobs = Knobs {
        delay: Duration::from_secs(1),
        ..Default::default()
    };
    let (proxy, worker, mut events) = worker_losing_an_answer(db, COMPLETE_MANY, None, knobs).await;
    wait_event(&mut events, WAIT, "the claim", |e| {
        matches!(e, WorkerEvent::ClaimedBatch(_))
    })
    .await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(steal.to_owned()))
        .execute(db.pool())
        .await
        .unwrap();
    let (completed, stale) = outcome_after_the_lost_answer(&proxy, &mut events).await;
    worker.shutdown().await;
    let c = worker.counters();
    assert_eq!(
        (c.delivered, c.stale_completions),
        (completed.len() as u64, stale.len() as u64),
        "{c:?}"
    );
    (completed, stale)
}

/// The other side of the lost answer: the claim was taken by another worker before the
/// completion was written, so the first write completed nothing, and then its answer was lost
/// too. The retry finds the claim gone but the queue row still there (the other worker's
/// claim): the check for an earlier write must not turn that into a delivery. It stays stale,
/// and the row stays the other worker's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_completion_whose_answer_was_lost_stays_stale() {
    let db = database().await;
    let (completed, stale) = completion_of_a_stolen_claim_whose_answer_was_lost(
        &db,
        "UPDATE outbox_queue SET claim_version = claim_version + 1, claimed_by = 'thief'",
    )
    .await;
    assert_eq!(
        (completed.len(), stale.len()),
        (0, 1),
        "completed {completed:?}, stale {stale:?}"
    );
    let row = queue_rows(db.pool()).await.remove(0);
    assert_eq!(
        (row.status.as_str(), row.claimed_by.as_deref()),
        ("processing", Some("thief"))
    );
}

/// A stale completion whose answer was lost, when the claim that took the event over has
/// delivered it already (as after this worker's lease ran out, recovery, and another worker's
/// claim and completion). The queue row is gone, which says the event is delivered but not by
/// which claim: the check for an earlier write counts it completed, not stale. Nothing is
/// overwritten, and the event is delivered either way (docs/split-layout.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_completion_whose_answer_was_lost_after_another_claim_delivered_counts_as_settled()
{
    let db = database().await;
    let (completed, stale) = completion_of_a_stolen_claim_whose_answer_was_lost(
        &db,
        "UPDATE outbox_queue SET claim_version = claim_version + 1, claimed_by = 'thief';
         DELETE FROM outbox_queue WHERE claimed_by = 'thief'",
    )
    .await;
    assert_eq!(
        (completed.len(), stale.len()),
        (1, 0),
        "completed {completed:?}, stale {stale:?}"
    );
    let left: Vec<String> = worker_support::events(db.pool())
        .await
        .into_iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(left, ["delivered"]);
}

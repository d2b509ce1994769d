//! A part of a running worker that panics (here: a sink's `max_batch`, called by the claimer,
//! and a metrics recorder, called by the completer) stops the whole worker, which says why,
//! and loses nothing: what it held returns after the lease, and a stopped worker claims nothing
//! it could not write back. Before, such a worker looked alive (`is_stopped` false) while it
//! delivered nothing, or delivered without ever completing.

mod worker_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use metrics::{
    Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use outbox_runtime::error::Error;
use outbox_runtime::worker::metrics as m;
use outbox_runtime::worker::{Worker, WorkerBuilder};
use sqlx::PgPool;
use worker_support::receiver::{Knobs, Receiver};
use worker_support::*;

const WAIT: Duration = Duration::from_secs(30);

/// A worker named `name` whose receiver logs each delivery under the same name.
fn logged_worker(pool: &PgPool, name: &str) -> WorkerBuilder {
    Worker::builder(
        pool.clone(),
        Receiver::new(pool.clone(), name, Knobs::default()),
    )
    .name(name)
}

const MAX_BATCH_PANIC: &str = "this sink's batch size was never configured";

/// A sink that accepts every event (as [`Accept`]) but whose `max_batch`, which the claimer
/// asks after every claim, panics.
struct PanicsInMaxBatch;

impl outbox_runtime::Sink for PanicsInMaxBatch {
    fn deliver<'a>(
        &'a self,
        event: &'a outbox_runtime::store::ClaimedEvent,
        delivery: &'a outbox_runtime::Delivery,
    ) -> futures::future::BoxFuture<'a, Result<(), outbox_runtime::HandlerError>> {
        Accept.deliver(event, delivery)
    }

    fn max_batch(&self) -> usize {
        panic!("{MAX_BATCH_PANIC}")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimer_that_panics_stops_the_worker_and_its_claimed_events_return_after_the_lease() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 3, false).await;
    let broken = Worker::builder(pool.clone(), PanicsInMaxBatch)
        .name("broken")
        .lease(Duration::from_secs(1))
        .start()
        .await
        .unwrap();
    wait_until(WAIT, "the worker stops on its own", || async {
        broken.is_stopped()
    })
    .await;
    let failure = broken
        .failure()
        .expect("a stopped worker that was not asked to stop says why");
    assert_eq!(failure.part, "claimer", "{failure}");
    assert!(failure.message.contains(MAX_BATCH_PANIC), "{failure}");
    // The claim committed before the claimer panicked: the stopped worker holds the three, and
    // they are not lost.
    assert_eq!(count_claimed_by(&pool, "broken", "processing").await, 3);

    let next = logged_worker(&pool, "next")
        .maintenance_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    wait_until(
        WAIT,
        "another worker delivers the three once their leases end",
        || async { count_status(&pool, "delivered").await == 3 },
    )
    .await;
    next.shutdown().await;
    let log = accepted(&pool).await;
    assert_eq!(log.len(), 3, "{log:?}");
    assert!(log.iter().all(|r| r.worker == "next"), "{log:?}");
    assert!(next.failure().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_until_returns_the_failure_instead_of_waiting_for_its_signal() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 1, false).await;
    let ran = tokio::time::timeout(
        WAIT,
        Worker::builder(pool.clone(), PanicsInMaxBatch)
            .name("run-until")
            .build()
            .unwrap()
            .run_until(std::future::pending()),
    )
    .await
    .expect("run_until returns when the worker fails, without its signal");
    let error = ran.expect_err("a failed worker is an error");
    let said = error.to_string();
    match error {
        Error::WorkerFailed {
            worker,
            part,
            message,
        } => {
            assert_eq!((worker.as_str(), part), ("run-until", "claimer"));
            assert!(message.contains(MAX_BATCH_PANIC), "{message}");
        }
        other => panic!("expected WorkerFailed, got {other:?}"),
    }
    assert!(
        said.contains("claimer panicked") && said.contains("restart"),
        "the message names the part and what to do: {said}"
    );
}

const RECORDER_PANIC: &str = "this recorder's storage is poisoned";

/// A metrics recorder whose first count of `outbox_delivered_total` panics; every other
/// metric goes nowhere. The completer counts deliveries after each completion statement.
struct PanicsOnFirstDelivered {
    armed: Arc<AtomicBool>,
}

struct Trip(Arc<AtomicBool>);

impl CounterFn for Trip {
    fn increment(&self, n: u64) {
        // The worker's start registers its counters with an increment of zero: not yet.
        if n > 0 && self.0.swap(false, Ordering::SeqCst) {
            panic!("{RECORDER_PANIC}");
        }
    }

    fn absolute(&self, _: u64) {}
}

impl Recorder for PanicsOnFirstDelivered {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        if key.name() == m::DELIVERED_TOTAL {
            Counter::from_arc(Arc::new(Trip(Arc::clone(&self.armed))))
        } else {
            Counter::noop()
        }
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// The recorder is installed for this thread only, and the workers run on this thread's
/// runtime, so no other test sees it.
#[test]
fn a_completer_that_panics_stops_the_worker_before_it_delivers_what_it_cannot_complete() {
    let runtime = current_thread_runtime();
    let recorder = PanicsOnFirstDelivered {
        armed: Arc::new(AtomicBool::new(true)),
    };
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let db = database().await;
            let pool = db.pool().clone();
            enqueue_jobs(&pool, 0, 1, false).await;
            let broken = logged_worker(&pool, "broken").start().await.unwrap();
            wait_until(WAIT, "the worker stops on its own", || async {
                broken.is_stopped()
            })
            .await;
            let failure = broken.failure().expect("the worker says why it stopped");
            assert_eq!(failure.part, "completer", "{failure}");
            assert!(failure.message.contains(RECORDER_PANIC), "{failure}");
            // The completion statement committed before the recorder panicked.
            assert_eq!(count_status(&pool, "delivered").await, 1);

            // A stopped worker claims nothing: an event enqueued now waits for the next worker,
            // which delivers it once (a worker without its completer would have delivered it
            // and then, after every lease, again).
            enqueue_jobs(&pool, 1, 2, true).await;
            let next = logged_worker(&pool, "next").start().await.unwrap();
            wait_until(WAIT, "the next worker delivers the new event", || async {
                count_status(&pool, "delivered").await == 2
            })
            .await;
            next.shutdown().await;
            let by: Vec<String> = accepted(&pool)
                .await
                .into_iter()
                .map(|r| r.worker)
                .collect();
            assert_eq!(by, ["broken", "next"]);
        })
    });
}

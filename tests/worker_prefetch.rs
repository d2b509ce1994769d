//! The worker claims ahead of its sink (the prefetch window) only as far as its measured pace
//! asks for, and claimed events waiting for a delivery slot are still the worker's promise:
//! never more than `concurrency` running, never lost, renewed while they wait, handed back
//! uncharged at shutdown.
//!
//! Each test fails on one way of getting the window wrong: a window pinned to the configured
//! bound hoards events behind a slow sink (`a_slow_sink_does_not_hoard_claims`); a window
//! pinned to zero never claims ahead (`a_fast_sink_lets_the_worker_claim_ahead`,
//! `shutdown_hands_back_waiting_events_uncharged`).

mod worker_support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use outbox_runtime::store::ClaimedEvent;
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::worker::{Worker, WorkerEvent};
use outbox_runtime::{Delivery, HandlerError, Sink};
use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(60);

async fn insert_events(pool: &PgPool, n: i64) {
    worker_support::insert_pings(pool, "prefetch", n).await;
}

async fn count(pool: &PgPool, status: &str) -> i64 {
    worker_support::count_status(pool, status).await
}

/// Wait until every event is delivered, failing after [`WAIT`].
async fn all_delivered(pool: &PgPool, events: i64) {
    let started = Instant::now();
    loop {
        let delivered = count(pool, "delivered").await;
        if delivered == events {
            return;
        }
        assert!(
            started.elapsed() < WAIT,
            "{delivered} of {events} delivered after {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn number(event: &ClaimedEvent) -> i64 {
    event.payload["n"].as_i64().expect("test payloads carry n")
}

/// How a test sink spends each call.
#[derive(Clone, Copy)]
enum Pace {
    /// Returns at once.
    Instant,
    /// Sleeps this long.
    Sleep(Duration),
    /// The first `fast` calls return at once, later ones sleep this long.
    FastThenSleep { fast: usize, sleep: Duration },
    /// The first `fast` calls return at once, later ones run until the delivery's `lease_lost`
    /// token is cancelled (the shutdown deadline) and then give up with a retryable error.
    FastThenHold { fast: usize },
}

/// Records what ran, how much ran at once, and how often each event was delivered.
struct RecordingSink {
    pace: Pace,
    max_batch: usize,
    calls: AtomicUsize,
    /// Events whose call returned.
    finished: AtomicUsize,
    running: AtomicUsize,
    peak: AtomicUsize,
    batch_sizes: Mutex<Vec<usize>>,
    deliveries: Mutex<HashMap<i64, usize>>,
    /// Events delivered on a later attempt than their first, with that attempt.
    later_attempts: Mutex<Vec<(i64, i32)>>,
}

impl RecordingSink {
    fn new(pace: Pace, max_batch: usize) -> Arc<Self> {
        Arc::new(RecordingSink {
            pace,
            max_batch,
            calls: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            batch_sizes: Mutex::new(Vec::new()),
            deliveries: Mutex::new(HashMap::new()),
            later_attempts: Mutex::new(Vec::new()),
        })
    }

    async fn call(
        &self,
        claimed: &[&ClaimedEvent],
        lease_lost: &tokio_util::sync::CancellationToken,
    ) -> bool {
        let events: Vec<i64> = claimed.iter().map(|e| number(e)).collect();
        let running = self.running.fetch_add(events.len(), Ordering::SeqCst) + events.len();
        self.peak.fetch_max(running, Ordering::SeqCst);
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        let delivered = match self.pace {
            Pace::Instant => true,
            Pace::Sleep(d) => {
                tokio::time::sleep(d).await;
                true
            }
            Pace::FastThenSleep { fast, sleep } => {
                if call >= fast {
                    tokio::time::sleep(sleep).await;
                }
                true
            }
            Pace::FastThenHold { fast } => {
                if call >= fast {
                    lease_lost.cancelled().await;
                    false
                } else {
                    true
                }
            }
        };
        if delivered {
            let mut deliveries = self.deliveries.lock().unwrap();
            for n in &events {
                *deliveries.entry(*n).or_default() += 1;
            }
            self.later_attempts.lock().unwrap().extend(
                claimed
                    .iter()
                    .filter(|e| e.attempts != 1)
                    .map(|e| (number(e), e.attempts)),
            );
        }
        self.running.fetch_sub(events.len(), Ordering::SeqCst);
        self.finished.fetch_add(events.len(), Ordering::SeqCst);
        delivered
    }
}

impl Sink for RecordingSink {
    fn deliver<'a>(
        &'a self,
        event: &'a ClaimedEvent,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            if self.call(&[event], delivery.lease_lost()).await {
                Ok(())
            } else {
                Err(HandlerError::retry("the worker is shutting down"))
            }
        })
    }

    fn max_batch(&self) -> usize {
        self.max_batch
    }

    fn deliver_batch<'a>(
        &'a self,
        items: &'a [(ClaimedEvent, Delivery)],
    ) -> BoxFuture<'a, Vec<Result<(), HandlerError>>> {
        Box::pin(async move {
            self.batch_sizes.lock().unwrap().push(items.len());
            let events: Vec<&ClaimedEvent> = items.iter().map(|(e, _)| e).collect();
            let ok = self.call(&events, items[0].1.lease_lost()).await;
            items
                .iter()
                .map(|_| {
                    if ok {
                        Ok(())
                    } else {
                        Err(HandlerError::retry("the worker is shutting down"))
                    }
                })
                .collect()
        })
    }
}

/// The sizes of every claim the worker reported so far.
fn claim_sizes(events: &mut mpsc::UnboundedReceiver<WorkerEvent>, into: &mut Vec<usize>) {
    while let Ok(event) = events.try_recv() {
        if let WorkerEvent::ClaimedBatch(claims) = event {
            into.push(claims.len());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_deliveries_never_exceed_the_concurrency() {
    const EVENTS: i64 = 400;
    let db = TestDatabase::new().await;
    insert_events(db.pool(), EVENTS).await;
    let sink = RecordingSink::new(Pace::Sleep(Duration::from_millis(1)), 1);
    let worker = Worker::builder(db.pool().clone(), Arc::clone(&sink))
        .concurrency(4)
        .batch_size(100)
        .prefetch(200)
        .start()
        .await
        .unwrap();
    all_delivered(db.pool(), EVENTS).await;
    worker.shutdown().await;

    let peak = sink.peak.load(Ordering::SeqCst);
    assert!(
        peak <= 4,
        "{peak} deliveries ran at once with concurrency 4"
    );
    assert!(peak >= 2, "deliveries never overlapped (peak {peak})");
    let deliveries = sink.deliveries.lock().unwrap();
    assert_eq!(deliveries.len(), EVENTS as usize);
}

/// A batch chunk runs only with a slot for each of its events, so a sink that takes more per
/// call than the worker runs at once still gets every event, in chunks no larger than the
/// concurrency (a chunk of 50 could never get 8 slots and would wait for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_chunks_never_exceed_the_concurrency() {
    const EVENTS: i64 = 300;
    let db = TestDatabase::new().await;
    insert_events(db.pool(), EVENTS).await;
    let sink = RecordingSink::new(Pace::Instant, 50);
    let worker = Worker::builder(db.pool().clone(), Arc::clone(&sink))
        .concurrency(8)
        .batch_size(100)
        .prefetch(100)
        .start()
        .await
        .unwrap();
    all_delivered(db.pool(), EVENTS).await;
    worker.shutdown().await;

    let sizes = sink.batch_sizes.lock().unwrap().clone();
    assert!(
        sizes.iter().all(|&n| (1..=8).contains(&n)),
        "chunk sizes {sizes:?}"
    );
    let peak = sink.peak.load(Ordering::SeqCst);
    assert!(
        peak <= 8,
        "{peak} events in calls at once with concurrency 8"
    );
    assert!(
        sink.deliveries.lock().unwrap().values().all(|&n| n == 1),
        "an event was delivered twice"
    );
}

/// A sink whose calls all wait until `n` of them are running: every claim is in flight, and
/// every completion reaches the completer at once, before any is written.
struct TogetherSink {
    all_running: tokio::sync::Barrier,
}

impl Sink for TogetherSink {
    fn deliver<'a>(
        &'a self,
        _event: &'a ClaimedEvent,
        _delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            self.all_running.wait().await;
            Ok(())
        })
    }
}

/// A completion statement never carries more than `completion_batch` claims, even when more
/// completions are waiting and the worker holds more claims than that: the batch is written as
/// soon as it is full, not at the flush deadline (30 s here) and not one completion later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_batch_never_exceeds_its_size() {
    const EVENTS: usize = 6;
    const BATCH: usize = 2;
    let db = TestDatabase::new().await;
    insert_events(db.pool(), EVENTS as i64).await;
    let (tx, mut events) = mpsc::unbounded_channel();
    let sink = Arc::new(TogetherSink {
        all_running: tokio::sync::Barrier::new(EVENTS),
    });
    let worker = Worker::builder(db.pool().clone(), sink)
        .concurrency(EVENTS)
        .completion_batch(BATCH, Duration::from_secs(30))
        .events(tx)
        .start()
        .await
        .unwrap();
    let mut sizes = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while sizes.iter().sum::<usize>() < EVENTS {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .unwrap_or_else(|_| panic!("completion batches {sizes:?} after {WAIT:?}"))
            .expect("the worker's event channel closed");
        if let WorkerEvent::CompletedBatch { completed, stale } = event {
            assert!(stale.is_empty(), "stale completions {stale:?}");
            sizes.push(completed.len());
        }
    }
    worker.shutdown().await;
    assert!(
        sizes.iter().all(|&n| (1..=BATCH).contains(&n)),
        "completion batches {sizes:?} with a batch size of {BATCH}"
    );
    assert_eq!(count(db.pool(), "delivered").await, EVENTS as i64);
}

/// With a sink much faster than a claim, the worker claims beyond its free slots: claims larger
/// than the concurrency.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_sink_lets_the_worker_claim_ahead() {
    const EVENTS: i64 = 3_000;
    let db = TestDatabase::new().await;
    insert_events(db.pool(), EVENTS).await;
    let (tx, mut events) = mpsc::unbounded_channel();
    let sink = RecordingSink::new(Pace::Instant, 1);
    let worker = Worker::builder(db.pool().clone(), Arc::clone(&sink))
        .concurrency(4)
        .batch_size(200)
        .prefetch(200)
        .events(tx)
        .start()
        .await
        .unwrap();
    all_delivered(db.pool(), EVENTS).await;
    worker.shutdown().await;

    let mut sizes = Vec::new();
    claim_sizes(&mut events, &mut sizes);
    let largest = sizes.iter().copied().max().unwrap_or(0);
    assert!(
        largest > 4,
        "no claim went beyond the 4 slots (largest {largest}, claims {sizes:?})"
    );
    assert!(
        sizes.iter().all(|&n| n <= 200),
        "a claim exceeded the batch size: {sizes:?}"
    );
    assert!(
        sink.deliveries.lock().unwrap().values().all(|&n| n == 1),
        "an event was delivered twice"
    );
}

/// With a sink much slower than a claim, claimed events stay close to the running ones: the
/// rest of the backlog stays pending, where other workers can take it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_sink_does_not_hoard_claims() {
    const EVENTS: i64 = 200;
    const CONCURRENCY: i64 = 4;
    let db = TestDatabase::new().await;
    insert_events(db.pool(), EVENTS).await;
    let (tx, mut events) = mpsc::unbounded_channel();
    let sink = RecordingSink::new(Pace::Sleep(Duration::from_millis(200)), 1);
    let worker = Worker::builder(db.pool().clone(), Arc::clone(&sink))
        .concurrency(CONCURRENCY as usize)
        .batch_size(200)
        .prefetch(200)
        .events(tx)
        .start()
        .await
        .unwrap();
    // Watch for a second and a half: seven rounds of deliveries, each followed by claims.
    // Held = claimed and not yet returned by the sink (a returned event may still be
    // `processing` in the table until its completion is written; it no longer counts). The
    // claims are read before the returns, so a sample never counts more than was held.
    let started = Instant::now();
    let mut sizes = Vec::new();
    let mut most_held = 0;
    while started.elapsed() < Duration::from_millis(1_500) {
        claim_sizes(&mut events, &mut sizes);
        let claimed = sizes.iter().sum::<usize>() as i64;
        let returned = sink.finished.load(Ordering::SeqCst) as i64;
        most_held = most_held.max(claimed - returned);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let delivered = count(db.pool(), "delivered").await;
    worker.shutdown().await;

    assert!(
        delivered >= CONCURRENCY,
        "only {delivered} delivered in 1.5 s"
    );
    // Two claim round trips at 4 events per 200 ms is well under one event on a quiet machine
    // (a 2 ms claim): the window is a couple of events, never the configured 200. The bound
    // leaves room for claims slowed to 100 ms on a loaded machine (the window is then 4): with
    // a 100 ms sink and a bound of 2, claims slower than 25 ms failed the test under load.
    assert!(
        most_held <= CONCURRENCY + 4,
        "the worker held {most_held} events claimed behind a 200 ms sink with concurrency {CONCURRENCY}"
    );
}

/// Claimed events waiting for a slot at shutdown go back to pending without an attempt
/// charged, as do the running deliveries the deadline interrupts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_hands_back_waiting_events_uncharged() {
    const EVENTS: i64 = 2_000;
    const CONCURRENCY: usize = 4;
    const FAST: usize = 200;
    let db = TestDatabase::new().await;
    insert_events(db.pool(), EVENTS).await;
    let (tx, mut events) = mpsc::unbounded_channel();
    let sink = RecordingSink::new(Pace::FastThenHold { fast: FAST }, 1);
    let worker = Worker::builder(db.pool().clone(), Arc::clone(&sink))
        .concurrency(CONCURRENCY)
        .batch_size(100)
        .prefetch(100)
        .shutdown_deadline(Duration::from_millis(200))
        .events(tx)
        .start()
        .await
        .unwrap();
    // Wait until the slots are all held by the blocking calls and the claimer claimed ahead of
    // them.
    let started = Instant::now();
    loop {
        let running = sink.running.load(Ordering::SeqCst);
        let processing = count(db.pool(), "processing").await;
        if running == CONCURRENCY && processing > CONCURRENCY as i64 {
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "never had events waiting for a slot ({running} running, {processing} claimed)"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let processing = count(db.pool(), "processing").await;
    worker.shutdown().await;

    let mut released = 0;
    while let Ok(event) = events.try_recv() {
        if matches!(event, WorkerEvent::Released(_)) {
            released += 1;
        }
    }
    assert!(
        released > CONCURRENCY,
        "{released} events handed back; {processing} were held claimed"
    );
    assert_eq!(count(db.pool(), "processing").await, 0);
    let charged: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_queue WHERE status = 'pending' AND (attempts <> 0 OR handler_failures <> 0)",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(charged, 0, "a handed-back event kept a charged attempt");
    let delivered = count(db.pool(), "delivered").await;
    let pending = count(db.pool(), "pending").await;
    assert_eq!(
        delivered + pending,
        EVENTS,
        "an event was lost or exhausted"
    );
}

/// Events waiting for a slot longer than the lease keep their claim: the renewer renews them
/// like running ones, so no other worker (here: maintenance recovering expired leases) takes
/// them and each is delivered once, on its first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_events_keep_their_claim_past_the_lease() {
    const EVENTS: i64 = 60;
    let db = TestDatabase::new().await;
    insert_events(db.pool(), EVENTS).await;
    let (tx, mut events) = mpsc::unbounded_channel();
    let sink = RecordingSink::new(
        Pace::FastThenSleep {
            fast: 20,
            sleep: Duration::from_millis(120),
        },
        1,
    );
    let worker = Worker::builder(db.pool().clone(), Arc::clone(&sink))
        .concurrency(1)
        .batch_size(50)
        .prefetch(30)
        .lease(Duration::from_secs(1))
        .renew_interval(Duration::from_millis(250))
        .maintenance_interval(Duration::from_millis(100))
        .events(tx)
        .start()
        .await
        .unwrap();
    // Once the slow calls start, the events claimed ahead during the fast ones wait behind
    // them, one slow call each. Held = claimed minus returned (claims read first, so a sample
    // never counts more than were held); one of them is running.
    let started = Instant::now();
    let mut sizes = Vec::new();
    let mut waiting = 0;
    while started.elapsed() < Duration::from_secs(3) {
        claim_sizes(&mut events, &mut sizes);
        let held = sizes.iter().sum::<usize>() as i64 - sink.finished.load(Ordering::SeqCst) as i64;
        if sink.calls.load(Ordering::SeqCst) > 20 {
            waiting = waiting.max(held - 1);
            if waiting >= 12 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    all_delivered(db.pool(), EVENTS).await;
    let counters = worker.counters();
    worker.shutdown().await;

    // Delivered events keep no attempts or lease expiries: each delivery was its event's
    // first attempt, so no lease ran out and was recovered before it (a recovered event is
    // claimed again, on a later attempt), and no claim was completed after losing its lease.
    let later = sink.later_attempts.lock().unwrap().clone();
    assert!(later.is_empty(), "delivered on a later attempt: {later:?}");
    assert_eq!(counters.stale_completions, 0);
    assert!(counters.lease_renewals > 0, "nothing was renewed");
    let deliveries = sink.deliveries.lock().unwrap();
    assert!(deliveries.values().all(|&n| n == 1), "{deliveries:?}");
    assert_eq!(deliveries.len(), EVENTS as usize);
    // Meaningful only if some event waited past the lease: the twelfth waiting event waited
    // for eleven calls of 120 ms (and its own start), more than the 1 s lease.
    assert!(
        waiting >= 12,
        "only {waiting} events were claimed ahead; none waited past the lease"
    );
}

/// Make every completion statement wait, mid-statement, until [`unstick_completions`]: a
/// trigger takes a shared advisory lock that the returned connection holds exclusively. A
/// completion is the only statement that deletes queue rows; the row is locked before a row
/// trigger runs, so the stuck completion holds it.
async fn stick_completions(db: &TestDatabase) -> sqlx::PgConnection {
    sqlx::raw_sql(
        "CREATE FUNCTION wait_for_the_test() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_advisory_xact_lock_shared(4242); RETURN OLD; END $$;
         CREATE TRIGGER completions_wait BEFORE DELETE ON outbox_queue FOR EACH ROW
         EXECUTE FUNCTION wait_for_the_test();",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let mut blocker = db.connect().await;
    sqlx::query("SELECT pg_advisory_lock(4242)")
        .execute(&mut blocker)
        .await
        .unwrap();
    blocker
}

/// Positive while a statement waits on the lock of [`stick_completions`].
const COMPLETION_WAITING: &str =
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
     AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";

async fn unstick_completions(blocker: &mut sqlx::PgConnection) {
    sqlx::query("SELECT pg_advisory_unlock(4242)")
        .execute(blocker)
        .await
        .unwrap();
}

/// Completions that cannot be written stop the claimer: delivered events keep their delivery
/// slot until the completer has room, so what the worker holds claimed and unwritten stays
/// within `concurrency + prefetch + 2 x completion_batch` (one batch being written, one
/// queued). Before, the completions queue was unbounded and the slot was freed when the sink
/// returned: with the writer stuck, a fast sink claimed and delivered the whole backlog, every
/// event then waiting for a completion while its lease ran down.
///
/// The writer is stuck for real: a trigger makes the completion statement wait, mid-statement,
/// on an advisory lock this test holds.
async fn a_stuck_completion_writer_stops_the_claimer(max_batch: usize) {
    const EVENTS: i64 = 2_000;
    const CONCURRENCY: usize = 4;
    const PREFETCH: usize = 50;
    const COMPLETION_BATCH: usize = 8;
    const BOUND: i64 = (CONCURRENCY + PREFETCH + 2 * COMPLETION_BATCH) as i64;
    let db = TestDatabase::new().await;
    insert_events(db.pool(), EVENTS).await;
    let mut blocker = stick_completions(&db).await;

    let sink = RecordingSink::new(Pace::Instant, max_batch);
    let worker = Worker::builder(db.pool().clone(), Arc::clone(&sink))
        .concurrency(CONCURRENCY)
        .batch_size(50)
        .prefetch(PREFETCH)
        .completion_batch(COMPLETION_BATCH, Duration::from_millis(5))
        .start()
        .await
        .unwrap();

    // The sink delivers until the queue of completions is full...
    let started = Instant::now();
    while sink.finished.load(Ordering::SeqCst) < CONCURRENCY + COMPLETION_BATCH {
        assert!(
            started.elapsed() < WAIT,
            "the sink delivered only {} events in {WAIT:?}",
            sink.finished.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // ...and from then on the worker claims no more than it can complete. Watched for a second
    // and a half: a worker that keeps claiming takes the 2,000 events in well under that.
    let watch = Instant::now();
    let mut most = 0;
    while watch.elapsed() < Duration::from_millis(1_500) {
        most = most.max(count(db.pool(), "processing").await);
        if most > BOUND {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        most <= BOUND,
        "with its completions stuck the worker held {most} events claimed (bound {BOUND}); \
         the sink had delivered {}",
        sink.finished.load(Ordering::SeqCst)
    );
    // Delivered but not written back, they are still the worker's: counted in flight (and so
    // renewed), not forgotten once queued.
    let delivered = sink.finished.load(Ordering::SeqCst);
    assert!(
        worker.in_flight() >= delivered,
        "{} in flight, but {delivered} delivered and none written back",
        worker.in_flight()
    );

    // Unstuck, everything is delivered, each event once.
    unstick_completions(&mut blocker).await;
    all_delivered(db.pool(), EVENTS).await;
    worker.shutdown().await;
    let deliveries = sink.deliveries.lock().unwrap();
    assert_eq!(deliveries.len(), EVENTS as usize);
    assert!(
        deliveries.values().all(|&n| n == 1),
        "an event was delivered twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_completion_writer_stops_the_claimer_one_event_a_call() {
    a_stuck_completion_writer_stops_the_claimer(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_completion_writer_stops_the_claimer_in_batches() {
    a_stuck_completion_writer_stops_the_claimer(4).await;
}

/// A database that stops answering mid-completion does not hang shutdown: the worker waits one
/// more shutdown deadline for its outcomes to be written, then stops without them. Nothing is
/// lost by that: the claims whose completion did not return are delivered again once their
/// leases end (at least once). Before, shutdown waited for the stuck completion forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_forever_for_a_stuck_completion() {
    const EVENTS: i64 = 20;
    const DEADLINE: Duration = Duration::from_millis(500);
    let db = TestDatabase::new().await;
    insert_events(db.pool(), EVENTS).await;
    let mut blocker = stick_completions(&db).await;
    let sink = RecordingSink::new(Pace::Instant, 1);
    let worker = Worker::builder(db.pool().clone(), Arc::clone(&sink))
        .concurrency(4)
        .lease(Duration::from_secs(2))
        .renew_interval(Duration::from_millis(500))
        .shutdown_deadline(DEADLINE)
        .start()
        .await
        .unwrap();
    // A completion statement is waiting on the test's lock.
    until_positive(
        db.pool(),
        COMPLETION_WAITING,
        "a completion reaching the database",
    )
    .await;

    // Bounded by the two deadlines and the abort grace (2 s), with room for a loaded machine.
    let bound = Duration::from_secs(20);
    assert!(
        tokio::time::timeout(bound, worker.shutdown()).await.is_ok(),
        "shutdown still waiting for the stuck completion after {bound:?}"
    );

    // The database answers again: a new worker delivers whatever was not written back.
    unstick_completions(&mut blocker).await;
    let second = Worker::builder(db.pool().clone(), Arc::clone(&sink))
        .lease(Duration::from_secs(2))
        .maintenance_interval(Duration::from_millis(200))
        .start()
        .await
        .unwrap();
    all_delivered(db.pool(), EVENTS).await;
    second.shutdown().await;
    let deliveries = sink.deliveries.lock().unwrap();
    assert_eq!(deliveries.len(), EVENTS as usize, "every event delivered");
}

/// Event 1 runs until its lease is lost or the test lets it finish; event 2 returns as soon as
/// the test says so.
struct HoldOneReleaseOther {
    go: tokio::sync::Notify,
    finish: CancellationToken,
    held_lost_its_lease: std::sync::atomic::AtomicBool,
    deliveries: Mutex<HashMap<i64, usize>>,
}

impl Sink for HoldOneReleaseOther {
    fn deliver<'a>(
        &'a self,
        event: &'a ClaimedEvent,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let n = number(event);
            if n == 1 {
                tokio::select! {
                    () = delivery.lease_lost().cancelled() => {
                        self.held_lost_its_lease.store(true, Ordering::SeqCst);
                        return Err(HandlerError::retry("lease lost"));
                    }
                    () = self.finish.cancelled() => {}
                }
            } else {
                self.go.notified().await;
            }
            *self.deliveries.lock().unwrap().entry(n).or_default() += 1;
            Ok(())
        })
    }
}

/// Wait until `query` (one bigint) is positive, failing with `what` after [`WAIT`].
async fn until_positive(pool: &PgPool, query: &'static str, what: &str) {
    let started = Instant::now();
    loop {
        let n: i64 = sqlx::query_scalar(query).fetch_one(pool).await.unwrap();
        if n > 0 {
            return;
        }
        assert!(
            started.elapsed() < WAIT,
            "{what} did not happen in {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A completion stuck on its row does not stop the renewals of the other running deliveries.
///
/// Before, a renewal could name a row whose completion was being written (the renewer took the
/// in-flight claims, then the completer took one of them out and started writing it) and waited
/// on that row for as long as the completion was stuck, and with it every later renewal: the
/// other deliveries' leases ran out although their handlers were fine. Now a renewal locks the
/// rows of its batch with SKIP LOCKED and never waits for a held one (the race itself, a
/// renewal naming a held row, is `a_row_held_by_another_transaction_does_not_stop_the_other_renewals`
/// in `tests/worker_lifecycle.rs`, and `a_renewal_skips_a_held_row_and_renews_the_rest` in
/// `tests/store_fencing.rs`). Here the completion of event 2 sticks on an advisory lock the test
/// holds, with its row locked, for longer than a lease, while event 1's handler keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_completion_does_not_stop_the_renewal_of_other_deliveries() {
    const LEASE: Duration = Duration::from_secs(10);
    let db = TestDatabase::new().await;
    insert_events(db.pool(), 2).await;
    let mut blocker = stick_completions(&db).await;
    let sink = Arc::new(HoldOneReleaseOther {
        go: tokio::sync::Notify::new(),
        finish: CancellationToken::new(),
        held_lost_its_lease: std::sync::atomic::AtomicBool::new(false),
        deliveries: Mutex::new(HashMap::new()),
    });
    let worker = Worker::builder(db.pool().clone(), Arc::clone(&sink))
        .concurrency(2)
        .lease(LEASE)
        .renew_interval(Duration::from_secs(2))
        .completion_batch(1, Duration::from_millis(1))
        .start()
        .await
        .unwrap();

    // Event 2 is delivered; its completion takes the row and sticks on the test's lock.
    sink.go.notify_one();
    until_positive(
        db.pool(),
        COMPLETION_WAITING,
        "a completion reaching the database",
    )
    .await;

    // Event 1's lease keeps being renewed: it moves past where it stood before it ends.
    let (lease_then, seconds_left): (chrono::DateTime<chrono::Utc>, f64) = sqlx::query_as(
        "SELECT lease_until, extract(epoch FROM lease_until - now())::float8 FROM outbox_queue WHERE id = 1",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    let renewed_before = Instant::now() + Duration::from_secs_f64(seconds_left.max(0.0));
    loop {
        let lease_now: chrono::DateTime<chrono::Utc> =
            sqlx::query_scalar("SELECT lease_until FROM outbox_queue WHERE id = 1")
                .fetch_one(db.pool())
                .await
                .unwrap();
        if lease_now > lease_then {
            break;
        }
        assert!(
            Instant::now() < renewed_before,
            "event 1's lease was not renewed while event 2's completion was stuck, and has run \
             out (lease until {lease_then})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !sink.held_lost_its_lease.load(Ordering::SeqCst),
        "event 1's handler was told its lease was lost"
    );

    // Unstuck, both are delivered once.
    unstick_completions(&mut blocker).await;
    sink.finish.cancel();
    all_delivered(db.pool(), 2).await;
    worker.shutdown().await;
    let deliveries = sink.deliveries.lock().unwrap();
    assert_eq!(*deliveries, HashMap::from([(1, 1), (2, 1)]));
}

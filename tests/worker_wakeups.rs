//! Wake-ups sent after commit by a `Waker`: a burst of `wake` calls folds into few
//! notifications, each sent after the call that asked for it, and a worker that polls rarely
//! delivers events enqueued without the in-transaction NOTIFY as soon as the service wakes it,
//! also when the process that committed exits right after (`Producer::close`); a wake-up never
//! sent is counted.

mod worker_support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, SharedString, Unit};
use outbox_runtime::Event;
use outbox_runtime::store::{EnqueueOptions, notify_channel};
use outbox_runtime::waker::Waker;
use outbox_runtime::worker::{Worker, WorkerEvent};
use sqlx::postgres::{PgListener, PgPoolOptions};
use worker_support::receiver::{Knobs, Receiver};
use worker_support::*;

const WAIT: Duration = Duration::from_secs(30);

/// Notifications on the default channel that arrive until none has come for `quiet`.
async fn notifications(listener: &mut PgListener, quiet: Duration) -> usize {
    let mut n = 0;
    while let Ok(received) = tokio::time::timeout(quiet, listener.recv()).await {
        assert_eq!(received.unwrap().channel(), "outbox");
        n += 1;
    }
    n
}

/// Wait until a fresh worker is connected to LISTEN and has made both of its start-up claims
/// (the first at start, the second woken by the listener's connection, in whichever order the
/// two happen): from then on only a notification or the poll tick makes it claim again.
async fn worker_is_listening_and_idle(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<WorkerEvent>,
) {
    let (mut listening, mut empty_claims) = (false, 0);
    while !(listening && empty_claims == 2) {
        match wait_event(events, WAIT, "the worker listens and finds nothing", |e| {
            matches!(
                e,
                WorkerEvent::ListenerConnected | WorkerEvent::ClaimedNothing
            )
        })
        .await
        {
            WorkerEvent::ListenerConnected => listening = true,
            _ => empty_claims += 1,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_wake_ups_folds_into_few_notifications_and_none_is_lost() {
    let db = database().await;
    let mut listener = PgListener::connect(&db.url()).await.unwrap();
    listener.listen(&notify_channel("outbox")).await.unwrap();
    let quiet = Duration::from_millis(400);

    let waker = Waker::new(db.pool().clone(), "outbox").unwrap();
    assert_eq!(
        notifications(&mut listener, quiet).await,
        0,
        "no wake, no notification"
    );

    waker.wake();
    assert_eq!(notifications(&mut listener, quiet).await, 1);

    // 1,000 calls at once: one notification is sent at a time, and every call made while one
    // is in flight is answered by the single next one.
    for _ in 0..1000 {
        waker.wake();
    }
    let burst = notifications(&mut listener, quiet).await;
    assert!(
        (1..=2).contains(&burst),
        "1,000 wake() calls in a burst sent {burst} notifications; expected 1 or 2"
    );
    assert_eq!(waker.notifications_sent(), 1 + burst as u64);
    assert_eq!(waker.notifications_failed(), 0);

    // A wake-up asked for just before the last handle goes is still sent.
    let clone = waker.clone();
    drop(waker);
    clone.wake();
    drop(clone);
    assert_eq!(notifications(&mut listener, quiet).await, 1);

    let error = Waker::new(db.pool().clone(), "no such table!").unwrap_err();
    assert!(error.to_string().contains("no such table!"), "{error}");
}

/// A service that shuts down closes its pool, perhaps right after a commit asked for a wake-up.
/// Nobody is left to wake: the waker drops the wake-up and counts it, without a failure and so
/// without the "sending a wake-up failed" warning (which it logged before, on every shutdown
/// that followed a commit closely).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waker_whose_pool_was_closed_drops_its_wake_ups_quietly() {
    let db = database().await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url())
        .await
        .unwrap();
    let waker = Waker::new(pool.clone(), "outbox").unwrap();
    pool.close().await;
    waker.wake();
    let deadline = tokio::time::Instant::now() + WAIT;
    while waker.notifications_dropped() + waker.notifications_failed() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the wake-up was neither dropped nor failed within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        waker.notifications_failed(),
        0,
        "a closed pool is the service's end, not a failed notification"
    );
    assert_eq!(waker.notifications_dropped(), 1);
    assert_eq!(waker.notifications_sent(), 0);
}

/// The waker sends on a session of its own, kept from one wake-up to the next: a wake-up never
/// waits for a connection of the service's pool (which the business transactions need; before,
/// every wake-up took one, with a liveness ping on the way out and another on the way back),
/// and a kept session the server ended is replaced at the next wake-up. Here the service's only
/// connection is busy in a transaction for the whole test, so a waker that borrowed from the
/// service's pool would send nothing until the pool's acquire timeout (a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waker_sends_on_its_own_session_and_never_waits_for_the_services_pool() {
    let db = database().await;
    let mut listener = PgListener::connect(&db.url()).await.unwrap();
    listener.listen(&notify_channel("outbox")).await.unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(60))
        .connect(&db.url())
        .await
        .unwrap();
    let busy = pool.begin().await.unwrap();
    let waker = Waker::new(pool.clone(), "outbox").unwrap();
    let waker_sessions = || async { session_pids(db.pool(), "outbox-waker outbox").await.len() };
    assert_eq!(waker_sessions().await, 0, "no wake-up yet, no session");

    for round in 1..=3u64 {
        waker.wake();
        let received = tokio::time::timeout(Duration::from_secs(10), listener.recv())
            .await
            .unwrap_or_else(|_| panic!("wake-up {round} was not sent within 10 s while the service's only connection was busy"))
            .unwrap();
        assert_eq!(received.channel(), "outbox");
        // Counted once the NOTIFY's answer is back, which may be after the listener heard it.
        wait_until(WAIT, "the wake-up is counted as sent", || async {
            waker.notifications_sent() == round
        })
        .await;
        assert_eq!(waker_sessions().await, 1, "one session, kept");
        if round == 2 {
            // The server ends the kept session; the next wake-up must still go out, at once.
            assert_eq!(
                terminate_sessions(db.pool(), "outbox-waker outbox").await,
                1
            );
            wait_until(WAIT, "the killed session is gone", || async {
                waker_sessions().await == 0
            })
            .await;
        }
    }
    assert_eq!(
        waker.notifications_failed(),
        0,
        "the killed session cost no wake-up"
    );
    busy.commit().await.unwrap();
    drop(waker);
    wait_until(
        WAIT,
        "the waker closes its session when dropped",
        || async { waker_sessions().await == 0 },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rarely_polling_worker_delivers_as_soon_as_the_service_wakes_it_after_commit() {
    let db = database().await;
    let pool = db.pool().clone();
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::builder(
        pool.clone(),
        Receiver::new(pool.clone(), "w1", Knobs::default()),
    )
    .name("w1")
    .poll_interval(Duration::from_secs(120))
    .events(events_tx)
    .start()
    .await
    .unwrap();
    worker_is_listening_and_idle(&mut events).await;
    let waker = Waker::new(pool.clone(), "outbox").unwrap();

    // Enqueued without the in-transaction NOTIFY and committed: the worker, which polls every
    // two minutes, does not know yet.
    let mut tx = pool.begin().await.unwrap();
    for n in 0..20 {
        Job { n }
            .enqueue_with(
                &mut tx,
                &format!("job-{n}"),
                &EnqueueOptions::without_notify(),
            )
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    // A fixed window on purpose: the subject is that nothing happens (no wake-up, so no claim)
    // until `wake`, and no event marks a wake-up that did not come.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        count_status(&pool, "delivered").await,
        0,
        "nothing woke the worker, so nothing was delivered yet"
    );

    waker.wake();
    wait_until(
        WAIT,
        "the 20 events are delivered after the wake-up",
        || async { count_status(&pool, "delivered").await == 20 },
    )
    .await;
    worker.shutdown().await;
    assert_eq!(received(&pool).await.len(), 20);
    assert_eq!(effects(&pool).await, 20);
}

/// The fast path a user reaches for first: a `Producer` transaction carries the business change
/// and the events, sends no notification from inside the transaction (the notifying commit's
/// database-wide lock is what serialises producers), and wakes a rarely polling worker after
/// its commit. Rolled back, it stores nothing and wakes nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_transaction_wakes_the_workers_after_its_own_commit() {
    let db = database().await;
    let pool = db.pool().clone();
    sqlx::query("CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let mut listener = PgListener::connect(&db.url()).await.unwrap();
    listener.listen(&notify_channel("outbox")).await.unwrap();
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::builder(
        pool.clone(),
        Receiver::new(pool.clone(), "w1", Knobs::default()),
    )
    .name("w1")
    .poll_interval(Duration::from_secs(120))
    .events(events_tx)
    .start()
    .await
    .unwrap();
    worker_is_listening_and_idle(&mut events).await;
    let producer = outbox_runtime::Producer::new(pool.clone());

    // Rolled back: nothing stored, no notification.
    let mut tx = producer.begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id, status) VALUES (0, 'confirmed')")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.enqueue(&Job { n: -1 }, "job--1").await.unwrap();
    tx.rollback().await.unwrap();
    let quiet = Duration::from_millis(400);
    assert_eq!(
        notifications(&mut listener, quiet).await,
        0,
        "a rolled-back producer transaction woke the workers"
    );

    // Committed: the business row and 20 events, then one wake-up from another session. The
    // business transaction runs on a pool of its own (adopted by the producer), so its session
    // can never be the pooled connection the producer's waker notifies from: a notification from
    // it can only be a NOTIFY inside the transaction, delivered at its commit.
    let business_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url())
        .await
        .unwrap();
    let mut tx = producer.adopt(business_pool.begin().await.unwrap());
    let business_session: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    sqlx::query("INSERT INTO orders (id, status) VALUES (1, 'confirmed')")
        .execute(&mut *tx)
        .await
        .unwrap();
    for n in 0..20 {
        tx.enqueue(&Job { n }, &format!("job-{n}")).await.unwrap();
    }
    tx.commit().await.unwrap();
    let wake_up = tokio::time::timeout(WAIT, listener.recv())
        .await
        .expect("no wake-up arrived after the producer's commit")
        .unwrap();
    assert_ne!(
        wake_up.process_id(),
        u32::try_from(business_session).unwrap(),
        "the wake-up came from the business transaction's session: it notified inside the transaction"
    );
    wait_until(
        WAIT,
        "the 20 events are delivered after the commit's wake-up (the worker polls every 2 min)",
        || async { count_status(&pool, "delivered").await == 20 },
    )
    .await;
    worker.shutdown().await;
    assert_eq!(effects(&pool).await, 20);
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        orders, 1,
        "the rolled-back order was stored, or the committed one lost"
    );
    assert_eq!(count_status(&pool, "pending").await, 0);
}

/// A process that commits through a `Producer` and exits at once (a command-line tool, a batch
/// job, the end of a service's `main`): `Producer::close` sends the commit's wake-up before the
/// runtime ends, so a worker that polls every two minutes delivers the events within seconds.
/// Without `close` the waker's task ended with the process before sending, and the events
/// waited for the worker's next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_closes_its_producer_wakes_the_workers_before_it_exits() {
    let db = database().await;
    let pool = db.pool().clone();
    let poll = Duration::from_secs(120);
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::builder(
        pool.clone(),
        Receiver::new(pool.clone(), "w1", Knobs::default()),
    )
    .name("w1")
    .poll_interval(poll)
    .events(events_tx)
    .start()
    .await
    .unwrap();
    worker_is_listening_and_idle(&mut events).await;

    let exited = tokio::time::timeout(
        WAIT,
        tokio::process::Command::new(example("producer_exit"))
            .env("DATABASE_URL", db.url())
            .args(["--events", "5", "--close"])
            .output(),
    )
    .await
    .expect("examples/producer_exit did not exit within 30 s")
    .expect("running examples/producer_exit");
    assert!(
        exited.status.success(),
        "examples/producer_exit failed: {}",
        String::from_utf8_lossy(&exited.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&exited.stdout).trim(), "committed");

    // A sixth of the poll interval: only the wake-up can have brought them this early.
    wait_until(
        poll / 6,
        "the 5 events of the exited process are delivered long before the worker's poll",
        || async { count_status(&pool, "delivered").await == 5 },
    )
    .await;
    worker.shutdown().await;
    assert_eq!(effects(&pool).await, 5);
}

/// A recorder of counters only, for one thread (`metrics::with_local_recorder`): each series
/// as `name{label=value,...}` (labels sorted) with its total.
#[derive(Clone, Default)]
struct Counters(Arc<Mutex<BTreeMap<String, u64>>>);

impl Counters {
    fn get(&self, series: &str) -> Option<u64> {
        self.0.lock().unwrap().get(series).copied()
    }
}

struct CounterSeries {
    series: String,
    totals: Counters,
}

impl metrics::CounterFn for CounterSeries {
    fn increment(&self, n: u64) {
        *self
            .totals
            .0
            .lock()
            .unwrap()
            .entry(self.series.clone())
            .or_default() += n;
    }

    fn absolute(&self, n: u64) {
        self.totals.0.lock().unwrap().insert(self.series.clone(), n);
    }
}

impl metrics::Recorder for Counters {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let series = format!("{}{{{}}}", key.name(), labels.join(","));
        self.0.lock().unwrap().entry(series.clone()).or_default();
        Counter::from_arc(Arc::new(CounterSeries {
            series,
            totals: self.clone(),
        }))
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

const ABANDONED: &str = "outbox_wake_ups_unsent_total{reason=abandoned,table=outbox}";

/// The runtime ends (as at the end of a process) right after a `Producer`'s commit asked for
/// a wake-up, without `close`: the wake-up is never sent, and it is counted as abandoned
/// instead of vanishing. With `close` it is sent before `close` returns, and nothing is
/// abandoned. The recorder is this thread's, and so is the runtime its tasks run on.
#[test]
fn a_wake_up_the_runtime_ends_before_sending_is_counted_unless_the_producer_is_closed() {
    // The database outlives both runtimes below; each connects its own pool.
    let outer = tokio::runtime::Runtime::new().unwrap();
    let db = outer.block_on(database());
    let url = db.url();
    let connect = || async {
        PgPoolOptions::new()
            .max_connections(2)
            .connect(&url)
            .await
            .unwrap()
    };

    let without_close = Counters::default();
    metrics::with_local_recorder(&without_close, || {
        let runtime = current_thread_runtime();
        runtime.block_on(async {
            let producer = outbox_runtime::Producer::new(connect().await);
            let mut tx = producer.begin().await.unwrap();
            tx.enqueue(&Job { n: 1 }, "job-1").await.unwrap();
            tx.commit().await.unwrap();
            // `main` returns here: the waker's task does not run again before the runtime ends.
        });
        drop(runtime);
    });
    assert_eq!(
        without_close.get(ABANDONED),
        Some(1),
        "the unsent wake-up was not counted: {:?}",
        without_close.0.lock().unwrap()
    );

    let with_close = Counters::default();
    metrics::with_local_recorder(&with_close, || {
        let runtime = current_thread_runtime();
        runtime.block_on(async {
            let mut listener = PgListener::connect(&url).await.unwrap();
            listener.listen(&notify_channel("outbox")).await.unwrap();
            let producer = outbox_runtime::Producer::new(connect().await);
            let mut tx = producer.begin().await.unwrap();
            tx.enqueue(&Job { n: 2 }, "job-2").await.unwrap();
            tx.commit().await.unwrap();
            producer.close().await;
            let wake_up = tokio::time::timeout(WAIT, listener.recv())
                .await
                .expect("no wake-up arrived after the producer's close")
                .unwrap();
            assert_eq!(wake_up.channel(), "outbox");
        });
        drop(runtime);
    });
    assert_eq!(
        with_close.get(ABANDONED),
        Some(0),
        "a closed producer left a wake-up unsent: {:?}",
        with_close.0.lock().unwrap()
    );
    drop(db);
}

//! Per-aggregate ordered delivery under concurrent producers: an aggregate's events are
//! delivered in commit order, each once, never two at a time, even when the producers'
//! transactions commit out of the order they drew their row ids in; and an aggregate's next
//! event is claimed as soon as its predecessor completes, not at the poll tick.
//!
//! The producers here are real transactions on their own connections with no business-row lock
//! between them: the typed enqueue's per-aggregate lock is the only thing that serialises them.

mod worker_support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use outbox_runtime::Event;
use outbox_runtime::store::{ClaimedEvent, EnqueueOptions};
use outbox_runtime::worker::{Worker, WorkerHandle};
use outbox_runtime::{Delivery, HandlerError, Sink};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::PgPool;
use worker_support::*;

const WAIT: Duration = Duration::from_secs(30);

/// A sink that records, per aggregate, the row ids in the order their deliveries started, and
/// every time a delivery of an aggregate started while another of the same aggregate was still
/// running. Optionally holds each delivery for a random 0..`max_hold` ms.
#[derive(Debug, Default)]
struct OrderProbe {
    max_hold_ms: u64,
    state: Mutex<ProbeState>,
}

#[derive(Debug, Default)]
struct ProbeState {
    running: HashMap<String, Vec<i64>>,
    started: HashMap<String, Vec<i64>>,
    overlaps: Vec<String>,
    deliveries: usize,
}

impl OrderProbe {
    fn holding(max_hold_ms: u64) -> Arc<Self> {
        Arc::new(OrderProbe {
            max_hold_ms,
            state: Mutex::default(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ProbeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn deliveries(&self) -> usize {
        self.state().deliveries
    }

    /// Row ids of `aggregate` in the order their deliveries started.
    fn started(&self, aggregate: &str) -> Vec<i64> {
        self.state()
            .started
            .get(aggregate)
            .cloned()
            .unwrap_or_default()
    }

    fn overlaps(&self) -> Vec<String> {
        self.state().overlaps.clone()
    }

    async fn receive(&self, event: &ClaimedEvent) -> Result<(), HandlerError> {
        let aggregate = event
            .aggregate_id
            .clone()
            .ok_or_else(|| HandlerError::permanent("the ordering probe takes aggregate events"))?;
        {
            let mut state = self.state();
            state.deliveries += 1;
            let running = state.running.entry(aggregate.clone()).or_default();
            if !running.is_empty() {
                let others = running.clone();
                state.overlaps.push(format!(
                    "{aggregate}: row {} started while row(s) {others:?} were in flight",
                    event.id
                ));
            }
            state
                .running
                .entry(aggregate.clone())
                .or_default()
                .push(event.id);
            state
                .started
                .entry(aggregate.clone())
                .or_default()
                .push(event.id);
        }
        if self.max_hold_ms > 0 {
            let hold = rand::rng().random_range(0..=self.max_hold_ms);
            tokio::time::sleep(Duration::from_millis(hold)).await;
        }
        let mut state = self.state();
        if let Some(running) = state.running.get_mut(&aggregate) {
            running.retain(|id| *id != event.id);
        }
        Ok(())
    }
}

impl Sink for OrderProbe {
    fn deliver<'a>(
        &'a self,
        event: &'a ClaimedEvent,
        _delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(self.receive(event))
    }
}

async fn ordered_worker(
    pool: &PgPool,
    name: &str,
    probe: &Arc<OrderProbe>,
    poll: Duration,
) -> WorkerHandle {
    Worker::builder(pool.clone(), Arc::clone(probe))
        .name(name)
        .ordered(true)
        .poll_interval(poll)
        .start()
        .await
        .unwrap()
}

/// Whether backend `pid` is waiting for an advisory lock (the enqueue's aggregate lock).
async fn waits_for_advisory_lock(pool: &PgPool, pid: i32) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND NOT granted)
            AND EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock' AND wait_event = 'advisory')",
    )
    .bind(pid)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Row ids of `aggregate`'s events, ascending.
async fn ids_of(pool: &PgPool, aggregate: &str) -> Vec<i64> {
    sqlx::query_scalar("SELECT id FROM outbox WHERE aggregate_id = $1 ORDER BY id")
        .bind(aggregate)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Where the delivered row ids first depart from the expected ones, with a little context.
fn first_difference(delivered: &[i64], expected: &[i64]) -> String {
    let at = delivered
        .iter()
        .zip(expected)
        .position(|(d, e)| d != e)
        .unwrap_or(delivered.len().min(expected.len()));
    let from = at.saturating_sub(3);
    format!(
        "{} delivered, {} expected; from position {from}: delivered {:?}, expected {:?}",
        delivered.len(),
        expected.len(),
        &delivered[from.min(delivered.len())..(at + 4).min(delivered.len())],
        &expected[from.min(expected.len())..(at + 4).min(expected.len())],
    )
}

/// The interleaving: T1 writes step 1 of an aggregate (drawing the lower id) and stays
/// open; T2 writes step 2 and commits. Before the fix T2 committed first, the ordered claim took
/// step 2 while step 1 was invisible, and step 1 was delivered after it. Now T2's enqueue
/// waits for T1, so step 2 draws its id only after step 1 is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_producer_of_an_aggregate_waits_for_the_uncommitted_earlier_one() {
    let db = database().await;
    let pool = db.pool().clone();
    let probe = OrderProbe::holding(0);
    let worker = ordered_worker(&pool, "w1", &probe, Duration::from_secs(2)).await;

    let mut t1 = pool.begin().await.unwrap();
    Step {
        account: "A".into(),
        seq: 1,
    }
    .enqueue(&mut t1, "A-1")
    .await
    .unwrap();

    let (pid_tx, pid_rx) = tokio::sync::oneshot::channel();
    let t2_pool = pool.clone();
    let t2 = tokio::spawn(async move {
        let mut t2 = t2_pool.begin().await.unwrap();
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *t2)
            .await
            .unwrap();
        pid_tx.send(pid).unwrap();
        Step {
            account: "A".into(),
            seq: 2,
        }
        .enqueue(&mut t2, "A-2")
        .await
        .unwrap();
        t2.commit().await.unwrap();
    });
    let t2_pid = pid_rx.await.unwrap();

    // Either T2 now waits for T1 (the fix), or it committed and the worker got step 2 (the bug).
    wait_until(
        WAIT,
        "T2's enqueue waits for T1's aggregate lock, or the worker delivers an event",
        || async { waits_for_advisory_lock(&pool, t2_pid).await || probe.deliveries() > 0 },
    )
    .await;
    let t2_waited = waits_for_advisory_lock(&pool, t2_pid).await;
    let delivered_while_t1_open = probe.deliveries();

    t1.commit().await.unwrap();
    tokio::time::timeout(WAIT, t2)
        .await
        .expect("T2 finishes once T1 committed")
        .unwrap();
    wait_until(WAIT, "both steps are delivered", || async {
        count_status(&pool, "delivered").await == 2
    })
    .await;
    worker.shutdown().await;

    // Row ids of step 1 and step 2.
    let ids_by_step: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM outbox WHERE aggregate_id = 'A' ORDER BY aggregate_version",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let step_of = |id: &i64| ids_by_step.iter().position(|i| i == id).unwrap() + 1;
    let delivered_steps: Vec<usize> = probe.started("A").iter().map(step_of).collect();
    assert_eq!(
        delivered_steps,
        [1, 2],
        "steps delivered out of commit order (T2 committed step 2 while T1's step 1 was \
         uncommitted, and the ordered claim took it first); overlaps: {:?}",
        probe.overlaps()
    );
    assert!(probe.overlaps().is_empty(), "{:?}", probe.overlaps());
    assert_eq!(
        delivered_while_t1_open, 0,
        "an event of the aggregate was delivered while T1 (its earlier step) was uncommitted"
    );
    assert!(
        t2_waited,
        "T2's enqueue did not wait on the aggregate's advisory lock while T1 was open"
    );
    assert!(
        ids_by_step[0] < ids_by_step[1],
        "step 2 drew a lower id than step 1: {ids_by_step:?}"
    );
}

/// Producers writing events of a few aggregates in transactions that commit in random order
/// (random pauses between the inserts and the commit, no business-row lock), delivered by two
/// ordered workers while they write: per aggregate every event is delivered once, in id order
/// (which the enqueue's lock makes commit order), and never two at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_producers_of_an_aggregate_are_delivered_in_commit_order_one_at_a_time() {
    const PRODUCERS: u64 = 6;
    const TRANSACTIONS: usize = 40;
    const AGGREGATES: usize = 4;
    let seed: u64 = std::env::var("ORDERING_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("ORDERING_SEED={seed}");

    let db = outbox_runtime::testing::TestDatabase::with_pool_size(30).await;
    worker_support::receiver::setup(db.pool()).await;
    let pool = db.pool().clone();
    let probe = OrderProbe::holding(3);
    let workers = [
        ordered_worker(&pool, "w1", &probe, Duration::from_millis(500)).await,
        ordered_worker(&pool, "w2", &probe, Duration::from_millis(500)).await,
    ];

    let mut producers = Vec::new();
    for producer in 0..PRODUCERS {
        let pool = pool.clone();
        producers.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed.wrapping_add(producer));
            let mut written = 0;
            for t in 0..TRANSACTIONS {
                // Think time: production per aggregate stays slower than ordered delivery, so
                // the aggregate's queue runs empty and a commit is claimed as soon as it lands
                // (a backlog would hide an out-of-order commit behind older pending events).
                let think = rng.random_range(0..20);
                tokio::time::sleep(Duration::from_millis(think)).await;
                let account = format!("agg-{}", rng.random_range(0..AGGREGATES));
                let events = rng.random_range(1..=3);
                let mut tx = pool.begin().await.unwrap();
                for k in 0..events {
                    Step {
                        account: account.clone(),
                        seq: (producer * 10_000 + t as u64 * 10 + k) as i64,
                    }
                    .enqueue_with(
                        &mut tx,
                        &format!("p{producer}-t{t}-{k}"),
                        &EnqueueOptions::default(),
                    )
                    .await
                    .unwrap();
                    written += 1;
                }
                // A quarter of the transactions stay open long after drawing their ids, the
                // rest commit at once: later transactions of the aggregate commit first.
                let pause = if rng.random_bool(0.25) {
                    rng.random_range(50..150)
                } else {
                    rng.random_range(0..5)
                };
                tokio::time::sleep(Duration::from_millis(pause)).await;
                tx.commit().await.unwrap();
            }
            written
        }));
    }
    let mut total = 0;
    for p in producers {
        total += tokio::time::timeout(Duration::from_secs(120), p)
            .await
            .expect("a producer finishes")
            .unwrap();
    }
    wait_until(
        Duration::from_secs(60),
        &format!("all {total} events are delivered"),
        || async { count_status(&pool, "delivered").await == total },
    )
    .await;
    for w in &workers {
        w.shutdown().await;
    }

    assert_eq!(
        probe.overlaps(),
        Vec::<String>::new(),
        "two events of one aggregate were in flight at once (seed {seed})"
    );
    let mut delivered = 0;
    for a in 0..AGGREGATES {
        let aggregate = format!("agg-{a}");
        let ids = ids_of(&pool, &aggregate).await;
        let started = probe.started(&aggregate);
        assert!(
            started == ids,
            "{aggregate}: deliveries are not the aggregate's events in id = commit order, each once \
             (seed {seed}): {}",
            first_difference(&started, &ids)
        );
        delivered += started.len() as i64;
    }
    assert_eq!(delivered, total);
}

/// A chain of 100 events of one aggregate with an instant handler, and a poll interval of 60 s:
/// each next event is claimed when its predecessor's completion commits. Without that wake-up
/// the chain moves one event per poll tick and cannot finish within the bound (a correctness
/// bound on a wait that must succeed, not a speed measurement).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_makes_the_next_event_of_the_aggregate_claimable_at_once() {
    const CHAIN: i64 = 100;
    let db = database().await;
    let pool = db.pool().clone();
    let mut tx = pool.begin().await.unwrap();
    for seq in 1..=CHAIN {
        Step {
            account: "chain".into(),
            seq,
        }
        .enqueue(&mut tx, &format!("chain-{seq}"))
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();

    let probe = OrderProbe::holding(0);
    let worker = ordered_worker(&pool, "w1", &probe, Duration::from_secs(60)).await;
    wait_until(
        Duration::from_secs(20),
        "the chain of 100 is delivered with a 60 s poll interval (each completion must wake the claimer)",
        || async { count_status(&pool, "delivered").await == CHAIN },
    )
    .await;
    worker.shutdown().await;
    assert_eq!(probe.started("chain"), ids_of(&pool, "chain").await);
    assert!(probe.overlaps().is_empty(), "{:?}", probe.overlaps());
}

//! What an on-call engineer alerts on: the Prometheus text of a real worker's run over a real
//! PostgreSQL (the `metrics-exporter-prometheus` recorder, installed in this process), and the
//! worker's sessions as `pg_stat_activity` shows them.
//!
//! The recorder is global to this test binary, so every test uses event types of its own and
//! reads only the series labelled with them (the claim statement's histogram, labelled by table
//! only, is shared: its assertions are lower bounds).

mod worker_support;

use std::collections::BTreeSet;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use outbox_runtime::store::{ClaimedEvent, EnqueueOptions};
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::worker::metrics as m;
use outbox_runtime::worker::{RetryPolicy, SessionRole, Worker, application_name};
use outbox_runtime::{Delivery, Event, HandlerError, Sink};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::sync::Notify;
use worker_support::{Accept, current_thread_runtime, wait_until};

/// Longest wait for any one condition.
const DEADLINE: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "metrics.job", version = 1)]
pub struct MetricsJob {
    pub n: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "metrics.session_probe", version = 1)]
pub struct SessionProbe {
    pub n: i64,
}

/// The recorder of this test binary, with the worker's histograms as Prometheus histograms.
fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), m::SECONDS_BUCKETS)
            .unwrap()
            .set_buckets_for_metric(
                Matcher::Full(m::DELIVERY_ATTEMPTS.into()),
                m::ATTEMPTS_BUCKETS,
            )
            .unwrap()
            .install_recorder()
            .expect("the only recorder of this test binary")
    })
}

/// The value of the sample `name{labels...}` in Prometheus text (labels given must match;
/// others may be present). `None` when there is no such sample.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
        if metric != name {
            return None;
        }
        let body = rest.strip_suffix('}')?;
        let found: Vec<(&str, &str)> = body
            .split(',')
            .filter(|p| !p.is_empty())
            .filter_map(|p| {
                let (k, v) = p.split_once('=')?;
                Some((k, v.trim_matches('"')))
            })
            .collect();
        labels
            .iter()
            .all(|l| found.contains(l))
            .then(|| value.parse().ok())
            .flatten()
    })
}

/// Fails the first attempt of every event whose `n` is divisible by 3 (retryable), accepts
/// everything else.
struct FlakyEveryThird {
    calls: AtomicUsize,
}

impl Sink for FlakyEveryThird {
    fn deliver<'a>(
        &'a self,
        event: &'a ClaimedEvent,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::Relaxed);
            let n = event.payload["n"].as_i64().unwrap_or_default();
            if n % 3 == 0 && delivery.attempt() == 1 {
                Err(HandlerError::retry(
                    "first attempt of every third job fails",
                ))
            } else {
                Ok(())
            }
        })
    }
}

async fn enqueue_jobs(pool: &PgPool, n: i64) {
    let mut tx = pool.begin().await.unwrap();
    for i in 1..=n {
        MetricsJob { n: i }
            .enqueue_with(
                &mut tx,
                &format!("job-{i}"),
                &EnqueueOptions::without_notify(),
            )
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

/// Delivered events: those without a queue row.
async fn delivered(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM outbox AS e
         WHERE NOT EXISTS (SELECT 1 FROM outbox_queue AS q WHERE q.id = e.id)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_run_renders_histograms_whose_counts_match_what_was_delivered() {
    let handle = prometheus();
    let db = TestDatabase::new().await;
    const EVENTS: i64 = 30;
    const RETRIED: i64 = EVENTS / 3;
    let worker = Worker::builder(
        db.pool().clone(),
        FlakyEveryThird {
            calls: AtomicUsize::new(0),
        },
    )
    .poll_interval(Duration::from_millis(50))
    .retry(RetryPolicy {
        base: Duration::from_millis(20),
        max: Duration::from_millis(20),
        jitter: false,
    })
    .start()
    .await
    .unwrap();

    // Registered at zero before the first event: every counter and gauge has a series.
    let before = handle.render();
    for name in m::COUNTERS.iter().chain(m::GAUGES) {
        assert!(
            sample(&before, name, &[("table", "outbox")]).is_some(),
            "`{name}` has no series before the first event:\n{before}"
        );
    }

    enqueue_jobs(db.pool(), EVENTS).await;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while delivered(db.pool()).await < EVENTS {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{EVENTS} events not delivered within {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.shutdown().await;
    assert_eq!(worker.counters().retried, RETRIED as u64);

    let text = handle.render();
    let job = [("table", "outbox"), ("event_type", "metrics.job")];
    let count = |name: &str| -> f64 {
        sample(&text, &format!("{name}_count"), &job)
            .unwrap_or_else(|| panic!("no `{name}_count` for metrics.job in:\n{text}"))
    };
    let attempts = (EVENTS + RETRIED) as f64;
    assert_eq!(
        count(m::CLAIM_WAIT_SECONDS),
        attempts,
        "one wait per claim of an event"
    );
    assert_eq!(
        count(m::HANDLER_DURATION_SECONDS),
        attempts,
        "one duration per sink call"
    );
    assert_eq!(
        count(m::DELIVERY_LATENCY_SECONDS),
        EVENTS as f64,
        "one latency per delivered event"
    );
    assert_eq!(count(m::DELIVERY_ATTEMPTS), EVENTS as f64);
    assert_eq!(
        sample(&text, &format!("{}_sum", m::DELIVERY_ATTEMPTS), &job),
        Some(attempts),
        "the retried events took two attempts, the others one"
    );
    // A histogram, not a summary: buckets, the last one holding every sample; every event was
    // delivered well within a minute of its enqueue.
    let within_a_minute = sample(
        &text,
        &format!("{}_bucket", m::DELIVERY_LATENCY_SECONDS),
        &[
            ("table", "outbox"),
            ("event_type", "metrics.job"),
            ("le", "60"),
        ],
    );
    assert_eq!(within_a_minute, Some(EVENTS as f64), "{text}");
    let latency_sum = sample(&text, &format!("{}_sum", m::DELIVERY_LATENCY_SECONDS), &job).unwrap();
    assert!(latency_sum > 0.0, "latencies are measured: {latency_sum}");
    let claims = sample(
        &text,
        &format!("{}_count", m::CLAIM_DURATION_SECONDS),
        &[("table", "outbox")],
    )
    .expect("claim statements are timed");
    assert!(
        claims >= 2.0,
        "at least the first batch and a retry were claimed: {claims}"
    );
    assert_eq!(
        sample(&text, m::DELIVERED_TOTAL, &[("table", "outbox")]).map(|v| v >= EVENTS as f64),
        Some(true)
    );
    // No event ids (or anything else unbounded) in any label of the worker's series.
    for line in text.lines().filter(|l| l.starts_with("outbox_")) {
        for label in ["event_id", "row", "claim", "worker"] {
            assert!(
                !line.contains(&format!("{label}=\"")),
                "unbounded label in {line}"
            );
        }
    }
}

/// A sink that holds every delivery until released, so a delivery is in flight while the test
/// looks at the sessions (the renewer only works while one is).
struct Held {
    release: Notify,
}

impl Sink for Held {
    fn deliver<'a>(
        &'a self,
        _event: &'a ClaimedEvent,
        _delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            tokio::time::timeout(DEADLINE, self.release.notified())
                .await
                .map_err(|_| HandlerError::retry("never released"))
        })
    }
}

async fn sessions_named(pool: &PgPool, worker: &str) -> BTreeSet<String> {
    let rows: Vec<String> = sqlx::query_scalar(
        "SELECT application_name FROM pg_stat_activity \
         WHERE datname = current_database() AND application_name LIKE 'outbox-% ' || $1",
    )
    .bind(worker)
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter().collect()
}

#[tokio::test]
async fn every_worker_session_says_its_role_in_pg_stat_activity() {
    prometheus();
    let db = TestDatabase::new().await;
    let name = format!("sess-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let held = std::sync::Arc::new(Held {
        release: Notify::new(),
    });
    let worker = Worker::builder(db.pool().clone(), held.clone())
        .name(name.clone())
        .lease(Duration::from_secs(3))
        .poll_interval(Duration::from_millis(50))
        .maintenance_interval(Duration::from_millis(200))
        .start()
        .await
        .unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    SessionProbe { n: 1 }
        .enqueue(&mut tx, "probe-1")
        .await
        .unwrap();
    tx.commit().await.unwrap();

    // While the delivery is held: every role, the completer too, whose first session the start
    // opened (so the first completion does not wait for a connection).
    let expected: BTreeSet<String> = SessionRole::ALL
        .iter()
        .map(|role| application_name(*role, &name))
        .collect();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let seen = sessions_named(db.pool(), &name).await;
        if seen == expected {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "within {DEADLINE:?} the worker's sessions were {seen:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    held.release.notify_waiters();
    // The completer writes the completion on a session of its own.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while delivered(db.pool()).await < 1 {
        held.release.notify_waiters();
        assert!(
            tokio::time::Instant::now() < deadline,
            "the held event was not delivered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        sessions_named(db.pool(), &name)
            .await
            .contains(&application_name(SessionRole::Completer, &name)),
    );
    // The service's own pool keeps its own name: none of its sessions is the worker's.
    let own: Option<String> = sqlx::query_scalar("SELECT current_setting('application_name')")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert!(!own.unwrap_or_default().starts_with("outbox-"));

    worker.shutdown().await;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let left = sessions_named(db.pool(), &name).await;
        if left.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stopped worker left sessions open: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The maintenance leader publishes the queue gauges from the table's rows: waiting (delayed
/// ones included) and exhausted. The worker runs on a table of its own, so the other tests'
/// workers, which share this binary's recorder, cannot set the same series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_publishes_the_queue_gauges() {
    let handle = prometheus();
    let db = TestDatabase::new().await;
    let create = outbox_runtime::store::create_table_sql("gauged").unwrap();
    // Generated by the library from a validated name.
    sqlx::raw_sql(sqlx::AssertSqlSafe(create))
        .execute(db.pool())
        .await
        .unwrap();
    // Three waiting an hour (nothing is delivered meanwhile) and one exhausted; and one
    // delivered (an event without a queue row), which no queue gauge counts.
    sqlx::query(
        "WITH e AS (
             INSERT INTO gauged (event_id, operation_key, payload_fingerprint, event_type, event_version,
                                 payload)
             SELECT gen_random_uuid(), 'gauge-' || g, '\\x00', 'metrics.job', 1, '{}'
             FROM generate_series(1, 5) AS g
             RETURNING id, aggregate_type, aggregate_id, operation_key
         )
         INSERT INTO gauged_queue (id, aggregate_type, aggregate_id, available_at)
         SELECT id, aggregate_type, aggregate_id, now() + interval '1 hour' FROM e
         WHERE operation_key <> 'gauge-5'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    // The insert gave gauge-5 a queue row too (the table's trigger): delivered has none.
    sqlx::query(
        "DELETE FROM gauged_queue WHERE id = (SELECT id FROM gauged WHERE operation_key = 'gauge-5')",
    )
    .execute(db.pool())
    .await
    .unwrap();
    sqlx::query(
        "UPDATE gauged_queue SET status = 'exhausted', exhausted_at = now()
         WHERE id = (SELECT id FROM gauged WHERE operation_key = 'gauge-4')",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let worker = Worker::builder(
        db.pool().clone(),
        Held {
            release: Notify::new(),
        },
    )
    .table("gauged")
    .maintenance_interval(Duration::from_millis(100))
    .start()
    .await
    .unwrap();
    let table = [("table", "gauged")];
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let text = handle.render();
        let published = (
            sample(&text, m::PENDING, &table),
            sample(&text, m::EXHAUSTED, &table),
            sample(&text, m::PROCESSING, &table),
        );
        if published == (Some(3.0), Some(1.0), Some(0.0)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gauges (pending, exhausted, processing) {published:?} after {DEADLINE:?}, expected 3, 1, 0:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.shutdown().await;
}

/// The maintenance leader publishes how many ready events no live worker handles, per type and
/// version, and how long the oldest has waited: here two events of a type the only worker (a
/// dispatcher of `metrics.late`) has no handler for. On a table of its own, like the test above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_publishes_the_events_no_worker_handles() {
    let handle = prometheus();
    let db = TestDatabase::new().await;
    let create = outbox_runtime::store::create_table_sql("unhandled_gauged").unwrap();
    // Generated by the library from a validated name.
    sqlx::raw_sql(sqlx::AssertSqlSafe(create))
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::query(
        "WITH e AS (
             INSERT INTO unhandled_gauged (event_id, operation_key, payload_fingerprint, event_type,
                                           event_version, payload)
             SELECT gen_random_uuid(), 'nobody-' || g, '\\x00', 'metrics.nobody', 3, '{}'
             FROM generate_series(1, 2) AS g
             RETURNING id
         )
         INSERT INTO unhandled_gauged_queue (id, available_at)
         SELECT id, now() - interval '1 minute' FROM e",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let dispatcher = outbox_runtime::Dispatcher::builder()
        .handler(|_job: LateJob, _ctx: outbox_runtime::Delivery| async {
            Ok::<(), outbox_runtime::HandlerError>(())
        })
        .build()
        .unwrap();
    let worker = Worker::builder(db.pool().clone(), dispatcher)
        .table("unhandled_gauged")
        .maintenance_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    let labels = [
        ("table", "unhandled_gauged"),
        ("event_type", "metrics.nobody"),
        ("event_version", "3"),
    ];
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let text = handle.render();
        let waiting = sample(&text, m::UNHANDLED_EVENTS, &labels);
        let age = sample(&text, m::UNHANDLED_AGE_SECONDS, &labels);
        if waiting == Some(2.0) && age.is_some_and(|a| a >= 60.0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "unhandled gauges (waiting, age) {waiting:?}, {age:?} after {DEADLINE:?}, expected 2 and at least 60 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.shutdown().await;
    let attempts: Vec<i32> = sqlx::query_scalar("SELECT attempts FROM unhandled_gauged_queue")
        .fetch_all(db.pool())
        .await
        .unwrap();
    assert_eq!(attempts, [0, 0]);
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "metrics.late", version = 1)]
pub struct LateJob {
    pub n: i64,
}

/// A worker that accepts every event and polls every 50 ms, so each `LateJob` is delivered
/// soon after its commit.
async fn start_late_job_worker(pool: &PgPool) -> outbox_runtime::worker::WorkerHandle {
    Worker::builder(pool.clone(), Accept)
        .poll_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap()
}

/// Enqueue `LateJob { n }` and wait until `n` events are delivered.
async fn deliver_late_job(pool: &PgPool, n: i64) {
    let mut tx = pool.begin().await.unwrap();
    LateJob { n }
        .enqueue(&mut tx, &format!("late-{n}"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    wait_until(DEADLINE, &format!("{n} events are delivered"), || async {
        delivered(pool).await >= n
    })
    .await;
}

/// A service that installs its exporter after the worker started, and after the worker's
/// first deliveries, still gets the per-event histograms. The worker keeps each event type's
/// histogram handles for about a second and then registers them again with the recorder
/// installed then; handles kept for good would stay with the recorder of the first delivery.
/// (The recorder here is installed for this thread only, and the worker runs on this thread's
/// runtime, so the other tests' global recorder does not see this.)
#[test]
fn a_recorder_installed_after_the_first_deliveries_gets_the_event_histograms() {
    let runtime = current_thread_runtime();
    let (db, worker) = runtime.block_on(async {
        let db = TestDatabase::new().await;
        let worker = start_late_job_worker(db.pool()).await;
        deliver_late_job(db.pool(), 1).await;
        (db, worker)
    });

    let late = PrometheusBuilder::new().build_recorder();
    let handle = late.handle();
    let delivered_to_late = metrics::with_local_recorder(&late, || {
        runtime.block_on(deliver_until_recorded(db.pool(), &handle, 1))
    });
    // The first event after the refresh is recorded; the ones before it went to the recorder
    // the handles were registered with.
    assert!(delivered_to_late >= 2);
    runtime.block_on(async move {
        worker.shutdown().await;
        drop(db);
    });
}

/// The per-event delivery latency series of `metrics.late`, as `handle` renders it now.
fn late_latencies(handle: &PrometheusHandle) -> Option<f64> {
    let count = format!("{}_count", m::DELIVERY_LATENCY_SECONDS);
    sample(
        &handle.render(),
        &count,
        &[("table", "outbox"), ("event_type", "metrics.late")],
    )
}

/// Deliver one `LateJob` at a time, numbered on from `delivered`, until `handle` renders their
/// delivery latencies; returns how many were delivered in all.
async fn deliver_until_recorded(pool: &PgPool, handle: &PrometheusHandle, delivered: i64) -> i64 {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut n = delivered;
    loop {
        n += 1;
        deliver_late_job(pool, n).await;
        if late_latencies(handle).is_some() {
            return n;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} events delivered, none recorded in this recorder:\n{}",
            n - delivered,
            handle.render()
        );
        // One event now and then: the refresh comes with time, not with events.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An exporter that drops a series idle past its timeout shows it again once the event type is
/// delivered again: the worker registers its kept histogram handles anew after about a second,
/// and the exporter creates the series again. Handles kept for good would go on recording into
/// the dropped series, which no scrape shows. (A recorder for this thread only, as above.)
#[test]
fn an_exporter_that_dropped_an_idle_series_shows_it_again() {
    let runtime = current_thread_runtime();
    let recorder = PrometheusBuilder::new()
        .idle_timeout(
            metrics_util::MetricKindMask::HISTOGRAM,
            Some(Duration::from_millis(300)),
        )
        .build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let db = TestDatabase::new().await;
            let worker = start_late_job_worker(db.pool()).await;
            let delivered = deliver_until_recorded(db.pool(), &handle, 0).await;
            // A render past the timeout prunes the idle series.
            wait_until(DEADLINE, "the exporter drops the idle series", || async {
                late_latencies(&handle).is_none()
            })
            .await;
            deliver_until_recorded(db.pool(), &handle, delivered).await;
            worker.shutdown().await;
        })
    });
}

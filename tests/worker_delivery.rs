//! In-process workers delivering end to end: everything enqueued arrives once, completions are
//! batched, claiming respects free capacity, wake-ups come from NOTIFY, and poll-only works.

mod worker_support;

use std::collections::HashMap;
use std::time::Duration;

use outbox_runtime::Event;
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

    let rows = events(&pool).await;
    assert!(rows.iter().all(|r| r.status == "delivered"));
    assert!(
        queue_rows(&pool).await.is_empty(),
        "a delivered event keeps no queue row"
    );
    let log = received(&pool).await;
    assert_eq!(log.len(), 200, "the receiver saw each event exactly once");
    let mut per_event: HashMap<uuid::Uuid, usize> = HashMap::new();
    for r in &log {
        *per_event.entry(r.event_id).or_default() += 1;
        assert_eq!(r.idempotency_key, r.event_id.to_string());
        // Delivered by w1's first claim of it.
        assert_eq!(
            (r.attempt, r.claim_version, r.claimed_by.as_deref()),
            (1, 1, Some("w1"))
        );
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
        events(&pool).await.iter().map(|r| r.event_id).collect();
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
    // Both rows of each event: the queue row and the event row.
    wait_until(WAIT, "all 300 events are gone", || async {
        events(&pool).await.is_empty() && queue_rows(&pool).await.is_empty()
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

/// An event of its own table, so the metrics test's series (labelled with the table) are not
/// touched by the other tests of this binary.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema, Event)]
#[outbox(name = "metered", version = 1, table = "metered_outbox")]
struct Metered {
    n: i64,
}

/// A counter series: its name and its labels, in order.
type SeriesKey = (String, Vec<(String, String)>);

/// A recorder that keeps every registered counter (name and labels) with its value.
#[derive(Debug, Default)]
struct CountingRecorder {
    counters: std::sync::Mutex<HashMap<SeriesKey, std::sync::Arc<std::sync::atomic::AtomicU64>>>,
}

impl CountingRecorder {
    /// The value of counter `name` with exactly the label `table`, if registered.
    fn counter(&self, name: &str, table: &str) -> Option<u64> {
        let key = (
            name.to_owned(),
            vec![("table".to_owned(), table.to_owned())],
        );
        self.counters
            .lock()
            .unwrap()
            .get(&key)
            .map(|c| c.load(std::sync::atomic::Ordering::SeqCst))
    }
}

impl metrics::Recorder for CountingRecorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }

    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let labels = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        let cell = self
            .counters
            .lock()
            .unwrap()
            .entry((key.name().to_owned(), labels))
            .or_default()
            .clone();
        metrics::Counter::from_arc(cell)
    }

    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }

    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

/// Alerts like `rate(outbox_exhausted_total[5m]) > 0` need a series before the first event:
/// every counter exists, at zero and with the labels it is incremented with later, as soon as
/// the worker has started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_counter_is_registered_at_zero_when_the_worker_starts() {
    use outbox_runtime::worker::metrics::{
        DELIVERED_TOTAL, EXHAUSTED_TOTAL, LEASE_LOST_TOTAL, LEASE_RENEWALS_TOTAL, RELEASED_TOTAL,
        RETRIED_TOTAL, STALE_COMPLETIONS_TOTAL,
    };
    const TABLE: &str = "metered_outbox";
    let recorder: &'static CountingRecorder = Box::leak(Box::default());
    metrics::set_global_recorder(recorder).expect("the only recorder of this test binary");

    let db = database().await;
    let pool = db.pool().clone();
    sqlx::raw_sql(sqlx::AssertSqlSafe(
        outbox_runtime::store::create_table_sql(TABLE).unwrap(),
    ))
    .execute(&pool)
    .await
    .unwrap();
    let all = [
        DELIVERED_TOTAL,
        RETRIED_TOTAL,
        EXHAUSTED_TOTAL,
        STALE_COMPLETIONS_TOTAL,
        LEASE_RENEWALS_TOTAL,
        LEASE_LOST_TOTAL,
        RELEASED_TOTAL,
    ];
    for name in all {
        assert_eq!(recorder.counter(name, TABLE), None, "{name} before start");
    }
    let worker = Worker::builder(
        pool.clone(),
        Receiver::new(pool.clone(), "metered", Knobs::default()),
    )
    .table(TABLE)
    .start()
    .await
    .unwrap();
    for name in all {
        assert_eq!(
            recorder.counter(name, TABLE),
            Some(0),
            "{name}{{table=\"{TABLE}\"}} is registered at zero right after start"
        );
    }

    // The registered series is the one the worker counts in later (same name, same labels).
    let mut tx = pool.begin().await.unwrap();
    Metered { n: 1 }
        .enqueue_with(
            &mut tx,
            "metered-1",
            &outbox_runtime::store::EnqueueOptions::default(),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    wait_until(WAIT, "the event is delivered and counted", || async {
        recorder.counter(DELIVERED_TOTAL, TABLE) == Some(1)
    })
    .await;
    worker.shutdown().await;
}

//! A rolling deploy with real processes, following `docs/rolling-deploys.md`: workers of
//! release N (`examples/rolling_release_n.rs`, which handles `rolling.order_placed` v1), then
//! producers of release N+1 (`examples/rolling_release_n1.rs`, which writes v2 and upcasts v1),
//! then N+1's workers replacing N's one by one, while producers keep writing. Nothing is
//! exhausted or lost, every event is delivered once a worker that handles it runs (v2 only by
//! N+1), and every aggregate's events are delivered in order across the hand-over.
//!
//! And two services with different dispatchers on one table: each delivers its own events,
//! and neither exhausts the other's.
//!
//! Run with the examples built: `cargo test --test rolling_deploy --example rolling_release_n
//! --example rolling_release_n1` (a missing binary is built on first use).

mod worker_support;

use std::collections::HashMap;
use std::time::Duration;

use outbox_runtime::Store;
use sqlx::PgPool;
use worker_support::*;

const WAIT: Duration = Duration::from_secs(30);
const ORDER: &str = "rolling.order_placed";
const INVOICE: &str = "rolling.invoice_sent";

/// Create the receiving table (before any process starts: two processes racing on `CREATE
/// TABLE IF NOT EXISTS` can collide on the row type).
async fn received_table(pool: &PgPool) {
    sqlx::query(
        "CREATE TABLE rolling_received (
             seq            bigserial   PRIMARY KEY,
             event_id       uuid        NOT NULL,
             event_type     text        NOT NULL,
             stored_version integer     NOT NULL,
             worker         text        NOT NULL,
             received_at    timestamptz NOT NULL DEFAULT clock_timestamp())",
    )
    .execute(pool)
    .await
    .unwrap();
}

fn release_n(url: &str, name: &str, args: &[&str]) -> WorkerProcess {
    WorkerProcess::spawn_example("rolling_release_n", url, name, args)
}

fn release_n1(url: &str, name: &str, args: &[&str]) -> WorkerProcess {
    WorkerProcess::spawn_example("rolling_release_n1", url, name, args)
}

async fn started(process: WorkerProcess) -> WorkerProcess {
    process.wait_line("ready", WAIT).await;
    process
}

/// Ask `process` to stop (SIGTERM) and wait until it did, cleanly.
async fn stop(mut process: WorkerProcess) {
    process.terminate();
    assert!(
        process.wait_exit(WAIT).await,
        "{} did not stop cleanly: {:?}",
        process.name,
        process.output()
    );
}

async fn scalar(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

async fn delivered_events(pool: &PgPool) -> i64 {
    scalar(
        pool,
        "SELECT count(DISTINCT event_id) FROM rolling_received",
    )
    .await
}

async fn events_of_version(pool: &PgPool, version: i32) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE event_type = 'rolling.order_placed' AND event_version = $1",
    )
    .bind(version)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Every event of the table was received at least once, and none is left in the queue.
async fn assert_all_delivered(pool: &PgPool) {
    let missing = scalar(
        pool,
        "SELECT count(*) FROM outbox e
         WHERE NOT EXISTS (SELECT 1 FROM rolling_received r WHERE r.event_id = e.event_id)",
    )
    .await;
    assert_eq!(missing, 0, "events never received");
    assert!(
        queue_rows(pool).await.is_empty(),
        "{:?}",
        queue_rows(pool).await
    );
}

/// Per aggregate, the row ids of its events in the order they were first received, and in the
/// order they were enqueued (row id order is commit order per aggregate).
async fn aggregate_orders(pool: &PgPool) -> Vec<(String, Vec<i64>, Vec<i64>)> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT e.aggregate_id, e.id
         FROM outbox e
         JOIN (SELECT event_id, min(seq) AS first FROM rolling_received GROUP BY event_id) r
           ON r.event_id = e.event_id
         WHERE e.event_type = 'rolling.order_placed'
         ORDER BY r.first",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut received: HashMap<String, Vec<i64>> = HashMap::new();
    for (aggregate, id) in rows {
        received.entry(aggregate).or_default().push(id);
    }
    let mut out: Vec<_> = received
        .into_iter()
        .map(|(aggregate, ids)| {
            let mut enqueued = ids.clone();
            enqueued.sort_unstable();
            (aggregate, ids, enqueued)
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_deploy_of_a_new_event_version_exhausts_nothing_and_keeps_aggregate_order() {
    let db = database().await;
    let pool = db.pool();
    let url = db.url();
    received_table(pool).await;

    // Release N runs: two workers, one producer of v1.
    let n_workers = [
        started(release_n(&url, "w1", &["--mode", "worker"])).await,
        started(release_n(&url, "w2", &["--mode", "worker"])).await,
    ];
    let producer_n = started(release_n(&url, "p-n", &["--mode", "produce"])).await;
    wait_until(WAIT, "release N delivers", || async {
        delivered_events(pool).await >= 50
    })
    .await;

    // Step 2 of the guide: release N+1's producers write v2 while only N's workers run.
    let producer_n1 = started(release_n1(&url, "p-n1", &["--mode", "produce"])).await;
    wait_until(WAIT, "v2 events are written", || async {
        events_of_version(pool, 2).await >= 30
    })
    .await;
    stop(producer_n).await;
    // N's workers deliver every v1 event they may (not those behind a v2 event of their
    // aggregate: ordered), and so have had every chance to claim the v2 events at the head of
    // the queue. They did not: the v2 events wait, uncharged.
    wait_until(WAIT, "release N delivered what it may", || async {
        scalar(
            pool,
            "SELECT count(*) FROM outbox_queue q JOIN outbox e ON e.id = q.id
             WHERE e.event_version = 1 AND NOT EXISTS (
                 SELECT 1 FROM outbox_queue q2 JOIN outbox e2 ON e2.id = q2.id
                 WHERE e2.event_version = 2 AND e2.aggregate_id = e.aggregate_id AND e2.id < e.id)",
        )
        .await
            == 0
    })
    .await;
    let charged_v2 = scalar(
        pool,
        "SELECT count(*) FROM outbox_queue q JOIN outbox e ON e.id = q.id
         WHERE e.event_version = 2 AND (q.attempts > 0 OR q.status <> 'pending')",
    )
    .await;
    assert_eq!(charged_v2, 0, "v2 events claimed by release N");
    assert_eq!(count_status(pool, "exhausted").await, 0);
    // And they are shown as waiting for a worker, with N's two workers live.
    let store = Store::new(pool.clone());
    wait_until(WAIT, "status shows v2 waiting for a worker", || async {
        store
            .unhandled_events(10_000)
            .await
            .unwrap()
            .iter()
            .any(|u| u.event_type == ORDER && u.event_version == 2 && u.live_workers == 2)
    })
    .await;

    // Step 3: N+1's workers replace N's one by one, under load.
    let [w1, w2] = n_workers;
    let n1_w1 = started(release_n1(&url, "w1", &["--mode", "worker"])).await;
    stop(w1).await;
    let delivered_before = delivered_events(pool).await;
    wait_until(WAIT, "deliveries go on after the first swap", || async {
        delivered_events(pool).await >= delivered_before + 30
    })
    .await;
    let n1_w2 = started(release_n1(&url, "w2", &["--mode", "worker"])).await;
    stop(w2).await;
    let delivered_before = delivered_events(pool).await;
    wait_until(WAIT, "deliveries go on after the second swap", || async {
        delivered_events(pool).await >= delivered_before + 30
    })
    .await;
    stop(producer_n1).await;

    wait_until(WAIT, "every event is delivered", || async {
        queue_rows(pool).await.is_empty()
    })
    .await;
    stop(n1_w1).await;
    stop(n1_w2).await;

    assert_eq!(count_status(pool, "exhausted").await, 0);
    assert_all_delivered(pool).await;
    assert!(events_of_version(pool, 1).await >= 50);
    assert!(events_of_version(pool, 2).await >= 30);
    // v2 reached release N+1's workers only; v1 reached both releases.
    let v2_by_n = scalar(
        pool,
        "SELECT count(*) FROM rolling_received WHERE stored_version = 2 AND worker LIKE 'n/%'",
    )
    .await;
    assert_eq!(v2_by_n, 0);
    // Every aggregate's events, first receptions in enqueue order, across the hand-over.
    let orders = aggregate_orders(pool).await;
    assert!(orders.len() >= 10, "{orders:?}");
    for (aggregate, received, enqueued) in &orders {
        assert_eq!(received, enqueued, "aggregate {aggregate} out of order");
    }
    println!(
        "rolling deploy: {} v1 and {} v2 events over {} aggregates, {} receptions",
        events_of_version(pool, 1).await,
        events_of_version(pool, 2).await,
        orders.len(),
        scalar(pool, "SELECT count(*) FROM rolling_received").await
    );
    // Nothing left listed as waiting for a worker.
    assert!(store.unhandled_events(10_000).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_services_with_different_dispatchers_share_one_table() {
    let db = database().await;
    let pool = db.pool();
    let url = db.url();
    received_table(pool).await;

    let orders = started(release_n1(
        &url,
        "orders",
        &["--mode", "worker", "--service", "orders"],
    ))
    .await;
    let billing = started(release_n(
        &url,
        "billing",
        &["--mode", "worker", "--service", "billing"],
    ))
    .await;
    let producer = started(release_n1(&url, "p", &["--mode", "produce", "--invoices"])).await;
    wait_until(WAIT, "both services deliver", || async {
        scalar(pool, "SELECT count(*) FROM outbox").await >= 200
    })
    .await;
    stop(producer).await;
    wait_until(WAIT, "every event is delivered", || async {
        queue_rows(pool).await.is_empty()
    })
    .await;
    stop(orders).await;
    stop(billing).await;

    assert_eq!(count_status(pool, "exhausted").await, 0);
    assert_all_delivered(pool).await;
    let wrong_service: Vec<(String, String)> = sqlx::query_as(
        "SELECT DISTINCT event_type, worker FROM rolling_received
         WHERE (event_type = $1 AND worker <> 'n1/orders') OR (event_type = $2 AND worker <> 'n/billing')",
    )
    .bind(ORDER)
    .bind(INVOICE)
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(wrong_service.is_empty(), "{wrong_service:?}");
}

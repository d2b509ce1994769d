//! The maintenance leader vacuums the outbox tables (the event table and its queue table) once
//! dead rows pile up, and leaves them alone when told not to; and a drain changes the queue
//! table only, by heap-only updates. Autovacuum is switched off for the test's tables
//! (`autovacuum_enabled = false`), so the outcome does not depend on the server's own setting. (That the leader also
//! vacuums where autovacuum is on, and what that changes, is shown by `outbox-bench --workloads
//! bloat --bloat-autovacuum on`, in docs/benchmarks.md: flipping the server's autovacuum inside
//! the test suite would touch every other database on the server.)

mod worker_support;

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use outbox_runtime::store::ClaimedEvent;
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::worker::{Worker, WorkerEvent};
use outbox_runtime::{Delivery, HandlerError, Sink};
use sqlx::PgPool;
use tokio::sync::mpsc::UnboundedReceiver;
use worker_support::Accept;

/// More than the vacuum threshold (10,000 dead row versions) in each table: each delivered and
/// purged event leaves one in the event table (the purge's delete) and at least two in the
/// queue table (the claim's update, the completion's delete).
const EVENTS: i64 = 12_000;
/// The two tables, the queue table first (the order of [`vacuum_stats`]).
const TABLES: [&str; 2] = ["outbox_queue", "outbox"];
const WAIT: Duration = Duration::from_secs(90);

async fn table_without_autovacuum(pool: &PgPool, events: i64) {
    sqlx::raw_sql(
        "ALTER TABLE outbox SET (autovacuum_enabled = false);
         ALTER TABLE outbox_queue SET (autovacuum_enabled = false)",
    )
    .execute(pool)
    .await
    .unwrap();
    worker_support::insert_pings(pool, "vacuum", events).await;
}

/// (vacuum runs, dead row versions) of each of [`TABLES`], from the statistics views.
async fn vacuum_stats(pool: &PgPool) -> [(i64, i64); 2] {
    let mut stats = [(0, 0); 2];
    for (table, stat) in TABLES.iter().zip(&mut stats) {
        *stat = sqlx::query_as(
            "SELECT vacuum_count, n_dead_tup FROM pg_stat_user_tables WHERE relname = $1",
        )
        .bind(table)
        .fetch_one(pool)
        .await
        .unwrap();
    }
    stats
}

/// Rows left in the two tables: events not purged, and queue rows (events not delivered).
async fn rows_left(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT (SELECT count(*) FROM outbox) + (SELECT count(*) FROM outbox_queue)")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A worker with a fast maintenance interval; its test hook reports to the returned channel.
async fn start_worker(
    pool: &PgPool,
    vacuum: bool,
) -> (
    outbox_runtime::worker::WorkerHandle,
    UnboundedReceiver<WorkerEvent>,
) {
    let (tx, events) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::builder(pool.clone(), Accept)
        .concurrency(256)
        .batch_size(128)
        .retention(Some(Duration::from_millis(1)))
        .maintenance_interval(Duration::from_millis(200))
        .vacuum_dead_rows(vacuum)
        .events(tx)
        .start()
        .await
        .unwrap();
    (worker, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_vacuums_when_autovacuum_is_off() {
    let db = TestDatabase::new().await;
    let pool = db.pool().clone();
    table_without_autovacuum(&pool, EVENTS).await;
    let (worker, _events) = start_worker(&pool, true).await;

    let started = Instant::now();
    let stats = loop {
        let stats = vacuum_stats(&pool).await;
        if stats.iter().all(|(vacuums, _)| *vacuums >= 1) && rows_left(&pool).await == 0 {
            break stats;
        }
        assert!(
            started.elapsed() < WAIT,
            "not both tables vacuumed after {WAIT:?}: (vacuum_count, n_dead_tup) of {TABLES:?} \
             {stats:?}, rows left {}",
            rows_left(&pool).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    worker.shutdown().await;
    for (table, (vacuums, dead)) in TABLES.iter().zip(stats) {
        println!("{table}: vacuumed {vacuums} time(s); {dead} dead row versions left");
    }
}

/// Below the threshold (10,000 dead row versions for a small table) the leader leaves the tables
/// alone: 2,000 events leave at most three dead versions each (claim and completion in the
/// queue table, purge in the event table).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_threshold_the_leader_does_not_vacuum() {
    const FEW: i64 = 2_000;
    let db = TestDatabase::new().await;
    let pool = db.pool().clone();
    table_without_autovacuum(&pool, FEW).await;
    let (worker, mut events) = start_worker(&pool, true).await;

    // A vacuum on the way fails at once, not at the timeout. The event table's dead rows are
    // the purged events, the queue table's at least one per event (its completion).
    let dead = until_purged(&pool, [FEW, FEW], |stats| {
        assert!(
            stats.iter().all(|(vacuums, _)| *vacuums == 0),
            "vacuumed below the threshold: {stats:?}"
        );
    })
    .await;
    assert!(
        dead.iter().all(|d| *d < 10_000),
        "{dead:?} dead rows: more than the test means"
    );
    three_maintenance_passes(&mut events).await;
    worker.shutdown().await;
    let stats = vacuum_stats(&pool).await;
    assert!(
        stats.iter().all(|(vacuums, _)| *vacuums == 0),
        "vacuumed below the threshold: (vacuum_count, n_dead_tup) of {TABLES:?} {stats:?}"
    );
}

/// Wait until every event was delivered and purged and the statistics show at least
/// `min_dead` dead row versions in each of [`TABLES`] (backends flush statistics within
/// seconds); returns them. `check` sees (vacuum runs, dead rows) of both at every look.
async fn until_purged(
    pool: &PgPool,
    min_dead: [i64; 2],
    check: impl Fn([(i64, i64); 2]),
) -> [i64; 2] {
    let started = Instant::now();
    loop {
        let stats = vacuum_stats(pool).await;
        check(stats);
        let dead = stats.map(|(_, dead)| dead);
        if rows_left(pool).await == 0 && dead.iter().zip(min_dead).all(|(d, min)| *d >= min) {
            return dead;
        }
        assert!(
            started.elapsed() < WAIT,
            "rows left {}, n_dead_tup of {TABLES:?} {dead:?} after {WAIT:?}",
            rows_left(pool).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Wait for three more maintenance passes of the leader (each would have vacuumed if it were
/// going to).
async fn three_maintenance_passes(events: &mut UnboundedReceiver<WorkerEvent>) {
    while events.try_recv().is_ok() {}
    let mut passes = 0;
    while passes < 3 {
        match tokio::time::timeout(WAIT, events.recv()).await {
            Ok(Some(WorkerEvent::MaintenanceRan { .. })) => passes += 1,
            Ok(Some(_)) => {}
            Ok(None) => panic!("the worker's event channel closed"),
            Err(_) => panic!("no maintenance pass within {WAIT:?} (after {passes})"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_option_dead_rows_pile_up() {
    let db = TestDatabase::new().await;
    let pool = db.pool().clone();
    table_without_autovacuum(&pool, EVENTS).await;
    let (worker, mut events) = start_worker(&pool, false).await;

    let dead = until_purged(&pool, [10_000, 10_000], |_| {}).await;
    // Three more maintenance passes of the leader (each one would have vacuumed by now): none
    // of them may vacuum either table.
    three_maintenance_passes(&mut events).await;
    worker.shutdown().await;
    let stats = vacuum_stats(&pool).await;
    assert!(
        stats.iter().all(|(vacuums, _)| *vacuums == 0),
        "vacuumed although told not to ({dead:?} dead rows): {stats:?}"
    );
}

/// (updates, heap-only updates) of `table` since the database was created.
async fn updates(pool: &PgPool, table: &str) -> (i64, i64) {
    sqlx::query_as("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = $1")
        .bind(table)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Holds each delivery a little, so that its lease is renewed while it runs.
struct Slow;

impl Sink for Slow {
    fn deliver<'a>(
        &'a self,
        _event: &'a ClaimedEvent,
        _delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(())
        })
    }
}

/// What makes a drain cheap: the event table is written once by the enqueue and never updated,
/// and the queue table's claims and renewals are heap-only updates (no index entry written; the
/// indexes read none of the columns they change, and fillfactor 50 leaves room for the new
/// versions on the page). An index on a column a claim sets, a claim or completion that
/// touched the event row, or a full page would each show here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_updates_only_the_queue_table_and_only_heap_only() {
    const DRAINED: i64 = 2_000;
    let db = TestDatabase::new().await;
    let pool = db.pool().clone();
    table_without_autovacuum(&pool, DRAINED).await;
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::builder(pool.clone(), Slow)
        .concurrency(200)
        .batch_size(100)
        .lease(Duration::from_secs(2))
        .renew_interval(Duration::from_millis(100))
        .events(tx)
        .start()
        .await
        .unwrap();
    worker_support::wait_until(WAIT, "every event is delivered", || async {
        worker_support::count_status(&pool, "delivered").await == DRAINED
    })
    .await;
    // The worker's sessions flush their statistics when they close.
    worker.shutdown().await;
    let mut renewed = 0;
    while let Ok(event) = events.try_recv() {
        if let WorkerEvent::Renewed(n) = event {
            renewed += n as i64;
        }
    }
    assert!(
        renewed > 0,
        "no lease was renewed: the test means renewals too"
    );

    // Every event claimed once, and every renewal: that many updates of the queue table.
    let wanted = DRAINED + renewed;
    let started = Instant::now();
    let queue = loop {
        let queue = updates(&pool, "outbox_queue").await;
        if queue.0 >= wanted {
            break queue;
        }
        assert!(
            started.elapsed() < WAIT,
            "{} updates of outbox_queue counted, {wanted} made",
            queue.0
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        updates(&pool, "outbox").await,
        (0, 0),
        "the event table was updated"
    );
    let (all, hot) = queue;
    println!("outbox_queue: {all} updates ({DRAINED} claims, {renewed} renewals), {hot} heap-only");
    assert!(
        hot * 5 >= all * 4,
        "{hot} of {all} updates of the queue table were heap-only"
    );
}

/// The event table is insert-only until its first purge (a retention later), so it has no dead
/// rows to count; but its BRIN index on `created_at`, which the purge reads, covers only the page
/// ranges a vacuum summarized, and the purge reads every other range whole. So the leader
/// vacuums it once 10,000 rows were inserted since its last vacuum, and afterwards only the last
/// range, which the inserts had not filled, is left for `brin_summarize_new_values` (a vacuum
/// leaves a partial range alone; without the vacuum, every range of the 12,000 events, a full one
/// and the partial one, is left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_only_event_table_is_vacuumed_so_its_brin_index_covers_it() {
    let db = TestDatabase::new().await;
    let pool = db.pool().clone();
    table_without_autovacuum(&pool, EVENTS).await;
    // Delivered events are kept (no purge): the event table sees inserts only.
    let worker = Worker::builder(pool.clone(), Accept)
        .concurrency(256)
        .batch_size(128)
        .retention(None)
        .maintenance_interval(Duration::from_millis(200))
        .start()
        .await
        .unwrap();

    let started = Instant::now();
    loop {
        let [_, (event_vacuums, event_dead)] = vacuum_stats(&pool).await;
        assert_eq!(event_dead, 0, "the event table was only inserted into");
        if event_vacuums >= 1 {
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "the insert-only event table ({EVENTS} rows) was not vacuumed after {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    worker.shutdown().await;
    let unsummarized: i32 =
        sqlx::query_scalar("SELECT brin_summarize_new_values('outbox_created_brin'::regclass)")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(
        unsummarized <= 1,
        "{unsummarized} page ranges of the event table left out of its BRIN index after the \
         leader's vacuum (only the last, partial one may be)"
    );
}

//! The maintenance leader vacuums the outbox table once dead rows pile up, and leaves it alone
//! when told not to. Autovacuum is switched off for the test's table (`autovacuum_enabled =
//! false`), so the outcome does not depend on the server's own setting. (That the leader also
//! vacuums where autovacuum is on, and what that changes, is shown by `outbox-bench --workloads
//! bloat --bloat-autovacuum on`, in docs/benchmarks.md: flipping the server's autovacuum inside
//! the test suite would touch every other database on the server.)

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use outbox_runtime::store::ClaimedEvent;
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::worker::{Worker, WorkerEvent};
use outbox_runtime::{Delivery, HandlerError, Sink};
use sqlx::PgPool;
use tokio::sync::mpsc::UnboundedReceiver;

/// More than the vacuum threshold (10,000 dead row versions): each delivered and purged event
/// leaves at least two.
const EVENTS: i64 = 8_000;
const WAIT: Duration = Duration::from_secs(90);

/// Accepts everything.
struct Accept;

impl Sink for Accept {
    fn deliver<'a>(
        &'a self,
        _event: &'a ClaimedEvent,
        _delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async { Ok(()) })
    }
}

async fn table_without_autovacuum(pool: &PgPool, events: i64) {
    sqlx::query("ALTER TABLE outbox SET (autovacuum_enabled = false)")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload)
         SELECT gen_random_uuid(), 'vacuum-' || g, '\\x00', 'ping', 1, jsonb_build_object('n', g)
         FROM generate_series(1, $1) AS g",
    )
    .bind(events)
    .execute(pool)
    .await
    .unwrap();
}

/// (vacuum runs, dead row versions) of the outbox table, from the statistics views.
async fn vacuum_stats(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as(
        "SELECT vacuum_count, n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn rows_left(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox")
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
    let (vacuums, dead) = loop {
        let (vacuums, dead) = vacuum_stats(&pool).await;
        if vacuums >= 1 && rows_left(&pool).await == 0 {
            break (vacuums, dead);
        }
        assert!(
            started.elapsed() < WAIT,
            "no VACUUM after {WAIT:?}: vacuum_count {vacuums}, n_dead_tup {dead}, rows left {}",
            rows_left(&pool).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    worker.shutdown().await;
    println!("vacuumed {vacuums} time(s); {dead} dead row versions left");
    assert!(vacuums >= 1);
}

/// Below the threshold (10,000 dead row versions for a small table) the leader leaves the table
/// alone: 2,000 events leave at most three dead versions each (claim, completion, purge).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_threshold_the_leader_does_not_vacuum() {
    const FEW: i64 = 2_000;
    let db = TestDatabase::new().await;
    let pool = db.pool().clone();
    table_without_autovacuum(&pool, FEW).await;
    let (worker, mut events) = start_worker(&pool, true).await;

    // A vacuum on the way fails at once, not at the timeout.
    let dead = until_purged(&pool, FEW, |vacuums, dead| {
        assert_eq!(
            vacuums, 0,
            "vacuumed below the threshold ({dead} dead rows)"
        );
    })
    .await;
    assert!(dead < 10_000, "{dead} dead rows: more than the test means");
    three_maintenance_passes(&mut events).await;
    worker.shutdown().await;
    let (vacuums, _) = vacuum_stats(&pool).await;
    assert_eq!(
        vacuums, 0,
        "vacuumed below the threshold ({dead} dead rows)"
    );
}

/// Wait until every row was delivered and purged and the statistics show at least `min_dead`
/// dead row versions (backends flush statistics within seconds); returns them. `check` sees
/// (vacuum runs, dead rows) at every look.
async fn until_purged(pool: &PgPool, min_dead: i64, check: impl Fn(i64, i64)) -> i64 {
    let started = Instant::now();
    loop {
        let (vacuums, dead) = vacuum_stats(pool).await;
        check(vacuums, dead);
        if rows_left(pool).await == 0 && dead >= min_dead {
            return dead;
        }
        assert!(
            started.elapsed() < WAIT,
            "rows left {}, n_dead_tup {dead} after {WAIT:?}",
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

    let dead = until_purged(&pool, 10_000, |_, _| {}).await;
    // Three more maintenance passes of the leader (each one would have vacuumed by now): none
    // of them may vacuum.
    three_maintenance_passes(&mut events).await;
    worker.shutdown().await;
    let (vacuums, _) = vacuum_stats(&pool).await;
    assert_eq!(
        vacuums, 0,
        "vacuumed although told not to ({dead} dead rows)"
    );
}

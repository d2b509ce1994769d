//! Sustained run: events enqueued at a steady rate while a worker delivers them and its
//! maintenance purges delivered rows past a short retention. Dead tuples and the table's size
//! are sampled at a fixed interval; bounded means they stop growing once purge and autovacuum
//! keep pace.

use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::Event;
use outbox_runtime::store::EnqueueOptions;
use outbox_runtime::worker::Worker;
use serde::Serialize;
use sqlx::PgPool;
use tokio::time::Instant;

use crate::BenchResult;
use crate::db::BenchDb;
use crate::drain::{DrainSetting, stop};
use crate::event::PayloadShape;
use crate::sink::CountingSink;

/// Table statistics of the outbox (the cumulative statistics system lags by up to a second).
const SAMPLE: &str = "SELECT coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0), \
      pg_total_relation_size('outbox'), coalesce(s.autovacuum_count, 0), \
      (SELECT count(*) FROM outbox WHERE delivered_at IS NULL AND exhausted_at IS NULL) \
    FROM (SELECT 1) AS one LEFT JOIN pg_stat_user_tables AS s ON s.relname = 'outbox'";

/// Enqueuing connections.
const ENQUEUERS: u64 = 2;

/// One sample of the sustained run.
#[derive(Debug, Clone, Serialize)]
pub struct BloatSample {
    /// Seconds since the run started.
    pub at_secs: u64,
    /// Live tuples (statistics).
    pub live_tuples: i64,
    /// Dead tuples (statistics).
    pub dead_tuples: i64,
    /// Heap + indexes + TOAST, bytes.
    pub total_bytes: i64,
    /// Autovacuum runs on the table so far.
    pub autovacuums: i64,
    /// Events pending or processing (the backlog).
    pub backlog: i64,
    /// Events delivered so far.
    pub delivered: i64,
}

/// Everything the sustained run measured.
#[derive(Debug, Clone, Serialize)]
pub struct BloatRun {
    /// Seconds the enqueuers ran.
    pub secs: u64,
    /// Events per second asked for.
    pub rate: u64,
    /// Events enqueued.
    pub enqueued: i64,
    /// The series.
    pub samples: Vec<BloatSample>,
}

/// Run for `secs` at `rate` events/s, sampling every `every` seconds.
pub async fn run(
    db: &BenchDb,
    setting: DrainSetting,
    (secs, every): (u64, u64),
    rate: u64,
    retention: Duration,
    shape: &PayloadShape,
) -> BenchResult<BloatRun> {
    db.truncate_outboxes().await?;
    db.settle().await?;
    let sink = Arc::new(CountingSink::counting());
    let mut handles = Vec::new();
    for _ in 0..setting.workers {
        handles.push(
            Worker::builder(db.pool().clone(), Arc::clone(&sink))
                .concurrency(setting.concurrency)
                .batch_size(setting.batch_size)
                .completion_batch(setting.completion_batch, Duration::from_millis(5))
                .retention(Some(retention))
                .maintenance_interval(Duration::from_secs(1))
                .start()
                .await?,
        );
    }
    let started = Instant::now();
    let until = started + Duration::from_secs(secs);
    let enqueuers = db.extra_pool(ENQUEUERS as u32).await?;
    let mut joins = Vec::new();
    for k in 0..ENQUEUERS {
        let (pool, shape) = (enqueuers.clone(), shape.clone());
        joins.push(tokio::spawn(enqueue_steadily(pool, k, rate, until, shape)));
    }
    let mut samples = vec![sample(db.pool(), 0, sink.delivered()).await?];
    let mut next = started;
    loop {
        next += Duration::from_secs(every);
        if next > until {
            break;
        }
        tokio::time::sleep_until(next).await;
        let at = next.duration_since(started).as_secs();
        samples.push(sample(db.pool(), at, sink.delivered()).await?);
    }
    let mut enqueued = 0;
    for join in joins {
        enqueued += join.await??;
    }
    enqueuers.close().await;
    stop(handles).await;
    Ok(BloatRun {
        secs,
        rate,
        enqueued,
        samples,
    })
}

/// Enqueuer `k` of [`ENQUEUERS`]: one event per transaction at `rate / ENQUEUERS` per second
/// until `until`; returns how many it wrote. Falls behind (never bursts) when the server is slow.
async fn enqueue_steadily(
    pool: PgPool,
    k: u64,
    rate: u64,
    until: Instant,
    shape: PayloadShape,
) -> BenchResult<i64> {
    let period = Duration::from_secs_f64(ENQUEUERS as f64 / rate.max(1) as f64);
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let options = EnqueueOptions::default();
    let mut written = 0i64;
    let mut id = k as i64 + 1;
    while Instant::now() < until {
        ticks.tick().await;
        let mut tx = pool.begin().await?;
        shape
            .event(id)
            .enqueue_with(&mut tx, &format!("sustained-{id}"), &options)
            .await?;
        tx.commit().await?;
        written += 1;
        id += ENQUEUERS as i64;
    }
    Ok(written)
}

async fn sample(pool: &PgPool, at_secs: u64, delivered: i64) -> BenchResult<BloatSample> {
    let (live_tuples, dead_tuples, total_bytes, autovacuums, backlog): (i64, i64, i64, i64, i64) =
        sqlx::query_as(SAMPLE).fetch_one(pool).await?;
    Ok(BloatSample {
        at_secs,
        live_tuples,
        dead_tuples,
        total_bytes,
        autovacuums,
        backlog,
        delivered,
    })
}

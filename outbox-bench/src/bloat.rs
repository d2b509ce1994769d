//! Sustained run: events enqueued at a steady rate while a worker delivers them and its
//! maintenance purges delivered events past a short retention (counted from their enqueue).
//! Dead tuples and the size of the outbox's two tables (the events and their queue, with their
//! indexes) are sampled at a fixed interval; bounded means they stop growing once purge and
//! vacuum keep pace.

use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::producer::Producer;
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

/// Table statistics of the outbox: its two tables together, the events and their queue, with
/// their indexes (the cumulative statistics system lags by up to a second). One row even before
/// the statistics have a row for either table.
const SAMPLE: &str = "SELECT coalesce(sum(s.n_live_tup), 0)::bigint, coalesce(sum(s.n_dead_tup), 0)::bigint, \
      pg_total_relation_size('outbox') + pg_total_relation_size('outbox_queue'), \
      coalesce(sum(s.autovacuum_count), 0)::bigint, coalesce(sum(s.vacuum_count), 0)::bigint, \
      (SELECT count(*) FROM outbox_queue WHERE exhausted_at IS NULL) \
    FROM pg_stat_user_tables AS s WHERE s.relid IN ('outbox'::regclass, 'outbox_queue'::regclass)";

/// The server's `autovacuum` during one sustained run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Autovacuum {
    /// As the server is configured (not changed).
    Server,
    /// Off for the run (`ALTER SYSTEM`, reload), set back after.
    Off,
    /// On for the run, set back after.
    On,
    /// One run with it off, then one with it on.
    Both,
}

impl Autovacuum {
    /// The runs this choice asks for: `None` leaves the server as it is.
    pub fn series(self) -> Vec<Option<bool>> {
        match self {
            Autovacuum::Server => vec![None],
            Autovacuum::Off => vec![Some(false)],
            Autovacuum::On => vec![Some(true)],
            Autovacuum::Both => vec![Some(false), Some(true)],
        }
    }
}

/// How a run of [`Autovacuum::series`] is labelled: `on`, `off`, or `server` (not changed).
pub fn label(autovacuum: Option<bool>) -> &'static str {
    match autovacuum {
        None => "server",
        Some(true) => "on",
        Some(false) => "off",
    }
}

/// What `ALTER SYSTEM` changed, to be undone after the run.
pub struct AutovacuumChange {
    /// The statement that restores the server's own setting.
    restore: &'static str,
    /// The value the server had before, reported again once the restore is applied.
    original: String,
}

/// The statement that sets autovacuum `on` or off through `ALTER SYSTEM`.
fn alter_system(on: bool) -> &'static str {
    if on {
        "ALTER SYSTEM SET autovacuum = on"
    } else {
        "ALTER SYSTEM SET autovacuum = off"
    }
}

/// Switch the server's autovacuum for one run (a superuser's `ALTER SYSTEM` and a reload) and
/// wait until this server reports the new value.
pub async fn switch_autovacuum(pool: &PgPool, on: bool) -> BenchResult<AutovacuumChange> {
    let (setting, from_alter_system): (String, Option<bool>) = sqlx::query_as(
        "SELECT setting, sourcefile LIKE '%postgresql.auto.conf' FROM pg_settings WHERE name = 'autovacuum'",
    )
    .fetch_one(pool)
    .await?;
    // Set by an earlier ALTER SYSTEM: put that value back; else drop ours, and the
    // configuration file's value applies again.
    let restore = if from_alter_system == Some(true) {
        alter_system(setting == "on")
    } else {
        "ALTER SYSTEM RESET autovacuum"
    };
    sqlx::query(alter_system(on)).execute(pool).await?;
    reload_until(pool, label(Some(on))).await?;
    Ok(AutovacuumChange {
        restore,
        original: setting,
    })
}

impl AutovacuumChange {
    /// Put the server's own setting back, and wait until it applies: the next
    /// [`switch_autovacuum`] reads where the setting comes from, and must not mistake ours for
    /// the server's.
    pub async fn undo(self, pool: &PgPool) -> BenchResult<()> {
        sqlx::query(self.restore).execute(pool).await?;
        reload_until(pool, &self.original).await
    }
}

/// Reload the configuration and wait (at most 10 s) until the server reports `autovacuum` at
/// `wanted`.
async fn reload_until(pool: &PgPool, wanted: &str) -> BenchResult<()> {
    sqlx::query("SELECT pg_reload_conf()").execute(pool).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // A session applies the reload when it next reads a command, once the signal reached it.
        let now: String = sqlx::query_scalar("SHOW autovacuum")
            .fetch_one(pool)
            .await?;
        if now == wanted {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("autovacuum is still {now} 10 s after the reload").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One sample of the sustained run.
#[derive(Debug, Clone, Serialize)]
pub struct BloatSample {
    /// Seconds since the run started.
    pub at_secs: u64,
    /// Live tuples of both tables (statistics).
    pub live_tuples: i64,
    /// Dead tuples of both tables (statistics).
    pub dead_tuples: i64,
    /// Heap + indexes + TOAST of both tables, bytes.
    pub total_bytes: i64,
    /// Autovacuum runs on either table so far.
    pub autovacuums: i64,
    /// Other `VACUUM`s of either table so far (the maintenance leader's).
    pub vacuums: i64,
    /// Events pending or processing (the backlog).
    pub backlog: i64,
    /// Events delivered so far.
    pub delivered: i64,
}

/// Everything the sustained run measured.
#[derive(Debug, Clone, Serialize)]
pub struct BloatRun {
    /// `autovacuum` during the run: `on`, `off`, or `server` (not changed).
    pub autovacuum: String,
    /// Retention of delivered events, in seconds.
    pub retention_secs: u64,
    /// Seconds the enqueuers ran.
    pub secs: u64,
    /// Events per second asked for.
    pub rate: u64,
    /// Events enqueued.
    pub enqueued: i64,
    /// The series.
    pub samples: Vec<BloatSample>,
}

/// How one sustained run is driven.
#[derive(Debug, Clone, Copy)]
pub struct BloatPlan {
    /// Seconds to run.
    pub secs: u64,
    /// Seconds between samples.
    pub every: u64,
    /// Events per second asked for.
    pub rate: u64,
    /// Connections enqueuing, one event per transaction each.
    pub enqueuers: u64,
    /// Retention of delivered events.
    pub retention: Duration,
}

/// Run for `plan.secs` at `plan.rate` events/s, sampling every `plan.every` seconds; the
/// enqueuers use a [`Producer`] (the workers are woken after each commit).
pub async fn run(
    db: &BenchDb,
    setting: DrainSetting,
    plan: BloatPlan,
    autovacuum: &str,
    shape: &PayloadShape,
) -> BenchResult<BloatRun> {
    let BloatPlan {
        secs,
        every,
        rate,
        enqueuers: connections,
        retention,
    } = plan;
    db.truncate_outboxes().await?;
    db.settle().await?;
    let sink = Arc::new(CountingSink::counting());
    let mut handles = Vec::new();
    for _ in 0..setting.workers {
        handles.push(
            Worker::builder(db.pool().clone(), Arc::clone(&sink))
                .concurrency(setting.concurrency)
                .batch_size(setting.batch_size)
                .prefetch(setting.prefetch)
                .completion_batch(setting.completion_batch, Duration::from_millis(5))
                .retention(Some(retention))
                .maintenance_interval(Duration::from_secs(1))
                .start()
                .await?,
        );
    }
    let started = Instant::now();
    let until = started + Duration::from_secs(secs);
    let enqueuers = db
        .extra_pool(u32::try_from(connections).unwrap_or(u32::MAX))
        .await?;
    let producer = Producer::new(enqueuers.clone());
    let mut joins = Vec::new();
    for k in 0..connections {
        let (producer, shape) = (producer.clone(), shape.clone());
        let pace = Pace {
            k,
            of: connections,
            rate,
            until,
        };
        joins.push(tokio::spawn(enqueue_steadily(producer, pace, shape)));
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
        autovacuum: autovacuum.to_owned(),
        retention_secs: retention.as_secs(),
        secs,
        rate,
        enqueued,
        samples,
    })
}

/// Enqueuer `k` of `of`, at `rate / of` events per second until `until`.
struct Pace {
    k: u64,
    of: u64,
    rate: u64,
    until: Instant,
}

/// One event per transaction at the enqueuer's pace; returns how many it wrote. Falls behind
/// (never bursts) when the server is slow.
async fn enqueue_steadily(producer: Producer, pace: Pace, shape: PayloadShape) -> BenchResult<i64> {
    let of = pace.of.max(1);
    let period = Duration::from_secs_f64(of as f64 / pace.rate.max(1) as f64);
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let options = EnqueueOptions::default();
    let mut written = 0i64;
    let mut id = pace.k as i64 + 1;
    while Instant::now() < pace.until {
        ticks.tick().await;
        let mut tx = producer.begin().await?;
        tx.enqueue_with(&shape.event(id), &format!("sustained-{id}"), &options)
            .await?;
        tx.commit().await?;
        written += 1;
        id += of as i64;
    }
    Ok(written)
}

async fn sample(pool: &PgPool, at_secs: u64, delivered: i64) -> BenchResult<BloatSample> {
    let (live_tuples, dead_tuples, total_bytes, autovacuums, vacuums, backlog): (
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
    ) = sqlx::query_as(SAMPLE).fetch_one(pool).await?;
    Ok(BloatSample {
        at_secs,
        live_tuples,
        dead_tuples,
        total_bytes,
        autovacuums,
        vacuums,
        backlog,
        delivered,
    })
}

//! Drain: pre-insert N events with the typed enqueue (untimed), then time their delivery by the
//! worker to a no-op sink, until the queue table shows none pending or processing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_runtime::store::DEFAULT_TABLE;
use outbox_runtime::store::EnqueueOptions;
use outbox_runtime::worker::{Worker, WorkerConfig, WorkerHandle};
use outbox_runtime::{Event, Sink};

use crate::BenchResult;
use crate::allocs::AllocSample;
use crate::ceiling::{self, Completion};
use crate::cpu::{CpuSample, CpuSplit};
use crate::db::BenchDb;
use crate::event::PayloadShape;
use crate::sink::CountingSink;

/// Events per pre-insert transaction.
const PREFILL_PER_TX: i64 = 500;
/// Concurrent pre-insert transactions.
const PREFILL_CLIENTS: i64 = 4;
/// A drain that has not finished by then is reported as failed.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(600);

/// One worker configuration of the drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DrainSetting {
    /// Worker instances in this process.
    pub workers: usize,
    /// Deliveries in flight per worker.
    pub concurrency: usize,
    /// Events per claim statement.
    pub batch_size: usize,
    /// Claimed events that may wait for a delivery slot (the bound of the adaptive window).
    pub prefetch: usize,
    /// Completions per statement.
    pub completion_batch: usize,
    /// Complete by deleting the rows (a retention of zero) instead of marking them delivered.
    pub delete_on_completion: bool,
}

impl DrainSetting {
    /// The builder's defaults, one worker.
    pub fn defaults() -> Self {
        let config = WorkerConfig::new(DEFAULT_TABLE);
        DrainSetting {
            workers: 1,
            concurrency: config.concurrency,
            batch_size: config.batch_size,
            prefetch: config.prefetch,
            completion_batch: config.completion_batch,
            delete_on_completion: false,
        }
    }

    /// Parse `workers:concurrency:batch:prefetch:completion_batch` (the `--setting` flag).
    pub fn parse(text: &str) -> Result<Self, String> {
        let parts: Vec<&str> = text.split(':').collect();
        let numbers: Vec<usize> = parts
            .iter()
            .map(|p| p.trim().parse::<usize>())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{text:?}: {e}; expected workers:concurrency:batch:prefetch:completion_batch, e.g. 1:64:256:512:512"))?;
        let [workers, concurrency, batch_size, prefetch, completion_batch] = numbers[..] else {
            return Err(format!(
                "{text:?} has {} numbers; expected five, workers:concurrency:batch:prefetch:completion_batch, e.g. 1:64:256:512:512",
                numbers.len()
            ));
        };
        if workers == 0 || concurrency == 0 || batch_size == 0 || completion_batch == 0 {
            return Err(format!(
                "{text:?}: workers, concurrency, batch and completion_batch must be at least 1"
            ));
        }
        Ok(DrainSetting {
            workers,
            concurrency,
            batch_size,
            prefetch,
            completion_batch,
            delete_on_completion: false,
        })
    }

    /// The same setting, completing by deleting the rows.
    pub fn deleting(self) -> Self {
        DrainSetting {
            delete_on_completion: true,
            ..self
        }
    }

    /// How the table shows this setting.
    pub fn label(&self) -> String {
        format!(
            "workers={} concurrency={} batch={} prefetch={} completion_batch={}{}",
            self.workers,
            self.concurrency,
            self.batch_size,
            self.prefetch,
            self.completion_batch,
            if self.delete_on_completion {
                " delete"
            } else {
                ""
            }
        )
    }

    /// Start this many workers delivering to `sink` (each worker gets a clone).
    pub async fn start<S: Sink + Clone>(
        &self,
        db: &BenchDb,
        sink: &S,
    ) -> BenchResult<Vec<WorkerHandle>> {
        let mut handles = Vec::with_capacity(self.workers);
        for _ in 0..self.workers {
            let mut builder = Worker::builder(db.pool().clone(), sink.clone())
                .concurrency(self.concurrency)
                .batch_size(self.batch_size)
                .prefetch(self.prefetch)
                .completion_batch(self.completion_batch, Duration::from_millis(5))
                .lease(Duration::from_secs(30));
            // Retention zero deletes each row in its completion; otherwise the builder's
            // retention keeps the delivered rows (nothing is purged within a drain).
            if self.delete_on_completion {
                builder = builder.retention(Some(Duration::ZERO));
            }
            let handle = builder.start().await?;
            handles.push(handle);
        }
        Ok(handles)
    }
}

/// Stop every worker and wait for each to finish.
pub async fn stop(handles: Vec<WorkerHandle>) {
    for handle in &handles {
        handle.begin_shutdown();
    }
    for handle in &handles {
        handle.stopped().await;
    }
}

/// Insert `n` events with the typed enqueue, `PREFILL_PER_TX` per transaction, without the
/// wake-up (no worker is running yet); each enqueue inside a span of its own when
/// `producer_spans` (with the `opentelemetry` feature and a recording layer, each event then
/// carries its own trace).
pub async fn prefill_typed(
    db: &BenchDb,
    n: i64,
    shape: &PayloadShape,
    producer_spans: bool,
) -> BenchResult<()> {
    use tracing::Instrument;
    let options = EnqueueOptions {
        notify: false,
        ..Default::default()
    };
    let mut joins = Vec::new();
    for client in 0..PREFILL_CLIENTS {
        let pool = db.pool().clone();
        let (shape, options) = (shape.clone(), options.clone());
        joins.push(tokio::spawn(async move {
            // Client k writes ids k+1, k+1+C, ... in transactions of PREFILL_PER_TX.
            let mut ids = (client + 1..=n)
                .step_by(PREFILL_CLIENTS as usize)
                .peekable();
            while ids.peek().is_some() {
                let mut tx = pool.begin().await?;
                for id in ids.by_ref().take(PREFILL_PER_TX as usize) {
                    let span = if producer_spans {
                        tracing::info_span!("bench_producer")
                    } else {
                        tracing::Span::none()
                    };
                    shape
                        .event(id)
                        .enqueue_with(&mut tx, &format!("drain-{id}"), &options)
                        .instrument(span)
                        .await?;
                }
                tx.commit().await?;
            }
            Ok::<_, crate::BenchError>(())
        }));
    }
    for join in joins {
        join.await??;
    }
    Ok(())
}

/// Result of one drain.
#[derive(Debug, Clone, Copy)]
pub struct Drained {
    /// Seconds from worker start to an empty table.
    pub secs: f64,
    /// Events per second.
    pub rate: f64,
    /// Handler calls (more than N means redeliveries).
    pub handled: i64,
    /// The CPU this process and the rest of the machine spent on the drain, where measured.
    pub cpu: Option<CpuSplit>,
    /// Heap allocations of this process during the drain (with the `alloc-count` feature).
    pub allocs: Option<u64>,
}

impl Drained {
    /// Heap allocations per handler call, where counted.
    pub fn allocs_per_event(&self) -> Option<f64> {
        self.allocs.map(|a| a as f64 / self.handled.max(1) as f64)
    }
}

/// One outbox drain of `n` events with `setting`.
pub async fn run_outbox(
    db: &BenchDb,
    n: i64,
    shape: &PayloadShape,
    setting: DrainSetting,
) -> BenchResult<Drained> {
    run_outbox_in_spans(db, n, shape, setting, false).await
}

/// [`run_outbox`], enqueuing each event in a producer span when `producer_spans`.
pub async fn run_outbox_in_spans(
    db: &BenchDb,
    n: i64,
    shape: &PayloadShape,
    setting: DrainSetting,
    producer_spans: bool,
) -> BenchResult<Drained> {
    db.truncate_outboxes().await?;
    prefill_typed(db, n, shape, producer_spans).await?;
    let waiting = db.unfinished().await?;
    if waiting != n {
        return Err(format!("the pre-insert wrote {waiting} events, expected {n}").into());
    }
    db.settle().await?;
    let sink = Arc::new(CountingSink::counting());
    // The timer includes worker start-up (contract check, LISTEN), as in the peer harness.
    let cpu = CpuSample::now();
    let allocs = AllocSample::now();
    let started = Instant::now();
    let handles = setting.start(db, &sink).await?;
    let deadline = started + DRAIN_TIMEOUT;
    while sink.delivered() < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let drained = db
        .wait_drained(deadline.saturating_duration_since(Instant::now()))
        .await?;
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu.and_then(CpuSample::since);
    let allocs = allocs.and_then(AllocSample::since);
    stop(handles).await;
    if !drained {
        return Err(format!(
            "the drain did not finish within {DRAIN_TIMEOUT:?} ({})",
            setting.label()
        )
        .into());
    }
    Ok(Drained {
        secs,
        rate: n as f64 / secs,
        handled: sink.delivered(),
        cpu,
        allocs,
    })
}

/// One ceiling drain of `n` events: 2 tasks, batch 100, like the harness's ceiling.
pub async fn run_ceiling(db: &BenchDb, n: i64, completion: Completion) -> BenchResult<Drained> {
    db.truncate_outboxes().await?;
    ceiling::prefill(db.pool(), n).await?;
    db.settle().await?;
    let cpu = CpuSample::now();
    let allocs = AllocSample::now();
    let (secs, handled) = ceiling::drain(db.pool(), 2, 100, completion).await?;
    let cpu = cpu.and_then(CpuSample::since);
    let allocs = allocs.and_then(AllocSample::since);
    if handled != n {
        return Err(format!("the ceiling handled {handled} events, expected {n}").into());
    }
    Ok(Drained {
        secs,
        rate: n as f64 / secs,
        handled,
        cpu,
        allocs,
    })
}

/// The grid `--sweep` tries: one and two workers, a few concurrency and batch sizes, without
/// prefetch.
pub fn sweep_grid() -> Vec<DrainSetting> {
    let mut grid = Vec::new();
    for workers in [1, 2, 4] {
        for (concurrency, batch_size) in [(64, 32), (200, 100), (400, 200), (800, 400)] {
            grid.push(DrainSetting {
                workers,
                concurrency,
                batch_size,
                prefetch: 0,
                completion_batch: batch_size,
                delete_on_completion: false,
            });
        }
    }
    grid
}

/// The grid `--sweep-defaults` tries for the builder's defaults: one worker at the default
/// concurrency, with claim batch, prefetch bound and completion batch varied.
pub fn defaults_grid() -> Vec<DrainSetting> {
    let concurrency = DrainSetting::defaults().concurrency;
    let mut grid = Vec::new();
    for (batch_size, prefetch, completion_batch) in [
        (32, 0, 64),
        (64, 64, 128),
        (128, 128, 256),
        (256, 256, 256),
        (256, 512, 512),
        (512, 1024, 512),
        (512, 1024, 1024),
    ] {
        grid.push(DrainSetting {
            workers: 1,
            concurrency,
            batch_size,
            prefetch,
            completion_batch,
            delete_on_completion: false,
        });
    }
    grid
}

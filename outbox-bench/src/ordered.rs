//! Ordered drains: N events over K aggregates (K = 1 is a chain: every event waits for its
//! predecessor's completion), pre-inserted with the typed enqueue, then delivered by ONE
//! worker with the builder's defaults to a no-op sink, ordered and, for the ratio, unordered.
//!
//! An ordered aggregate moves one event per claim-deliver-complete round; what this measures
//! is how fast that round is (the completion wakes the claimer; no poll tick in between) and
//! what ordering costs when many aggregates move in parallel.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_runtime::Event;
use outbox_runtime::store::EnqueueOptions;
use outbox_runtime::worker::Worker;

use crate::BenchResult;
use crate::db::BenchDb;
use crate::drain::{Drained, stop};
use crate::event::OrderStep;
use crate::sink::CountingSink;

/// Events per pre-insert transaction.
const PREFILL_PER_TX: i64 = 500;
/// A drain that has not finished by then is reported as failed.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(600);

/// Insert `n` steps, event `i` (1-based) of order `i % aggregates`, in transactions of
/// `PREFILL_PER_TX`, from one client (so each order's steps are in id order).
async fn prefill(db: &BenchDb, n: i64, aggregates: i64) -> BenchResult<()> {
    let options = EnqueueOptions::without_notify();
    let mut next = 1;
    while next <= n {
        let mut tx = db.pool().begin().await?;
        for i in next..(next + PREFILL_PER_TX).min(n + 1) {
            OrderStep {
                order_id: i % aggregates,
                step: i,
            }
            .enqueue_with(&mut tx, &format!("step-{i}"), &options)
            .await?;
        }
        tx.commit().await?;
        next += PREFILL_PER_TX;
    }
    Ok(())
}

/// Deliver `n` pre-inserted events over `aggregates` aggregates with one worker with the
/// builder's defaults, `ordered` or not.
pub async fn run(db: &BenchDb, n: i64, aggregates: i64, ordered: bool) -> BenchResult<Drained> {
    let aggregates = aggregates.max(1);
    db.truncate_outboxes().await?;
    prefill(db, n, aggregates).await?;
    db.settle().await?;
    let sink = Arc::new(CountingSink::counting());
    let started = Instant::now();
    let handle = Worker::builder(db.pool().clone(), Arc::clone(&sink))
        .ordered(ordered)
        .start()
        .await?;
    let deadline = started + DRAIN_TIMEOUT;
    while sink.delivered() < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let drained = db
        .wait_drained(deadline.saturating_duration_since(Instant::now()))
        .await?;
    let secs = started.elapsed().as_secs_f64();
    stop(vec![handle]).await;
    if !drained {
        return Err(format!(
            "the {} drain of {n} events over {aggregates} aggregates did not finish within {DRAIN_TIMEOUT:?}",
            if ordered { "ordered" } else { "unordered" }
        )
        .into());
    }
    Ok(Drained {
        secs,
        rate: n as f64 / secs,
        handled: sink.delivered(),
        cpu: None,
        allocs: None,
    })
}

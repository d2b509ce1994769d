//! Latency: an idle worker, then one event (in its own transaction, with the wake-up) every
//! interval. Latency = the handler's start minus the moment the enqueuer's COMMIT returned,
//! both `Instant`s of this process, matched by order id.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_runtime::Event;
use outbox_runtime::store::EnqueueOptions;
use serde::Serialize;

use crate::BenchResult;
use crate::db::BenchDb;
use crate::drain::{DrainSetting, stop};
use crate::event::PayloadShape;
use crate::sink::CountingSink;

/// Percentiles of one latency run, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyStats {
    /// Events committed.
    pub sent: usize,
    /// Events whose handler started.
    pub handled: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

/// Run the latency workload for `secs` against one worker of `setting`, one event each
/// `interval`.
pub async fn run(
    db: &BenchDb,
    setting: DrainSetting,
    secs: u64,
    interval: Duration,
    shape: &PayloadShape,
) -> BenchResult<LatencyStats> {
    db.truncate_outboxes().await?;
    db.settle().await?;
    let sink = Arc::new(CountingSink::stamping());
    let handles = setting.start(db, &sink).await?;
    // Idle for a second: LISTEN is up and the first poll has come and gone.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let total = (Duration::from_secs(secs).as_micros() / interval.as_micros().max(1)) as i64;
    let pool = db.extra_pool(1).await?;
    let options = EnqueueOptions::default();
    let mut committed: HashMap<i64, Instant> = HashMap::new();
    let t0 = tokio::time::Instant::now();
    for id in 1..=total {
        tokio::time::sleep_until(t0 + interval * u32::try_from(id).unwrap_or(u32::MAX)).await;
        let mut tx = pool.begin().await?;
        shape
            .event(id)
            .enqueue_with(&mut tx, &format!("latency-{id}"), &options)
            .await?;
        tx.commit().await?;
        committed.insert(id, Instant::now());
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while sink.starts().len() < committed.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop(handles).await;
    pool.close().await;
    let starts = sink.starts();
    let mut millis: Vec<f64> = committed
        .iter()
        .filter_map(|(id, commit)| starts.get(id).map(|start| signed_millis(*commit, *start)))
        .collect();
    millis.sort_by(f64::total_cmp);
    Ok(LatencyStats {
        sent: committed.len(),
        handled: millis.len(),
        p50_ms: percentile(&millis, 50.0),
        p99_ms: percentile(&millis, 99.0),
        max_ms: millis.last().copied().unwrap_or(f64::NAN),
    })
}

/// `to - from` in milliseconds; negative when the handler started before COMMIT returned to
/// the enqueuer (possible: the worker can be woken before the client reads the acknowledgement).
fn signed_millis(from: Instant, to: Instant) -> f64 {
    if to >= from {
        to.duration_since(from).as_secs_f64() * 1e3
    } else {
        -(from.duration_since(to).as_secs_f64() * 1e3)
    }
}

/// Nearest-rank percentile of sorted values (the harness's definition).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_picks_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 51.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert!(percentile(&[], 50.0).is_nan());
    }
}

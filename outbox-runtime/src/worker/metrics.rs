//! The metric names of the worker, in one place, and the per-worker counters tests read.
//!
//! Metrics go through the `metrics` crate facade, so a service picks the exporter (Prometheus,
//! StatsD, ...). Every series carries a `table` label. Counters are incremented by the worker that
//! saw the event, and registered at zero when the worker starts, so a rate or an alert has a
//! series before the first event; gauges are refreshed by the maintenance leader only (one
//! writer per table).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::store::QueueGauges;

/// Events delivered and completed (the completion was accepted).
pub const DELIVERED_TOTAL: &str = "outbox_delivered_total";
/// Failed attempts scheduled for another try.
pub const RETRIED_TOTAL: &str = "outbox_retried_total";
/// Events that used up their attempts, failed permanently, or could not be decoded.
pub const EXHAUSTED_TOTAL: &str = "outbox_exhausted_total";
/// Claimed rows whose payload or headers could not be decoded (too deep, or not readable JSON;
/// see `payload_limits`), exhausted without delivery. Each is also counted in
/// [`EXHAUSTED_TOTAL`]; this one tells them from delivery failures.
pub const UNDECODABLE_TOTAL: &str = "outbox_undecodable_total";
/// Completions or failures rejected because the claim was no longer ours.
pub const STALE_COMPLETIONS_TOTAL: &str = "outbox_stale_completions_total";
/// Leases extended by the renewer.
pub const LEASE_RENEWALS_TOTAL: &str = "outbox_lease_renewals_total";
/// Leases the renewer found lost, or saw end by the local clock without a successful renewal
/// (the handler was told through `Delivery::lease_lost`).
pub const LEASE_LOST_TOTAL: &str = "outbox_lease_lost_total";
/// Events handed back at shutdown without charging an attempt: claimed but unstarted, or
/// interrupted by the shutdown deadline.
pub const RELEASED_TOTAL: &str = "outbox_released_total";
/// Every counter above, each registered at zero (with its `table` label) when a worker starts.
pub const COUNTERS: &[&str] = &[
    DELIVERED_TOTAL,
    RETRIED_TOTAL,
    EXHAUSTED_TOTAL,
    UNDECODABLE_TOTAL,
    STALE_COMPLETIONS_TOTAL,
    LEASE_RENEWALS_TOTAL,
    LEASE_LOST_TOTAL,
    RELEASED_TOTAL,
];
/// Rows waiting to be claimed.
pub const PENDING: &str = "outbox_pending";
/// Rows claimed by some worker.
pub const PROCESSING: &str = "outbox_processing";
/// Rows that used up their attempts.
pub const EXHAUSTED: &str = "outbox_exhausted";
/// Age of the oldest pending row, by the database clock.
pub const OLDEST_PENDING_AGE_SECONDS: &str = "outbox_oldest_pending_age_seconds";

/// What one worker counted since it started. Read with
/// [`crate::worker::WorkerHandle::counters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerCounters {
    /// Completions accepted.
    pub delivered: u64,
    /// Failures rescheduled.
    pub retried: u64,
    /// Events exhausted by this worker (undecodable rows included).
    pub exhausted: u64,
    /// Claimed rows this worker exhausted because they could not be decoded.
    pub undecodable: u64,
    /// Completions or failures rejected as stale.
    pub stale_completions: u64,
    /// Lease renewals accepted.
    pub lease_renewals: u64,
    /// Leases found lost.
    pub lease_lost: u64,
    /// Claims handed back at shutdown (unstarted or interrupted).
    pub released: u64,
    /// Handlers that panicked.
    pub panics: u64,
}

/// The live counters behind [`WorkerCounters`], updated together with the metrics facade.
#[derive(Debug)]
pub(crate) struct Counters {
    table: String,
    delivered: AtomicU64,
    retried: AtomicU64,
    exhausted: AtomicU64,
    undecodable: AtomicU64,
    stale: AtomicU64,
    renewals: AtomicU64,
    lost: AtomicU64,
    released: AtomicU64,
    panics: AtomicU64,
}

impl Counters {
    /// The counters of a worker on `table`; registers every counter series at zero.
    pub(crate) fn new(table: &str) -> Self {
        for &name in COUNTERS {
            metrics::counter!(name, "table" => table.to_owned()).increment(0);
        }
        Counters {
            table: table.to_owned(),
            delivered: AtomicU64::new(0),
            retried: AtomicU64::new(0),
            exhausted: AtomicU64::new(0),
            undecodable: AtomicU64::new(0),
            stale: AtomicU64::new(0),
            renewals: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            released: AtomicU64::new(0),
            panics: AtomicU64::new(0),
        }
    }

    fn bump(&self, cell: &AtomicU64, name: &'static str, n: u64) {
        if n == 0 {
            return;
        }
        cell.fetch_add(n, Ordering::Relaxed);
        metrics::counter!(name, "table" => self.table.clone()).increment(n);
    }

    pub(crate) fn delivered(&self, n: u64) {
        self.bump(&self.delivered, DELIVERED_TOTAL, n);
    }
    pub(crate) fn retried(&self) {
        self.bump(&self.retried, RETRIED_TOTAL, 1);
    }
    pub(crate) fn exhausted(&self) {
        self.bump(&self.exhausted, EXHAUSTED_TOTAL, 1);
    }
    /// An undecodable row was exhausted: counted as exhausted and as undecodable.
    pub(crate) fn undecodable(&self) {
        self.bump(&self.exhausted, EXHAUSTED_TOTAL, 1);
        self.bump(&self.undecodable, UNDECODABLE_TOTAL, 1);
    }
    pub(crate) fn stale(&self, n: u64) {
        self.bump(&self.stale, STALE_COMPLETIONS_TOTAL, n);
    }
    pub(crate) fn renewals(&self, n: u64) {
        self.bump(&self.renewals, LEASE_RENEWALS_TOTAL, n);
    }
    pub(crate) fn lease_lost(&self, n: u64) {
        self.bump(&self.lost, LEASE_LOST_TOTAL, n);
    }
    pub(crate) fn released(&self) {
        self.bump(&self.released, RELEASED_TOTAL, 1);
    }
    pub(crate) fn panicked(&self) {
        self.panics.fetch_add(1, Ordering::Relaxed);
    }

    /// Publish the queue gauges (called by the maintenance leader).
    pub(crate) fn gauges(&self, stats: &QueueGauges) {
        let table = self.table.clone();
        metrics::gauge!(PENDING, "table" => table.clone()).set(stats.pending as f64);
        metrics::gauge!(PROCESSING, "table" => table.clone()).set(stats.processing as f64);
        metrics::gauge!(EXHAUSTED, "table" => table.clone()).set(stats.exhausted as f64);
        let age = stats.oldest_pending_age.map_or(0.0, |a| a.as_secs_f64());
        metrics::gauge!(OLDEST_PENDING_AGE_SECONDS, "table" => table).set(age);
    }

    pub(crate) fn snapshot(&self) -> WorkerCounters {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WorkerCounters {
            delivered: r(&self.delivered),
            retried: r(&self.retried),
            exhausted: r(&self.exhausted),
            undecodable: r(&self.undecodable),
            stale_completions: r(&self.stale),
            lease_renewals: r(&self.renewals),
            lease_lost: r(&self.lost),
            released: r(&self.released),
            panics: r(&self.panics),
        }
    }
}

//! The metric names of the worker, in one place, and the per-worker counters tests read.
//!
//! Metrics go through the `metrics` crate facade, so a service picks the exporter (Prometheus,
//! StatsD, ...). Every series carries a `table` label; histograms about events also carry
//! `event_type`, and no series carries an event id or anything else unbounded. Counters are
//! incremented by the worker that saw the event; counters and gauges are registered at zero when
//! the worker starts, so a rate or an alert has a series before the first event. Gauges are
//! refreshed by the maintenance leader only (one writer per table): across instances, read them
//! with `max by (table)`.
//!
//! The per-event histograms are registered once per event type and the handles kept for a
//! second (`HANDLE_REFRESH`): a recorder installed after a worker started gets them from
//! the next registration on, within a second.
//!
//! Histograms record seconds (and attempts). With `metrics-exporter-prometheus`, give them
//! buckets ([`SECONDS_BUCKETS`], [`ATTEMPTS_BUCKETS`]) so they render as Prometheus histograms
//! rather than summaries; see `docs/observability.md`.

use std::collections::{HashMap, HashSet};
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use metrics::{Histogram, Key, Label, Level, Metadata};

use crate::store::{QueueGauges, UnhandledEvents};

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
/// Ready pending events that no live worker of the table claims (its type or version has no
/// handler in any running worker: a missing deploy, not a failure). Labels `table`,
/// `event_type`, `event_version`; published by the maintenance leader, set back to 0 once a
/// worker claims them. See `docs/rolling-deploys.md`.
pub const UNHANDLED_EVENTS: &str = "outbox_unhandled_events";
/// How long the oldest of those events has waited for a worker, by the database clock. Labels
/// as [`UNHANDLED_EVENTS`].
pub const UNHANDLED_AGE_SECONDS: &str = "outbox_unhandled_age_seconds";
/// Every gauge above, each registered at zero (with its `table` label) when a worker starts.
pub const GAUGES: &[&str] = &[PENDING, PROCESSING, EXHAUSTED, OLDEST_PENDING_AGE_SECONDS];

/// Histogram: how long an event had been claimable when a worker claimed it (from its enqueue,
/// or from the end of its delay or retry backoff), by the database clock. Labels `table`,
/// `event_type`. The queue lag an alert watches.
pub const CLAIM_WAIT_SECONDS: &str = "outbox_claim_wait_seconds";
/// Histogram: how long one claim statement took, as the worker saw it (round trip included),
/// whether it found events or not. Label `table`.
pub const CLAIM_DURATION_SECONDS: &str = "outbox_claim_duration_seconds";
/// Histogram: how long the sink (handler or publisher) took per delivery attempt, whatever its
/// outcome. Labels `table`, `event_type`. In batch mode every item of a batch records the
/// batch call's duration.
pub const HANDLER_DURATION_SECONDS: &str = "outbox_handler_duration_seconds";
/// Histogram: from the enqueue (the row's `created_at`, the enqueuing transaction's `now()`) to
/// the accepted completion, for delivered events: the time from the business change to a
/// receiver having the event. Labels `table`, `event_type`.
pub const DELIVERY_LATENCY_SECONDS: &str = "outbox_delivery_latency_seconds";
/// Histogram: attempts a delivered event took (1 when the first delivery succeeded). Labels
/// `table`, `event_type`.
pub const DELIVERY_ATTEMPTS: &str = "outbox_delivery_attempts";
/// Every histogram above.
pub const HISTOGRAMS: &[&str] = &[
    CLAIM_WAIT_SECONDS,
    CLAIM_DURATION_SECONDS,
    HANDLER_DURATION_SECONDS,
    DELIVERY_LATENCY_SECONDS,
    DELIVERY_ATTEMPTS,
];
/// Buckets for the `_seconds` histograms: 1 ms to 1 hour.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0,
];
/// Buckets for [`DELIVERY_ATTEMPTS`].
pub const ATTEMPTS_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 7.0, 10.0, 15.0, 20.0, 30.0, 50.0];

/// Describe every metric of the worker to the installed recorder (help text and unit), once per
/// process. Called by every worker at start; an exporter installed later misses the
/// descriptions but not the series.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(DELIVERED_TOTAL, "Events delivered and completed.");
    describe_counter!(RETRIED_TOTAL, "Failed attempts scheduled for another try.");
    describe_counter!(
        EXHAUSTED_TOTAL,
        "Events that used up their attempts, failed permanently, or could not be decoded."
    );
    describe_counter!(
        UNDECODABLE_TOTAL,
        "Claimed rows exhausted because their payload or headers cannot be decoded."
    );
    describe_counter!(
        STALE_COMPLETIONS_TOTAL,
        "Completions or failures rejected because the claim was lost."
    );
    describe_counter!(LEASE_RENEWALS_TOTAL, "Leases extended by the renewer.");
    describe_counter!(LEASE_LOST_TOTAL, "Leases lost while their delivery ran.");
    describe_counter!(
        RELEASED_TOTAL,
        "Claims handed back at shutdown without charging an attempt."
    );
    describe_gauge!(
        PENDING,
        "Rows waiting to be claimed (maintenance leader only)."
    );
    describe_gauge!(
        UNHANDLED_EVENTS,
        "Ready pending events of a type and version no live worker claims (maintenance leader only)."
    );
    describe_gauge!(
        UNHANDLED_AGE_SECONDS,
        Unit::Seconds,
        "How long the oldest event of a type and version no live worker claims has waited (maintenance leader only)."
    );
    describe_gauge!(
        PROCESSING,
        "Rows claimed by some worker (maintenance leader only)."
    );
    describe_gauge!(
        EXHAUSTED,
        "Rows that used up their attempts (maintenance leader only)."
    );
    describe_gauge!(
        OLDEST_PENDING_AGE_SECONDS,
        Unit::Seconds,
        "Age of the oldest ready pending row, by the database clock (maintenance leader only)."
    );
    describe_histogram!(
        CLAIM_WAIT_SECONDS,
        Unit::Seconds,
        "How long an event had been claimable when it was claimed."
    );
    describe_histogram!(
        CLAIM_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of one claim statement."
    );
    describe_histogram!(
        HANDLER_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of one sink call (handler or publisher)."
    );
    describe_histogram!(
        DELIVERY_LATENCY_SECONDS,
        Unit::Seconds,
        "From enqueue to accepted completion, for delivered events."
    );
    describe_histogram!(
        DELIVERY_ATTEMPTS,
        Unit::Count,
        "Attempts a delivered event took."
    );
}

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

/// What the `histogram!` macro would pass the recorder for the worker's histograms.
static HISTOGRAM_METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// Event types whose histogram handles a worker keeps; past it, handles are registered per
/// record as the `histogram!` macro registers them. Event types are a catalogue's names, far
/// fewer than this; the bound only keeps a table full of distinct stray names from growing the
/// map without end.
const KEPT_EVENT_TYPES: usize = 1024;

/// How long a kept handle is used before it is registered again with the recorder installed
/// then: a recorder installed after the worker started gets every series within this, and an
/// exporter that drops idle series gets them back.
const HANDLE_REFRESH: Duration = Duration::from_secs(1);

/// The histograms of one event type, registered once and kept for [`HANDLE_REFRESH`]. The
/// `histogram!` macro builds and hashes a key for every record, and a recorder may copy it
/// again to look the series up (the Prometheus exporter does): four times per delivery, about
/// four allocations each.
#[derive(Debug)]
struct EventTypeHistograms {
    claim_wait: Histogram,
    handler: Histogram,
    latency: Histogram,
    attempts: Histogram,
    registered_at: Instant,
}

impl EventTypeHistograms {
    /// Register the four series of `event_type` with the recorder installed now.
    fn register(table: &str, event_type: &str) -> Self {
        let histogram = |name: &'static str| {
            let key = Key::from_parts(
                name,
                vec![
                    Label::new("table", table.to_owned()),
                    Label::new("event_type", event_type.to_owned()),
                ],
            );
            metrics::with_recorder(|recorder| {
                recorder.register_histogram(&key, &HISTOGRAM_METADATA)
            })
        };
        EventTypeHistograms {
            claim_wait: histogram(CLAIM_WAIT_SECONDS),
            handler: histogram(HANDLER_DURATION_SECONDS),
            latency: histogram(DELIVERY_LATENCY_SECONDS),
            attempts: histogram(DELIVERY_ATTEMPTS),
            registered_at: Instant::now(),
        }
    }

    fn fresh(&self) -> bool {
        self.registered_at.elapsed() < HANDLE_REFRESH
    }
}

/// Record `value` in the histogram `key` of the recorder installed now.
fn record(key: &Key, value: f64) {
    metrics::with_recorder(|recorder| recorder.register_histogram(key, &HISTOGRAM_METADATA))
        .record(value);
}

/// The live counters behind [`WorkerCounters`], updated together with the metrics facade.
#[derive(Debug)]
pub(crate) struct Counters {
    table: String,
    /// `CLAIM_DURATION_SECONDS` of this table.
    claim_duration: Key,
    /// The histograms of each event type seen, registered on first use.
    event_types: RwLock<HashMap<String, EventTypeHistograms>>,
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
    /// The counters of a worker on `table`; registers every counter and gauge series at zero.
    pub(crate) fn new(table: &str) -> Self {
        describe();
        for &name in COUNTERS {
            metrics::counter!(name, "table" => table.to_owned()).increment(0);
        }
        // Adding zero registers the series without overwriting what another worker of the
        // same table in this process, or the maintenance leader, already set.
        for &name in GAUGES {
            metrics::gauge!(name, "table" => table.to_owned()).increment(0.0);
        }
        Counters {
            table: table.to_owned(),
            claim_duration: Key::from_parts(
                CLAIM_DURATION_SECONDS,
                vec![Label::new("table", table.to_owned())],
            ),
            event_types: RwLock::new(HashMap::new()),
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

    /// Publish the events no live worker claims, per type and version, and set the series of
    /// the `before` ones that are gone back to zero; returns the labels now published (called by
    /// the maintenance leader).
    pub(crate) fn unhandled(
        &self,
        now: &[UnhandledEvents],
        before: &HashSet<(String, i32)>,
    ) -> HashSet<(String, i32)> {
        let set = |event_type: &str, version: i32, waiting: f64, age: f64| {
            let labels = [
                ("table", self.table.clone()),
                ("event_type", event_type.to_owned()),
                ("event_version", version.to_string()),
            ];
            metrics::gauge!(UNHANDLED_EVENTS, &labels).set(waiting);
            metrics::gauge!(UNHANDLED_AGE_SECONDS, &labels).set(age);
        };
        let mut published = HashSet::new();
        for u in now {
            set(
                &u.event_type,
                u.event_version,
                u.waiting as f64,
                u.age.as_secs_f64(),
            );
            published.insert((u.event_type.clone(), u.event_version));
        }
        for (event_type, version) in before.difference(&published) {
            set(event_type, *version, 0.0, 0.0);
        }
        published
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

    /// One claim statement took `took`.
    pub(crate) fn claim_took(&self, took: Duration) {
        record(&self.claim_duration, took.as_secs_f64());
    }

    /// Run `f` with the histograms of `event_type`, registered on first use and again once
    /// [`HANDLE_REFRESH`] passed.
    fn with_histograms(&self, event_type: &str, f: impl FnOnce(&EventTypeHistograms)) {
        {
            let kept = self.event_types.read().unwrap_or_else(|p| p.into_inner());
            if let Some(histograms) = kept.get(event_type).filter(|h| h.fresh()) {
                return f(histograms);
            }
        }
        let histograms = EventTypeHistograms::register(&self.table, event_type);
        f(&histograms);
        let mut kept = self.event_types.write().unwrap_or_else(|p| p.into_inner());
        if kept.len() < KEPT_EVENT_TYPES || kept.contains_key(event_type) {
            kept.insert(event_type.to_owned(), histograms);
        }
    }

    /// An event of `event_type` was claimed after being claimable for `waited`.
    pub(crate) fn claim_waited(&self, event_type: &str, waited: Duration) {
        self.with_histograms(event_type, |h| h.claim_wait.record(waited.as_secs_f64()));
    }

    /// The sink took `took` over one attempt at an event of `event_type`.
    pub(crate) fn handler_took(&self, event_type: &str, took: Duration) {
        self.with_histograms(event_type, |h| h.handler.record(took.as_secs_f64()));
    }

    /// An event of `event_type` was delivered `latency` after its enqueue, on attempt `attempts`.
    pub(crate) fn delivered_after(&self, event_type: &str, latency: Duration, attempts: i32) {
        self.with_histograms(event_type, |h| {
            h.latency.record(latency.as_secs_f64());
            h.attempts.record(f64::from(attempts));
        });
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

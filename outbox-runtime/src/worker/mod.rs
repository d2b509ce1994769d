//! The worker: claims committed events, delivers them to a [`Sink`] at least once, and writes
//! back the outcome, fenced by the claim.
//!
//! ```text
//!             NOTIFY / poll tick / room freed
//!                        |
//!   listener ------> claimer --claim_batch(room)--> executor tasks: wait for a slot in claim
//!                (room: running + waiting <= concurrency + prefetch window; see pace.rs)
//!                                                     run the sink (<= concurrency at once)
//!                                                           |  ok        | error / panic
//!   renewer: renew_many_if_owned(in-flight) every lease/3   v            v
//!            lost -> Delivery::lease_lost cancelled      completer    fail_if_owned
//!            (also: no successful renewal by the     (complete_many_if_owned in batches)
//!             lease's end on the local clock)
//!   maintenance (one leader per table, advisory lock): recover_expired, purge_delivered, gauges,
//!                VACUUM once dead rows pile up
//! ```
//!
//! One file per part: [`config`] (knobs and defaults), `claimer.rs`, `pace.rs` (how far to
//! claim ahead of the sink), `executor.rs` (one delivery:
//! span, panic catching, outcome), `renewer.rs`, `completer.rs`, `maintenance.rs`,
//! `listener.rs`, `roster.rs` (advertises the worker and what it claims in `outbox_workers`),
//! `shutdown.rs` (the handle and the drain), `supervise.rs` (a part that panics
//! stops the worker), [`sessions`] (a named pool per role; the claimer and the completer keep
//! their session between statements, see `held_session.rs`), [`metrics`] and [`events`] (the
//! test hook).
//!
//! # Guarantees
//!
//! - **At least once.** An event is completed only after the sink returned `Ok`. A worker that
//!   dies, hangs or loses its lease leaves the event to be delivered again by another worker after
//!   the lease. Receivers must deduplicate by [`crate::Delivery::idempotency_key`]; nothing here
//!   makes external effects happen exactly once.
//! - **Fenced.** Every completion, renewal, failure and release presents the claim's
//!   `claim_version`. A worker whose lease ran out has its completion rejected; it is counted in
//!   `outbox_stale_completions_total` and logged.
//! - **No transaction spans a delivery.** The claim commits before the sink is called; the sink
//!   runs with no connection held by the worker.
//!
//! # What a worker claims
//!
//! A worker claims only what its sink can deliver ([`Sink::handled_events`]): a
//! [`crate::Dispatcher`] names every event name and stored version it has a route for, so a
//! worker of one service leaves another service's events in a shared table alone, and a worker
//! of an older release leaves the newer versions a newer producer writes. Such an event stays
//! pending, is never charged an attempt and is never exhausted for want of a handler; it is
//! delivered once a worker that handles it runs, and `outbox status`, the dashboard and the
//! `outbox_unhandled_events` gauge show it meanwhile. Publishers take every event (no filter).
//! See `docs/rolling-deploys.md`.
//!
//! # Ordering
//!
//! With [`WorkerBuilder::ordered`], an event is claimable only when no earlier event of its
//! aggregate (same aggregate type and id, lower row id) is `pending` or `processing`, so one
//! aggregate's events are delivered one at a time, in the order their transactions committed
//! (within a transaction, the order they were enqueued), across all workers and processes. Row
//! id order is commit order because the typed enqueue takes a per-aggregate transaction-scoped
//! lock before the row's id is drawn (`store/sql/lock_aggregate.sql`; rows inserted by raw SQL
//! without it are ordered by id only). A completion or exhaustion wakes the claimer, so the next
//! event of the aggregate is claimed as soon as it commits. Different aggregates proceed in
//! parallel; events without an aggregate are not ordered. See `docs/ordering.md`.
//!
//! **An exhausted event does not block its aggregate.** Once an event used up its attempts (or
//! failed permanently), later events of the same aggregate are delivered. The alternative, a
//! stuck aggregate until an operator acts, turns one poison payload into an outage of that
//! aggregate; we chose progress, and the exhausted event stays visible (`outbox_exhausted` gauge,
//! `outbox status`) for an operator to retry. Handlers that cannot tolerate a gap should check
//! the aggregate version they receive.
//!
//! # Shutdown
//!
//! [`WorkerHandle::shutdown`] stops claiming, lets running deliveries finish within
//! [`WorkerBuilder::shutdown_deadline`], hands claimed-but-unstarted events back without
//! charging an attempt, writes pending completions, then cancels the remaining deliveries'
//! `lease_lost` tokens and, after a short grace, abandons them. A delivery that stopped on that
//! cancellation with a retryable error, or was abandoned, is handed back like an unstarted
//! claim: pending at once, its attempt not charged, no handler failure recorded (the worker
//! left; the event did not fail, and must not be exhausted for it on its last attempt).
//! Shutdown always ends: if the database stops answering while the last completions are
//! written, the worker waits one more shutdown deadline for them and then stops without them;
//! those events are delivered again once their leases end.
//!
//! **A part that panics stops the worker.** If the claimer, completer, renewer, maintenance,
//! roster or listener panics (a bug, or code they call: a sink's `max_batch`, a metrics
//! recorder, a tracing subscriber), the same shutdown begins, [`WorkerHandle::failure`] says
//! which part and why, and [`Worker::run_until`] returns
//! [`crate::error::Error::WorkerFailed`]. A worker missing a part would look alive while it
//! delivered nothing, or delivered without ever completing.
//!
//! # Example
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool, dispatcher: impl outbox_runtime::Sink) -> outbox_runtime::error::Result<()> {
//! use std::time::Duration;
//! use outbox_runtime::worker::Worker;
//!
//! let worker = Worker::builder(pool, dispatcher)
//!     .concurrency(32)
//!     .lease(Duration::from_secs(60))
//!     .start()
//!     .await?;
//! tokio::signal::ctrl_c().await.ok();
//! worker.shutdown().await;
//! # Ok(()) }
//! ```

mod claimer;
mod completer;
pub mod config;
pub mod events;
pub(crate) mod executor;
mod inflight;
mod listener;
mod maintenance;
pub mod metrics;
mod pace;
mod renewer;
mod roster;
pub mod sessions;
mod shutdown;
mod supervise;
mod vacuum;

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

pub use config::{RetryPolicy, WorkerConfig};
pub use events::WorkerEvent;
pub use listener::application_name as listener_application_name;
pub use metrics::WorkerCounters;
pub use sessions::{SessionRole, application_name};
pub use shutdown::WorkerHandle;
pub use supervise::WorkerFailure;

use crate::error::{Error, Result};
use crate::sink::{HandledEvents, Sink};
use crate::store::{DEFAULT_TABLE, Store};
use events::Hook;
use inflight::InFlight;
use metrics::Counters;
use pace::Pace;
use sessions::Sessions;

/// A configured worker, ready to [`Worker::start`].
pub struct Worker {
    pool: PgPool,
    sink: Arc<dyn Sink>,
    config: WorkerConfig,
    hook: Hook,
    start_gate: Option<Arc<Semaphore>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// Start configuring a worker that delivers the events of `pool`'s outbox table to `sink`
    /// (a [`crate::Dispatcher`], a publisher, or any [`Sink`]; an `Arc<dyn Sink>` works too).
    pub fn builder(pool: PgPool, sink: impl Sink) -> WorkerBuilder {
        WorkerBuilder {
            pool,
            sink: Arc::new(sink),
            config: WorkerConfig::new(DEFAULT_TABLE),
            hook: Hook::default(),
            start_gate: None,
        }
    }

    /// The configuration this worker runs with.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Check the database's contracts, then start every part of the worker on the current
    /// Tokio runtime. Refuses to start when the database disagrees with the compiled event
    /// contracts ([`crate::generate::verify_database_contracts`]).
    pub async fn start(self) -> Result<WorkerHandle> {
        // Before anything is claimed: a sink call that can outlast the lease would let a second
        // worker deliver the same event while the first call still runs.
        self.sink.check_lease(self.config.lease)?;
        // What the sink can deliver, asked once: the claim takes only these events and leaves
        // the others pending for a worker that handles them (see the module docs).
        let handled = self.sink.handled_events();
        if handled.as_ref().is_some_and(HandledEvents::is_empty) {
            return Err(Error::Config(format!(
                "worker `{}` has a sink that handles no event (a dispatcher without handlers?), so it would claim nothing: \
                 register at least one handler, or pass a sink that takes every event",
                self.config.name
            )));
        }
        let table = self.config.table.as_str();
        let store = |pool: &PgPool| {
            if table == DEFAULT_TABLE {
                Ok(Store::new(pool.clone()))
            } else {
                Store::for_table(pool.clone(), table)
            }
        };
        // The pools are lazy: nothing is connected yet, so a refused table name leaks nothing.
        let sessions = Sessions::open(&self.pool, &self.config.name);
        let (claim_store, outcome_store, renew_store, maintenance_store) = (
            store(&sessions.claimer)?,
            store(&sessions.completer)?,
            store(&sessions.renewer)?,
            store(&sessions.maintenance)?,
        );
        // The contract check and the first sessions of the claimer and the completer, at once:
        // the first claim and the first completion then run on ready sessions, and the start
        // waits for one connection, not for three in turn (see `Sessions::warm`). A refused
        // start closes what it opened.
        let (checked, warmed) = tokio::join!(
            crate::generate::verify_database_contracts(&self.pool),
            sessions.warm(),
        );
        if let Err(e) = checked.and(warmed) {
            sessions.close().await;
            return Err(e);
        }
        let shared = Arc::new(Shared {
            counters: Counters::new(&self.config.table),
            claim_store,
            outcome_store,
            renew_store,
            maintenance_store,
            sessions,
            sink: self.sink,
            handled,
            config: self.config,
            inflight: InFlight::default(),
            pace: Pace::default(),
            hook: self.hook,
            wake: Notify::new(),
            claim_stop: CancellationToken::new(),
            work_cancel: CancellationToken::new(),
            abort: CancellationToken::new(),
            start_gate: self.start_gate,
            failure: OnceLock::new(),
        });
        tracing::info!(
            worker = %shared.config.name,
            table = %shared.config.table,
            concurrency = shared.config.concurrency,
            lease_ms = shared.config.lease.as_millis() as u64,
            ordered = shared.config.ordered,
            listen = shared.config.listen,
            "outbox worker starting"
        );
        Ok(shutdown::spawn(shared))
    }

    /// Start, run until `signal` completes (for example `tokio::signal::ctrl_c()`), then shut
    /// down gracefully. Returns what the worker counted, or [`Error::WorkerFailed`] as soon as
    /// the worker stopped because one of its parts panicked (see the module docs), without
    /// waiting for `signal`: a service should then exit and be restarted.
    pub async fn run_until(self, signal: impl Future<Output = ()>) -> Result<WorkerCounters> {
        let handle = self.start().await?;
        tokio::select! {
            () = signal => {}
            () = handle.stopped() => {}
        }
        handle.shutdown().await;
        match handle.failure() {
            Some(failure) => Err(Error::WorkerFailed {
                worker: handle.name().to_owned(),
                part: failure.part,
                message: failure.message,
            }),
            None => Ok(handle.counters()),
        }
    }
}

/// Builds a [`Worker`]. Every setter has a documented default (see [`WorkerConfig`]).
pub struct WorkerBuilder {
    pool: PgPool,
    sink: Arc<dyn Sink>,
    config: WorkerConfig,
    hook: Hook,
    start_gate: Option<Arc<Semaphore>>,
}

impl std::fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl WorkerBuilder {
    /// Outbox table (default `outbox`).
    pub fn table(mut self, table: &str) -> Self {
        self.config.table = table.to_owned();
        self
    }

    /// Worker name, recorded in `claimed_by` (default `<host>-<pid>-<random>`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.config.name = name.into();
        self
    }

    /// Deliveries running at once (default 64).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.config.concurrency = n;
        self
    }

    /// Most events claimed per statement (default 256; never more than the room the running
    /// deliveries and the prefetch window leave).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.config.batch_size = n;
        self
    }

    /// Most claimed events waiting for a delivery slot (default 512; 0 claims only into free
    /// slots). The worker claims ahead only as far as its measured claim and handler times ask
    /// for (see [`WorkerConfig::prefetch`]).
    pub fn prefetch(mut self, n: usize) -> Self {
        self.config.prefetch = n;
        self
    }

    /// Lease of each claim (default 30 s).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// Renew leases of running deliveries (default true).
    pub fn renewal(mut self, on: bool) -> Self {
        self.config.renewal = on;
        self
    }

    /// How often leases are renewed (default a third of the lease).
    pub fn renew_interval(mut self, every: Duration) -> Self {
        self.config.renew_interval = Some(every);
        self
    }

    /// Backoff between attempts (default 1 s doubling up to 5 min, jittered).
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.config.retry = policy;
        self
    }

    /// Fallback poll interval (default 2 s).
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.config.poll_interval = every;
        self
    }

    /// Wake up on LISTEN/NOTIFY (default true); `false` for poll-only mode behind a
    /// transaction-mode pooler.
    pub fn listen(mut self, on: bool) -> Self {
        self.config.listen = on;
        self
    }

    /// Per-aggregate ordering (default false). See the module docs for what an exhausted event
    /// does to its aggregate.
    pub fn ordered(mut self, on: bool) -> Self {
        self.config.ordered = on;
        self
    }

    /// Purge delivered events enqueued longer ago than this (default 7 days); `None` keeps
    /// them, and `Some(Duration::ZERO)` deletes each event as its delivery completes (see
    /// [`WorkerConfig::retention`] for what that means for operation keys).
    pub fn retention(mut self, keep: Option<Duration>) -> Self {
        self.config.retention = keep;
        self
    }

    /// Run maintenance (recovery, purge, gauges) when this worker is the leader (default true).
    pub fn maintenance(mut self, on: bool) -> Self {
        self.config.maintenance = on;
        self
    }

    /// How often maintenance runs (default 5 s).
    pub fn maintenance_interval(mut self, every: Duration) -> Self {
        self.config.maintenance_interval = every;
        self
    }

    /// Rows per maintenance statement (default 1000).
    pub fn maintenance_batch(mut self, rows: i64) -> Self {
        self.config.maintenance_batch = rows;
        self
    }

    /// Let the maintenance leader `VACUUM` the outbox table once dead row versions pile up,
    /// whether or not autovacuum is on (default true). See [`WorkerConfig::vacuum_dead_rows`].
    pub fn vacuum_dead_rows(mut self, on: bool) -> Self {
        self.config.vacuum_dead_rows = on;
        self
    }

    /// The former name of [`WorkerBuilder::vacuum_dead_rows`], from when the leader vacuumed
    /// only where autovacuum was off.
    #[deprecated(
        note = "renamed `vacuum_dead_rows`: the leader now vacuums past the dead-row threshold whether or not autovacuum is on"
    )]
    pub fn vacuum_without_autovacuum(self, on: bool) -> Self {
        self.vacuum_dead_rows(on)
    }

    /// Completions per statement (default 512) and how long to wait to fill one (default 5 ms).
    pub fn completion_batch(mut self, max: usize, flush_after: Duration) -> Self {
        self.config.completion_batch = max;
        self.config.completion_flush = flush_after;
        self
    }

    /// How long shutdown waits for running deliveries (default 30 s), and again, after them, for
    /// the last completions to be written.
    pub fn shutdown_deadline(mut self, deadline: Duration) -> Self {
        self.config.shutdown_deadline = deadline;
        self
    }

    /// Report what the worker does to `tx` (a test hook; see [`WorkerEvent`]).
    pub fn events(mut self, tx: UnboundedSender<WorkerEvent>) -> Self {
        self.hook = Hook::new(Some(tx));
        self
    }

    /// Test hook: every delivery waits for one permit of `gate` before calling the sink, and a
    /// shutdown during that wait hands the claim back unstarted. Lets tests hold claimed events
    /// "claimed but not started" deterministically.
    #[doc(hidden)]
    pub fn start_gate(mut self, gate: Arc<Semaphore>) -> Self {
        self.start_gate = Some(gate);
        self
    }

    /// Replace the whole configuration.
    pub fn config(mut self, config: WorkerConfig) -> Self {
        self.config = config;
        self
    }

    /// Validate the configuration.
    pub fn build(self) -> Result<Worker> {
        self.config.validate()?;
        Ok(Worker {
            pool: self.pool,
            sink: self.sink,
            config: self.config,
            hook: self.hook,
            start_gate: self.start_gate,
        })
    }

    /// [`WorkerBuilder::build`], then [`Worker::start`].
    pub async fn start(self) -> Result<WorkerHandle> {
        self.build()?.start().await
    }
}

/// What every part of one worker shares.
pub(crate) struct Shared {
    /// The claimer's statements, on its own session.
    pub(crate) claim_store: Store,
    /// Completions, failures and releases, on the completer's sessions.
    pub(crate) outcome_store: Store,
    /// Lease renewals, on the renewer's session.
    pub(crate) renew_store: Store,
    /// Recovery, purge and gauges, on the maintenance session.
    pub(crate) maintenance_store: Store,
    /// The pools behind the stores above, one per role (see [`sessions`]).
    pub(crate) sessions: Sessions,
    pub(crate) sink: Arc<dyn Sink>,
    /// What the sink can deliver ([`Sink::handled_events`]); `None`: every event.
    pub(crate) handled: Option<HandledEvents>,
    pub(crate) config: WorkerConfig,
    pub(crate) inflight: InFlight,
    /// Claim and handler times, which size the prefetch window (see [`pace`]).
    pub(crate) pace: Pace,
    pub(crate) counters: Counters,
    pub(crate) hook: Hook,
    /// The claimer's wake-up (a stored permit, so none is lost while claiming): sent by the
    /// listener on a notification and, in ordered mode, after a completion or exhaustion that
    /// unblocks an aggregate's next event.
    pub(crate) wake: Notify,
    /// Phase one of shutdown: stop claiming; unstarted claims are handed back.
    pub(crate) claim_stop: CancellationToken,
    /// Phase two: the deadline passed; every delivery's `lease_lost` token is a child of this.
    pub(crate) work_cancel: CancellationToken,
    /// Phase three: deliveries that ignored `work_cancel` are abandoned.
    pub(crate) abort: CancellationToken,
    pub(crate) start_gate: Option<Arc<Semaphore>>,
    /// Set once, by the first part that panicked (see [`supervise`]).
    pub(crate) failure: OnceLock<WorkerFailure>,
}

/// `d` scaled by a random factor in [0.9, 1.1], so workers started together poll apart.
pub(crate) fn jittered(d: Duration) -> Duration {
    use rand::Rng;
    d.mul_f64(rand::rng().random_range(0.9..=1.1))
}

//! Starts the parts of a worker, and stops them in order: the [`WorkerHandle`].
//!
//! Shutdown has three phases, each with its own token: `claim_stop` (stop claiming; unstarted
//! claims are released), `work_cancel` after the deadline (running deliveries see
//! `Delivery::lease_lost` cancelled), and `abort` after a short grace (deliveries still running
//! are abandoned). Interrupted deliveries are handed back without charging their attempt, so
//! another worker delivers them at once (see `executor`).
//! The completer, renewer and maintenance stop last: renewal must go on while deliveries drain,
//! and completions must be written before the worker says it stopped, unless the database stops
//! answering: then the completer and maintenance get one more shutdown deadline and are
//! abandoned, so shutdown always ends. A part that panics begins the same shutdown (see
//! `supervise`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Shared;
use super::claimer::Claimer;
use super::completer::Completer;
use super::events::WorkerEvent;
use super::executor::Executor;
use super::listener::Listener;
use super::maintenance::Maintenance;
use super::metrics::WorkerCounters;
use super::renewer::Renewer;
use super::roster::Roster;
use super::supervise::{WorkerFailure, spawn_part};

/// How long deliveries get to react to a cancelled `lease_lost` token before being abandoned.
const ABORT_GRACE: Duration = Duration::from_secs(2);

/// A running worker. [`WorkerHandle::shutdown`] stops it gracefully; dropping the handle starts
/// the same shutdown in the background.
#[derive(Debug)]
pub struct WorkerHandle {
    shared: Arc<Shared>,
    stopped: watch::Receiver<bool>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("name", &self.config.name)
            .field("table", &self.config.table)
            .finish_non_exhaustive()
    }
}

impl WorkerHandle {
    /// Stop claiming, let running deliveries finish within the shutdown deadline, hand back
    /// unstarted claims, write pending completions, and return when all of it is done.
    /// Idempotent: every call waits for the same shutdown.
    pub async fn shutdown(&self) {
        self.begin_shutdown();
        self.stopped().await;
    }

    /// Start shutting down without waiting.
    pub fn begin_shutdown(&self) {
        self.shared.claim_stop.cancel();
    }

    /// Wait until the worker stopped (after someone called [`WorkerHandle::shutdown`] or
    /// [`WorkerHandle::begin_shutdown`]).
    pub async fn stopped(&self) {
        let mut rx = self.stopped.clone();
        let _ = rx.wait_for(|stopped| *stopped).await;
    }

    /// Whether the worker has fully stopped.
    pub fn is_stopped(&self) -> bool {
        *self.stopped.borrow()
    }

    /// The worker's name (as recorded in `claimed_by`).
    pub fn name(&self) -> &str {
        &self.shared.config.name
    }

    /// What this worker counted so far.
    pub fn counters(&self) -> WorkerCounters {
        self.shared.counters.snapshot()
    }

    /// Deliveries currently in flight (claimed and not yet written back).
    pub fn in_flight(&self) -> usize {
        self.shared.inflight.len()
    }

    /// Why the worker stopped without being asked to: the first of its parts that panicked.
    /// `None` while it runs well, and after a shutdown someone asked for.
    pub fn failure(&self) -> Option<WorkerFailure> {
        self.shared.failure.get().cloned()
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        self.shared.claim_stop.cancel();
    }
}

/// Start every part of the worker and the supervisor that stops them in order.
pub(crate) fn spawn(shared: Arc<Shared>) -> WorkerHandle {
    let (stopped_tx, stopped_rx) = watch::channel(false);
    // Room for one batch queued while another is written: past that, delivery tasks wait
    // (see `Executor::completions`).
    let (completions_tx, completions_rx) = mpsc::channel(shared.config.completion_batch.max(1));
    let background = CancellationToken::new();
    let tasks = TaskTracker::new();

    let completer = spawn_part(
        &shared,
        "completer",
        Completer {
            shared: Arc::clone(&shared),
            completions: completions_rx,
        }
        .run(),
    );
    let renewer = shared.config.renewal.then(|| {
        spawn_part(
            &shared,
            "renewer",
            Renewer {
                shared: Arc::clone(&shared),
            }
            .run(background.clone()),
        )
    });
    let maintenance = shared.config.maintenance.then(|| {
        spawn_part(
            &shared,
            "maintenance",
            Maintenance::new(Arc::clone(&shared)).run(background.clone()),
        )
    });
    let roster = spawn_part(
        &shared,
        "roster",
        Roster {
            shared: Arc::clone(&shared),
        }
        .run(shared.claim_stop.clone()),
    );
    let listener = shared.config.listen.then(|| {
        spawn_part(
            &shared,
            "listener",
            Listener {
                shared: Arc::clone(&shared),
            }
            .run(shared.claim_stop.clone()),
        )
    });
    let claimer = spawn_part(
        &shared,
        "claimer",
        Claimer {
            shared: Arc::clone(&shared),
            holds: Arc::new(Semaphore::new(
                shared.config.concurrency + shared.config.prefetch,
            )),
            tasks: tasks.clone(),
            executor: Executor {
                shared: Arc::clone(&shared),
                completions: completions_tx,
                slots: Arc::new(Semaphore::new(shared.config.concurrency)),
            },
        }
        .run(),
    );

    let supervisor_shared = Arc::clone(&shared);
    tokio::spawn(async move {
        let shared = supervisor_shared;
        shared.claim_stop.cancelled().await;
        tracing::info!(worker = %shared.config.name, in_flight = shared.inflight.len(), "outbox worker shutting down");
        // Phase 1: no new claims, no new delivery tasks.
        let _ = claimer.await;
        if let Some(l) = listener {
            let _ = l.await;
        }
        tasks.close();
        // Phase 2: drain under the deadline, then tell the rest to stop, then abandon them.
        if tokio::time::timeout(shared.config.shutdown_deadline, tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                worker = %shared.config.name,
                running = tasks.len(),
                "shutdown deadline passed; cancelling the running deliveries"
            );
            shared.work_cancel.cancel();
            if tokio::time::timeout(ABORT_GRACE, tasks.wait())
                .await
                .is_err()
            {
                shared.abort.cancel();
                tasks.wait().await;
            }
        }
        // Phase 3: every sender is gone now, so the completer flushes and ends. A database that
        // stopped answering mid-statement would keep it (or maintenance) waiting for ever: each
        // gets one more shutdown deadline, then is abandoned. The outcomes not written then are
        // not lost: those events are delivered again once their leases end (at least once).
        let name = &shared.config.name;
        let within = shared.config.shutdown_deadline;
        finish_or_abandon(
            completer,
            within,
            name,
            "writing the delivered events' outcomes",
        )
        .await;
        // The roster left outbox_workers when claiming stopped (it claims nothing more); here
        // its statement is only waited for, bounded like the others.
        finish_or_abandon(roster, within, name, "leaving outbox_workers").await;
        background.cancel();
        if let Some(r) = renewer {
            let _ = r.await;
        }
        if let Some(m) = maintenance {
            finish_or_abandon(m, within, name, "maintenance").await;
        }
        if tokio::time::timeout(within, shared.sessions.close())
            .await
            .is_err()
        {
            tracing::warn!(worker = %name, "closing the worker's connections did not finish within the shutdown deadline; left to close in the background");
        }
        tracing::info!(worker = %shared.config.name, "outbox worker stopped");
        shared.hook.emit(|| WorkerEvent::Stopped);
        let _ = stopped_tx.send(true);
    });

    WorkerHandle {
        shared,
        stopped: stopped_rx,
    }
}

/// Wait up to `within` for `task` to end; past that, abort it (dropping its connection and any
/// statement it is waiting on) and say so.
async fn finish_or_abandon(
    mut task: tokio::task::JoinHandle<()>,
    within: Duration,
    worker: &str,
    what: &str,
) {
    if tokio::time::timeout(within, &mut task).await.is_err() {
        tracing::warn!(
            worker,
            "{what} did not finish within the shutdown deadline (is the database answering?); \
             abandoned: events whose outcome was not written are delivered again once their \
             leases end"
        );
        task.abort();
        let _ = task.await;
    }
}

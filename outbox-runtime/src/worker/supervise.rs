//! Watches the worker's long-running parts (claimer, completer, renewer, maintenance,
//! listener): a part that panics stops the whole worker, and the handle says why.
//!
//! A worker missing one part is worse than a stopped worker. Without its completer it would go
//! on claiming and delivering while no completion is written, so every event would come back
//! after its lease and be delivered again, for ever. Without its claimer it would hold its
//! leases and deliver nothing; without its renewer or maintenance leader, leases would run
//! out under running deliveries or never be recovered. None of that is visible from outside.
//! So the first panic begins the graceful shutdown: running deliveries finish and their
//! completions are written while the completer lives, and whatever is not written back returns
//! after its lease, to be delivered by another worker (at least once). The handle then reports
//! [`WorkerFailure`] ([`super::WorkerHandle::failure`]), and [`super::Worker::run_until`]
//! returns it as [`crate::error::Error::WorkerFailed`], so a service can exit and be restarted.
//!
//! Restarting the part in place was the alternative: a part that panics on the same input (a
//! sink's `max_batch`, a metrics recorder, a tracing subscriber) would panic again at once,
//! and the worker would look alive while it loops.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use tokio::task::JoinHandle;

use super::Shared;
use super::executor::panic_message;

/// Why a worker stopped without being asked to: one of its parts panicked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerFailure {
    /// The part that panicked: `claimer`, `completer`, `renewer`, `maintenance` or `listener`.
    pub part: &'static str,
    /// The panic's message.
    pub message: String,
}

impl std::fmt::Display for WorkerFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the worker's {} panicked: {}", self.part, self.message)
    }
}

/// Spawn `part` of the worker, named `name`; if it panics, record the failure and begin the
/// worker's shutdown. The handle ends either way, so the shutdown's joins never see a panic.
pub(crate) fn spawn_part<F>(shared: &Arc<Shared>, name: &'static str, part: F) -> JoinHandle<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        // Unwind safety: after a panic the part is never polled again, and what it shared
        // (`Shared`) is only read for the shutdown, whose state is atomics and tokens.
        if let Err(panic) = AssertUnwindSafe(part).catch_unwind().await {
            failed(
                &shared,
                WorkerFailure {
                    part: name,
                    message: panic_message(panic.as_ref()),
                },
            );
        }
    })
}

/// Record the first failure and begin the shutdown.
fn failed(shared: &Shared, failure: WorkerFailure) {
    tracing::error!(
        worker = %shared.config.name,
        part = failure.part,
        panic = %failure.message,
        "a part of the outbox worker panicked; the worker stops: running deliveries finish, and \
         events whose outcome is not written are delivered again after their leases. \
         Restart the worker, and report the panic"
    );
    // A second part failing during the shutdown (the completer after the claimer, say) is a
    // consequence; the first one is the cause.
    let _ = shared.failure.set(failure);
    shared.claim_stop.cancel();
}

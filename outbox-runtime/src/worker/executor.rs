//! Runs ONE claimed event through the sink: its tracing span, panic catching, and where the
//! outcome goes (completer on success, `fail_if_owned` on failure, `release_if_owned` when
//! shutdown came before it started).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::Shared;
use super::events::WorkerEvent;
use crate::delivery::{Delivery, FailureKind, HandlerError};
use crate::store::{Claim, ClaimedEvent, FailOutcome, Ownership};

/// What the sink's call ended with.
enum Outcome {
    Delivered,
    Failed(HandlerError),
    Panicked(String),
    /// Shutdown's grace ran out while the sink was still running.
    Abandoned,
}

#[derive(Clone)]
pub(crate) struct Executor {
    pub(crate) shared: Arc<Shared>,
    pub(crate) completions: UnboundedSender<Claim>,
}

impl Executor {
    /// Deliver `event`; `slot` is the concurrency permit, freed as soon as the sink returns.
    pub(crate) async fn run(
        self,
        event: ClaimedEvent,
        lease_lost: CancellationToken,
        slot: OwnedSemaphorePermit,
    ) {
        let shared = Arc::clone(&self.shared);
        let claim = event.claim();
        if let Some(gate) = &shared.start_gate {
            tokio::select! {
                permit = gate.acquire() => { if let Ok(p) = permit { p.forget() } }
                () = shared.claim_stop.cancelled() => {}
            }
        }
        if shared.claim_stop.is_cancelled() {
            drop(slot);
            self.release(claim).await;
            return;
        }
        let span = tracing::info_span!(
            "outbox_delivery",
            event_id = %event.event_id,
            event_type = %event.event_type,
            event_version = event.event_version,
            attempt = event.attempts,
            worker = %shared.config.name,
            table = %shared.config.table,
        );
        async move {
            let delivery = Delivery::new(&event, lease_lost);
            // The call itself sits inside the async block so a sink that panics before returning
            // its future is caught too.
            let sink = Arc::clone(&shared.sink);
            let call = AssertUnwindSafe(async { sink.deliver(&event, &delivery).await }).catch_unwind();
            let outcome = tokio::select! {
                result = call => match result {
                    Ok(Ok(())) => Outcome::Delivered,
                    Ok(Err(e)) => Outcome::Failed(e),
                    Err(panic) => Outcome::Panicked(panic_message(panic.as_ref())),
                },
                () = shared.abort.cancelled() => Outcome::Abandoned,
            };
            drop(slot);
            match outcome {
                Outcome::Delivered => {
                    tracing::debug!("delivered; completion queued");
                    if self.completions.send(claim).is_err() {
                        // The completer is gone (only during a forced stop): leave the event to
                        // lease expiry, and so to another delivery, rather than guess.
                        shared.inflight.remove(&claim);
                    }
                }
                Outcome::Failed(error) => self.fail(&event, &error).await,
                Outcome::Panicked(message) => {
                    shared.counters.panicked();
                    shared.hook.emit(|| WorkerEvent::Panicked(claim));
                    tracing::error!(panic = %message, "handler panicked; failing the event permanently");
                    let error = HandlerError::permanent(format!("handler panicked: {message}"));
                    self.fail(&event, &error).await;
                }
                Outcome::Abandoned => {
                    tracing::warn!("shutdown grace ended while the handler was running; handing the event back");
                    let error = HandlerError::retry_after("worker shut down during delivery", Duration::ZERO);
                    self.fail(&event, &error).await;
                }
            }
        }
        .instrument(span)
        .await;
    }

    /// Record a failed attempt: retry after the handler's delay or the policy's backoff, or
    /// exhaust the event when the failure is permanent.
    async fn fail(&self, event: &ClaimedEvent, error: &HandlerError) {
        let shared = &self.shared;
        let claim = event.claim();
        let attempt = u32::try_from(event.attempts).unwrap_or(1);
        let (retry_after, permanent) = match error.kind {
            FailureKind::Retry { after: Some(after) } => (after, false),
            FailureKind::Retry { after: None } => (shared.config.retry.delay_for(attempt), false),
            FailureKind::Permanent => (Duration::ZERO, true),
        };
        // No longer ours to renew once the outcome is being written.
        shared.inflight.remove(&claim);
        match shared
            .store
            .fail_if_owned(claim, &error.message, retry_after, permanent)
            .await
        {
            Ok(outcome) => {
                match outcome {
                    FailOutcome::Rescheduled => {
                        shared.counters.retried();
                        tracing::info!(error = %error, retry_in_ms = retry_after.as_millis() as u64, "delivery failed; retrying later");
                    }
                    FailOutcome::Exhausted => {
                        shared.counters.exhausted();
                        tracing::warn!(error = %error, "delivery failed for good; event exhausted");
                    }
                    FailOutcome::Lost => {
                        shared.counters.stale(1);
                        tracing::warn!(error = %error, "delivery failed after the lease was lost; the failure was not recorded (another worker owns the event)");
                    }
                }
                shared.hook.emit(|| WorkerEvent::Failed(claim, outcome));
            }
            Err(e) => tracing::warn!(
                error = %e,
                "could not record a failed delivery; the lease will expire and the event be retried"
            ),
        }
    }

    /// Hand back a claim that never reached the sink, without charging its attempt.
    async fn release(&self, claim: Claim) {
        let shared = &self.shared;
        shared.inflight.remove(&claim);
        match shared.store.release_if_owned(claim).await {
            Ok(Ownership::Owned) => {
                shared.counters.released();
                shared.hook.emit(|| WorkerEvent::Released(claim));
            }
            Ok(Ownership::Lost) => {}
            Err(e) => {
                tracing::warn!(error = %e, row = claim.id, "could not release an unstarted claim; it returns after its lease")
            }
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}

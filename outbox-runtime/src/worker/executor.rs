//! Runs claimed events through the sink: ONE event per call ([`Executor::run`]), or a chunk in
//! one `Sink::deliver_batch` call when the sink has a batch API ([`Executor::run_batch`]). Each
//! has its tracing span, panic catching, and sends every outcome where it belongs (completer on
//! success, `fail_if_owned` on failure, `release_if_owned` when shutdown came before it started
//! or stopped it before it finished).
//!
//! A delivery that shutdown interrupted is handed back like an unstarted claim, its attempt not
//! charged and no handler failure recorded: abandoned after the grace, or ended with a retryable
//! error after its `lease_lost` token was cancelled by the shutdown deadline. The worker left;
//! the event did not fail, and on its last attempt it must not be exhausted for it.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::mpsc::Sender;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::Shared;
use super::completer::Completion;
use super::config::RetryPolicy;
use super::events::WorkerEvent;
use crate::delivery::{Delivery, FailureKind, HandlerError};
use crate::sink::Sink;
use crate::store::{Claim, ClaimedEvent, FailOutcome, Ownership};

/// What the sink's call ended with.
enum Outcome {
    Delivered,
    Failed(HandlerError),
    Panicked(String),
    /// Shutdown's grace ran out while the sink was still running.
    Abandoned,
}

impl From<SinkOutcome> for Outcome {
    fn from(outcome: SinkOutcome) -> Self {
        match outcome {
            SinkOutcome::Delivered => Outcome::Delivered,
            SinkOutcome::Failed(e) => Outcome::Failed(e),
            SinkOutcome::Panicked(message) => Outcome::Panicked(message),
        }
    }
}

/// What one call of a sink ended with. Shared with the test kit's drain (`crate::testing`),
/// which delivers through this same call and records the outcomes the same way.
pub(crate) enum SinkOutcome {
    /// The sink accepted the event.
    Delivered,
    /// The sink reported a failure.
    Failed(HandlerError),
    /// The sink panicked; the panic's message.
    Panicked(String),
}

/// Call `sink` for one event, catching a panic. The call sits inside the async block so a sink
/// that panics before returning its future is caught too.
pub(crate) async fn call_sink(
    sink: &dyn Sink,
    event: &ClaimedEvent,
    delivery: &Delivery,
) -> SinkOutcome {
    match AssertUnwindSafe(async { sink.deliver(event, delivery).await })
        .catch_unwind()
        .await
    {
        Ok(Ok(())) => SinkOutcome::Delivered,
        Ok(Err(e)) => SinkOutcome::Failed(e),
        Err(panic) => SinkOutcome::Panicked(panic_message(panic.as_ref())),
    }
}

/// The failure a panicking sink is recorded with: permanent, since a panic is no answer from the
/// receiver and retrying the same payload is likely to panic again.
pub(crate) fn panic_failure(message: &str) -> HandlerError {
    HandlerError::permanent(format!("handler panicked: {message}"))
}

/// How a failed attempt is recorded: `(retry_after, permanent)`. The handler's own delay when it
/// gave one, else the policy's backoff for `attempts` (the attempt that failed, 1-based).
pub(crate) fn retry_plan(
    error: &HandlerError,
    retry: &RetryPolicy,
    attempts: i32,
) -> (Duration, bool) {
    let attempt = u32::try_from(attempts).unwrap_or(1);
    match error.kind {
        FailureKind::Retry { after: Some(after) } => (after, false),
        FailureKind::Retry { after: None } => (retry.delay_for(attempt), false),
        FailureKind::Permanent => (Duration::ZERO, true),
    }
}

#[derive(Clone)]
pub(crate) struct Executor {
    pub(crate) shared: Arc<Shared>,
    /// Completions waiting to be written. Bounded, so that when writing them lags (a slow or
    /// blocked database) delivery tasks wait here with their slot and hold, and the claimer stops
    /// claiming: the events claimed but not yet written stay bounded, instead of growing toward the
    /// whole backlog while their leases run down.
    pub(crate) completions: Sender<Completion>,
    /// One permit per delivery slot (`concurrency` in all). Claimed events wait here, in claim
    /// order, when the claimer claimed ahead (see `pace`).
    pub(crate) slots: Arc<Semaphore>,
}

impl Executor {
    /// Wait for `n` delivery slots; `None` when shutdown began first (the events are then handed
    /// back unstarted).
    async fn wait_for_slots(&self, n: usize) -> Option<OwnedSemaphorePermit> {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        tokio::select! {
            biased;
            () = self.shared.claim_stop.cancelled() => None,
            slots = self.slots.clone().acquire_many_owned(n) => slots.ok(),
        }
    }

    /// Deliver `event`, claimed at `claimed_at`, once a delivery slot is free; `hold` is the
    /// claimer's permit for it. Both are freed once the outcome is handed on: after the sink
    /// returns, and for a delivered event once the completer has room for its completion.
    pub(crate) async fn run(
        self,
        event: ClaimedEvent,
        lease_lost: CancellationToken,
        hold: OwnedSemaphorePermit,
        claimed_at: Instant,
    ) {
        let shared = Arc::clone(&self.shared);
        let claim = event.claim();
        let Some(slot) = self.wait_for_slots(1).await else {
            drop(hold);
            self.release(claim).await;
            return;
        };
        if let Some(gate) = &shared.start_gate {
            tokio::select! {
                permit = gate.acquire() => { if let Ok(p) = permit { p.forget() } }
                () = shared.claim_stop.cancelled() => {}
            }
        }
        if shared.claim_stop.is_cancelled() {
            drop((slot, hold));
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
        // The delivery continues the trace its event was enqueued in (a child of the producer's
        // span), before the span is first entered.
        #[cfg(feature = "opentelemetry")]
        crate::trace_context::continue_delivery(&span, &event.headers);
        async move {
            let delivery = Delivery::new(&event, lease_lost);
            let sink = Arc::clone(&shared.sink);
            let started = Instant::now();
            // The sink first: most sinks answer on their first poll, and an abort already
            // signalled is seen on the next poll of a sink that waits.
            let outcome = tokio::select! {
                biased;
                outcome = call_sink(sink.as_ref(), &event, &delivery) => Outcome::from(outcome),
                () = shared.abort.cancelled() => Outcome::Abandoned,
            };
            let permits = (slot, hold);
            if !matches!(outcome, Outcome::Abandoned) {
                let took = started.elapsed();
                shared.counters.handler_took(&event.event_type, took);
                shared.pace.delivered(took);
            }
            match outcome {
                Outcome::Delivered => {
                    // The slot and hold go once the completion is queued (see `delivered`).
                    self.delivered(Completion::of(event, claimed_at)).await;
                    drop(permits);
                }
                Outcome::Failed(error) => {
                    drop(permits);
                    self.failed(&event, &error).await;
                }
                Outcome::Panicked(message) => {
                    drop(permits);
                    shared.counters.panicked();
                    shared.hook.emit(|| WorkerEvent::Panicked(claim));
                    tracing::error!(panic = %message, "handler panicked; failing the event permanently");
                    let error = panic_failure(&message);
                    self.fail(&event, &error).await;
                }
                Outcome::Abandoned => {
                    drop(permits);
                    tracing::warn!("shutdown grace ended while the handler was running; handing the event back without charging the attempt");
                    self.release(claim).await;
                }
            }
        }
        .instrument(span)
        .await;
    }

    /// Deliver a chunk of claimed events (at most `Sink::max_batch`, and at most the
    /// concurrency) in one `Sink::deliver_batch` call, once a delivery slot is free for each;
    /// `holds` is the claimer's permit for them. Each item's result is applied on its own:
    /// accepted items are completed, refused ones take the fail path, and items the sink
    /// returned no result for are retried.
    pub(crate) async fn run_batch(
        self,
        items: Vec<(ClaimedEvent, CancellationToken)>,
        holds: OwnedSemaphorePermit,
        claimed_at: Instant,
    ) {
        let shared = Arc::clone(&self.shared);
        let Some(slots) = self.wait_for_slots(items.len()).await else {
            drop(holds);
            for (event, _) in &items {
                self.release(event.claim()).await;
            }
            return;
        };
        if let Some(gate) = &shared.start_gate {
            let wanted = u32::try_from(items.len()).unwrap_or(u32::MAX);
            tokio::select! {
                permit = gate.acquire_many(wanted) => { if let Ok(p) = permit { p.forget() } }
                () = shared.claim_stop.cancelled() => {}
            }
        }
        if shared.claim_stop.is_cancelled() {
            drop((slots, holds));
            for (event, _) in &items {
                self.release(event.claim()).await;
            }
            return;
        }
        let batch: Vec<(ClaimedEvent, Delivery)> = items
            .into_iter()
            .map(|(event, lease_lost)| {
                let delivery = Delivery::new(&event, lease_lost);
                (event, delivery)
            })
            .collect();
        let span = tracing::info_span!(
            "outbox_delivery_batch",
            events = batch.len(),
            worker = %shared.config.name,
            table = %shared.config.table,
        );
        // A batch holds events of many traces: it starts a trace of its own, linked to each.
        #[cfg(feature = "opentelemetry")]
        for (event, _) in &batch {
            crate::trace_context::link_delivery(&span, &event.headers);
        }
        async move {
            let sink = Arc::clone(&shared.sink);
            let call = AssertUnwindSafe(async { sink.deliver_batch(&batch).await }).catch_unwind();
            let started = Instant::now();
            let outcome = tokio::select! {
                result = call => result.map_err(|panic| panic_message(panic.as_ref())).map(Some),
                () = shared.abort.cancelled() => Ok(None),
            };
            // Kept until every result is handed on (see `delivered`).
            let permits = (slots, holds);
            if !matches!(outcome, Ok(None)) {
                let took = started.elapsed();
                for (event, _) in &batch {
                    shared.counters.handler_took(&event.event_type, took);
                }
                shared.pace.delivered(took);
            }
            match outcome {
                Ok(Some(results)) => {
                    self.apply_batch_results(&batch, results, claimed_at).await;
                    drop(permits);
                }
                Err(message) => {
                    drop(permits);
                    // A panic cannot be pinned on one item, so no item is failed permanently for
                    // it: every item is retried with backoff, and the attempts charged at claim
                    // time bound how often a poison item can take its batch down.
                    shared.counters.panicked();
                    tracing::error!(panic = %message, "sink panicked in deliver_batch; retrying every event of the batch");
                    let error = HandlerError::retry(format!("sink panicked in deliver_batch: {message}"));
                    for (event, _) in &batch {
                        shared.hook.emit(|| WorkerEvent::Panicked(event.claim()));
                        self.fail(event, &error).await;
                    }
                }
                Ok(None) => {
                    drop(permits);
                    tracing::warn!("shutdown grace ended while a batch was being delivered; handing the events back without charging their attempts");
                    for (event, _) in &batch {
                        self.release(event.claim()).await;
                    }
                }
            }
        }
        .instrument(span)
        .await;
    }

    /// Apply one result per item, in order. A sink that returns too few results leaves the
    /// rest undecided: they are retried (never completed, never lost).
    async fn apply_batch_results(
        &self,
        batch: &[(ClaimedEvent, Delivery)],
        results: Vec<Result<(), HandlerError>>,
        claimed_at: Instant,
    ) {
        let returned = results.len();
        if returned != batch.len() {
            tracing::error!(
                events = batch.len(),
                results = returned,
                "the sink's deliver_batch returned a result count that does not match its input; items without a result are retried, extra results are ignored"
            );
        }
        let mut results = results.into_iter();
        for (event, _) in batch {
            match results.next() {
                Some(Ok(())) => self.delivered(Completion::copied(event, claimed_at)).await,
                Some(Err(error)) => self.failed(event, &error).await,
                None => {
                    let error = HandlerError::retry(format!(
                        "the sink's deliver_batch returned {returned} results for {} events; this event got none",
                        batch.len()
                    ));
                    self.fail(event, &error).await;
                }
            }
        }
    }

    /// Queue the completion of a delivered event; waits while the completer is a full batch
    /// behind (the caller still holds the event's slot and hold, which is what stops the
    /// claimer).
    async fn delivered(&self, completion: Completion) {
        let claim = completion.claim();
        tracing::debug!(row = claim.id, "delivered; completion queued");
        let queued = tokio::select! {
            biased;
            sent = self.completions.send(completion) => sent.is_ok(),
            // A forced stop while the completer cannot keep up (its database hangs, say):
            // the worker must still stop.
            () = self.shared.abort.cancelled() => false,
        };
        if !queued {
            // The completer is gone or stuck (only during a forced stop): leave the event to
            // lease expiry, and so to another delivery, rather than guess.
            self.shared.inflight.remove(&claim);
        }
    }

    /// The handler reported a failure. After the shutdown deadline told it to stop, a
    /// retryable failure is the worker leaving, not the event failing: the event is handed back
    /// uncharged. A permanent failure is the handler's verdict on the event and is recorded.
    async fn failed(&self, event: &ClaimedEvent, error: &HandlerError) {
        let stopped_by_shutdown = self.shared.work_cancel.is_cancelled();
        if stopped_by_shutdown && !matches!(error.kind, FailureKind::Permanent) {
            tracing::info!(error = %error, "the handler stopped because the worker is shutting down; handing the event back without charging the attempt");
            self.release(event.claim()).await;
        } else {
            self.fail(event, error).await;
        }
    }

    /// Record a failed attempt: retry after the handler's delay or the policy's backoff, or
    /// exhaust the event when the failure is permanent.
    async fn fail(&self, event: &ClaimedEvent, error: &HandlerError) {
        let shared = &self.shared;
        let claim = event.claim();
        let (retry_after, permanent) = retry_plan(error, &shared.config.retry, event.attempts);
        // No longer ours to renew once the outcome is being written.
        shared.inflight.remove(&claim);
        if let Some(detail) = &error.detail {
            tracing::debug!(%detail, "what the sink reported with the failure");
        }
        match shared
            .outcome_store
            .fail_if_owned(claim, &error.stored_reason(), retry_after, permanent)
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
                        if shared.config.ordered {
                            // An exhausted event no longer blocks its aggregate: the successor
                            // is claimable now, not at the next poll tick.
                            shared.wake.notify_one();
                        }
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

    /// Hand back a claim that never reached the sink, or whose delivery shutdown interrupted,
    /// without charging its attempt.
    async fn release(&self, claim: Claim) {
        let shared = &self.shared;
        shared.inflight.remove(&claim);
        match shared.outcome_store.release_if_owned(claim).await {
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

/// A panic's message, when its payload is a string (as `panic!` with a message makes it).
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}

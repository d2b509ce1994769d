//! Fills free delivery slots with claimed events: one `claim_batch` per wake-up, never more
//! events than free slots, each started as a task under the concurrency limit.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::events::WorkerEvent;
use super::executor::Executor;
use super::inflight::local_lease_end;
use super::{Shared, jittered};
use crate::error::Result;
use crate::store::{ClaimedBatch, UndecodableEvent, UndecodableOutcome};

pub(crate) struct Claimer {
    pub(crate) shared: Arc<Shared>,
    /// One permit per delivery slot (`concurrency` in all).
    pub(crate) slots: Arc<Semaphore>,
    /// Where delivery tasks run; shutdown waits on it.
    pub(crate) tasks: TaskTracker,
    pub(crate) executor: Executor,
}

impl Claimer {
    /// Claim until shutdown begins. Each turn waits for a free slot, claims up to the free
    /// slots, and then either goes straight on (a full batch: more may be waiting) or waits for
    /// a notification or the jittered poll tick.
    pub(crate) async fn run(self) {
        let stop = self.shared.claim_stop.clone();
        loop {
            let first = tokio::select! {
                biased;
                () = stop.cancelled() => break,
                permit = self.slots.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let permits = self.take_free_slots(first);
            let requested = permits.len();
            let full = match self.claim_into(permits).await {
                Ok(claimed) => claimed == requested,
                Err(e) => {
                    tracing::warn!(error = %e, worker = %self.shared.config.name, "claiming failed; trying again after the poll interval");
                    false
                }
            };
            if full {
                continue;
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                () = self.shared.wake.notified() => {}
                () = tokio::time::sleep(jittered(self.shared.config.poll_interval)) => {}
            }
        }
    }

    fn take_free_slots(&self, first: OwnedSemaphorePermit) -> Vec<OwnedSemaphorePermit> {
        let mut permits = vec![first];
        while permits.len() < self.shared.config.batch_size {
            match self.slots.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        permits
    }

    /// Count and log the claimed rows the store found undecodable (it has exhausted them).
    fn report_undecodable(&self, undecodable: &[UndecodableEvent]) {
        let shared = &self.shared;
        for row in undecodable {
            match &row.outcome {
                UndecodableOutcome::Exhausted => {
                    shared.counters.undecodable();
                    shared.hook.emit(|| WorkerEvent::Undecodable(row.claim));
                    tracing::warn!(
                        event_id = %row.event_id,
                        event_type = %row.event_type,
                        reason = %row.reason,
                        "a claimed event cannot be decoded; exhausted it without delivery"
                    );
                }
                UndecodableOutcome::Lost => shared.counters.stale(1),
                UndecodableOutcome::NotRecorded(error) => tracing::warn!(
                    event_id = %row.event_id,
                    error = %error,
                    reason = %row.reason,
                    "a claimed event cannot be decoded, and exhausting it failed; it returns after its lease"
                ),
            }
        }
    }

    /// Claim `permits.len()` events at most and start one task per event; surplus permits go
    /// back when this returns.
    async fn claim_into(&self, permits: Vec<OwnedSemaphorePermit>) -> Result<usize> {
        let shared = &self.shared;
        let limit = i64::try_from(permits.len()).unwrap_or(i64::MAX);
        // Taken before the statement is sent: the database's lease cannot end before this plus
        // the lease (see `inflight`).
        let sent_at = Instant::now();
        let lease_ends = local_lease_end(sent_at, shared.config.lease);
        let ClaimedBatch {
            events,
            undecodable,
        } = shared
            .claim_store
            .claim_batch_outcome(
                &shared.config.name,
                limit,
                shared.config.lease,
                shared.config.ordered,
            )
            .await?;
        let claimed_at = Instant::now();
        shared.counters.claim_took(claimed_at - sent_at);
        for event in &events {
            shared
                .counters
                .claim_waited(&event.event_type, event.waited);
        }
        self.report_undecodable(&undecodable);
        if events.is_empty() {
            if undecodable.is_empty() {
                shared.hook.emit(|| WorkerEvent::ClaimedNothing);
            }
            return Ok(undecodable.len());
        }
        let claimed = events.len() + undecodable.len();
        shared
            .hook
            .emit(|| WorkerEvent::ClaimedBatch(events.iter().map(|e| e.claim()).collect()));
        tracing::debug!(claimed, worker = %shared.config.name, "claimed a batch");
        let max_batch = shared.sink.max_batch();
        if max_batch > 1 {
            // The sink has a batch API: one task per chunk, each holding its items' slots.
            let mut claimed_events = events.into_iter().zip(permits).peekable();
            while claimed_events.peek().is_some() {
                let mut items = Vec::with_capacity(max_batch);
                let mut slots = Vec::with_capacity(max_batch);
                for (event, slot) in claimed_events.by_ref().take(max_batch) {
                    let lease_lost = shared.work_cancel.child_token();
                    shared
                        .inflight
                        .register(event.claim(), lease_lost.clone(), lease_ends);
                    items.push((event, lease_lost));
                    slots.push(slot);
                }
                self.tasks
                    .spawn(self.executor.clone().run_batch(items, slots, claimed_at));
            }
            return Ok(claimed);
        }
        for (event, slot) in events.into_iter().zip(permits) {
            let lease_lost = shared.work_cancel.child_token();
            shared
                .inflight
                .register(event.claim(), lease_lost.clone(), lease_ends);
            self.tasks.spawn(
                self.executor
                    .clone()
                    .run(event, lease_lost, slot, claimed_at),
            );
        }
        Ok(claimed)
    }
}

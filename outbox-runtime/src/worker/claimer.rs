//! Claims events for the delivery slots: one `claim_batch` per wake-up, never more events than
//! the room left (the running deliveries plus the prefetch window, see [`super::pace`]), each
//! started as a task that waits for a free delivery slot.
//!
//! Two semaphores split the work. `holds` (`concurrency + prefetch` permits) bounds what this
//! worker holds claimed: the claimer takes one per event and the event gives it back when its
//! sink call returns (a delivered one once its completion is queued, so a completer that lags
//! stops the claimer, see `Executor::completions`). `slots` (`concurrency` permits, in the executor) bounds what runs. The
//! claimer keeps `prefetch - window` holds to itself while it waits, so it claims ahead only as
//! far as the measured pace asks for.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::events::WorkerEvent;
use super::executor::Executor;
use super::inflight::local_lease_end;
use super::{Shared, jittered};
use crate::error::Result;
use crate::held_session::HeldSession;
use crate::store::{ClaimedBatch, UndecodableEvent, UndecodableOutcome};

pub(crate) struct Claimer {
    pub(crate) shared: Arc<Shared>,
    /// One permit per event this worker may hold claimed (`concurrency + prefetch` in all).
    pub(crate) holds: Arc<Semaphore>,
    /// Where delivery tasks run; shutdown waits on it.
    pub(crate) tasks: TaskTracker,
    pub(crate) executor: Executor,
}

impl Claimer {
    /// Claim until shutdown begins. Each turn waits for room, claims up to it, and then
    /// either goes straight on (a full batch: more may be waiting) or waits for a notification
    /// or the jittered poll tick.
    pub(crate) async fn run(self) {
        let stop = self.shared.claim_stop.clone();
        // The claimer's pool has one session, and the claimer is its only user.
        let mut session = HeldSession::new(self.shared.claim_store.pool().clone(), true);
        loop {
            let room = tokio::select! {
                biased;
                () = stop.cancelled() => break,
                room = self.wait_for_room() => match room {
                    Some(room) => room,
                    None => break,
                },
            };
            let requested = room.num_permits();
            let full = match self.claim_into(&mut session, room).await {
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

    /// Wait until this worker may claim at least one more event, then take the holds for as
    /// many as it may (at most `batch_size`): the running and waiting events plus the room stay
    /// within `concurrency + window`. `None` when the semaphore is closed.
    async fn wait_for_room(&self) -> Option<OwnedSemaphorePermit> {
        let config = &self.shared.config;
        let window = self.shared.pace.window(config.concurrency, config.prefetch);
        // Kept back while waiting so that the first permit is granted only when the others
        // hold fewer than `concurrency + window`; handed back before claiming.
        let unused = config.prefetch - window;
        let mut room = self
            .holds
            .clone()
            .acquire_many_owned(permit_count(unused + 1))
            .await
            .ok()?;
        let more = self
            .holds
            .available_permits()
            .min(config.batch_size.saturating_sub(1));
        if more > 0
            && let Ok(extra) = self
                .holds
                .clone()
                .try_acquire_many_owned(permit_count(more))
        {
            room.merge(extra);
        }
        if unused > 0 {
            drop(room.split(unused));
        }
        Some(room)
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

    /// Claim `room.num_permits()` events at most on the claimer's kept `session` and start one
    /// task per event, each taking one of the holds; surplus holds go back when this returns. A
    /// claim whose answer was lost with its session is no different from a worker that died
    /// after claiming: its rows come back when their leases run out.
    async fn claim_into(
        &self,
        session: &mut HeldSession,
        mut room: OwnedSemaphorePermit,
    ) -> Result<usize> {
        let shared = &self.shared;
        let limit = i64::try_from(room.num_permits()).unwrap_or(i64::MAX);
        // Taken before the statement is sent: the database's lease cannot end before this plus
        // the lease (see `inflight`).
        let sent_at = Instant::now();
        let lease_ends = local_lease_end(sent_at, shared.config.lease);
        let ClaimedBatch {
            events,
            undecodable,
        } = loop {
            let config = &shared.config;
            let mut checkout = session.checkout().await?;
            let claimed = shared
                .claim_store
                .claim_batch_on(
                    &mut checkout.session,
                    &config.name,
                    limit,
                    config.lease,
                    config.ordered,
                    shared.handled.as_ref().map(|h| h.pairs()),
                )
                .await;
            if !session.check_in(checkout, &claimed) {
                break claimed?;
            }
            if let Err(error) = claimed {
                tracing::debug!(%error, worker = %config.name, "the claimer's kept session failed; claiming again on a new session");
            }
        };
        let claimed_at = Instant::now();
        shared.counters.claim_took(claimed_at - sent_at);
        shared.pace.claimed(claimed_at - sent_at);
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
        // A chunk runs only when it has a slot for each of its events, so it is never larger
        // than the slots there are.
        let max_batch = shared.sink.max_batch().min(shared.config.concurrency);
        if max_batch > 1 {
            // The sink has a batch API: one task per chunk, each holding its items' holds.
            let mut claimed_events = events.into_iter().peekable();
            while claimed_events.peek().is_some() {
                let mut items = Vec::with_capacity(max_batch);
                for event in claimed_events.by_ref().take(max_batch) {
                    let lease_lost = shared.work_cancel.child_token();
                    shared
                        .inflight
                        .register(event.claim(), lease_lost.clone(), lease_ends);
                    items.push((event, lease_lost));
                }
                let Some(holds) = room.split(items.len()) else {
                    unreachable!("a claim returns no more events than it has holds for");
                };
                self.tasks
                    .spawn(self.executor.clone().run_batch(items, holds, claimed_at));
            }
            return Ok(claimed);
        }
        for event in events {
            let lease_lost = shared.work_cancel.child_token();
            shared
                .inflight
                .register(event.claim(), lease_lost.clone(), lease_ends);
            let Some(hold) = room.split(1) else {
                unreachable!("a claim returns no more events than it has holds for");
            };
            self.tasks.spawn(
                self.executor
                    .clone()
                    .run(event, lease_lost, hold, claimed_at),
            );
        }
        Ok(claimed)
    }
}

/// A permit count as the semaphore takes it; the configuration keeps counts far below `u32::MAX`.
fn permit_count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

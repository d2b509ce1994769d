//! Writes successful deliveries back in batches: collects completed claims for a few
//! milliseconds (or until the batch is full, or holds every claim the worker has) and completes
//! them with one fenced statement. In ordered mode a written batch wakes the claimer: the
//! completed events' successors are claimable now.
//! Claims the database rejects were lost before the completion arrived: counted as stale.
//! With a retention of zero the completion deletes the rows instead of marking them delivered.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::Receiver;
use tokio::time::Instant;

use super::Shared;
use super::events::WorkerEvent;
use crate::error::Result;
use crate::held_session::HeldSession;
use crate::store::{Claim, ClaimedEvent};

/// Attempts at writing one batch before leaving it to lease expiry (and redelivery).
const WRITE_ATTEMPTS: u32 = 5;

/// A delivered event whose completion waits to be written, with what its histograms need.
#[derive(Debug)]
pub(crate) struct Completion {
    claim: Claim,
    event_type: String,
    attempts: i32,
    /// How long before the claim the event was enqueued (database clock).
    since_enqueue: Duration,
    /// When the claim came back (local monotonic clock): the two together give the time from
    /// enqueue to completion without comparing two machines' clocks.
    claimed_at: Instant,
}

impl Completion {
    /// The completion of `event`, whose delivery is over: its event type is moved, not copied.
    pub(crate) fn of(mut event: ClaimedEvent, claimed_at: Instant) -> Completion {
        let event_type = std::mem::take(&mut event.event_type);
        Completion::with_type(event_type, &event, claimed_at)
    }

    /// The completion of `event`, which a batch still holds: its event type is copied.
    pub(crate) fn copied(event: &ClaimedEvent, claimed_at: Instant) -> Completion {
        Completion::with_type(event.event_type.clone(), event, claimed_at)
    }

    fn with_type(event_type: String, event: &ClaimedEvent, claimed_at: Instant) -> Completion {
        Completion {
            claim: event.claim(),
            event_type,
            attempts: event.attempts,
            since_enqueue: event.since_enqueue,
            claimed_at,
        }
    }

    /// The claim to complete.
    pub(crate) fn claim(&self) -> Claim {
        self.claim
    }
}

pub(crate) struct Completer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) completions: Receiver<Completion>,
}

/// The completer's session: held between batches unless the completer pool has one session
/// only, which the failures and releases of running deliveries share with it.
fn completer_session(shared: &Shared) -> HeldSession {
    let pool = shared.outcome_store.pool().clone();
    let hold = pool.options().get_max_connections() > 1;
    HeldSession::new(pool, hold)
}

impl Completer {
    /// Run until every sender (the claimer and all delivery tasks) is gone, then flush the rest.
    pub(crate) async fn run(mut self) {
        let max = self.shared.config.completion_batch;
        let mut batch = Vec::with_capacity(max);
        let mut session = completer_session(&self.shared);
        loop {
            let Some(first) = self.completions.recv().await else {
                break;
            };
            batch.push(first);
            let flush_at = Instant::now() + self.shared.config.completion_flush;
            let mut closed = false;
            while batch.len() < max {
                // Every claim this worker holds is in the batch: no other completion can join
                // it, so waiting would only delay it (and, in ordered mode, the aggregate's next
                // event, which becomes claimable when this batch commits).
                if batch.len() >= self.shared.inflight.len() {
                    break;
                }
                tokio::select! {
                    next = self.completions.recv() => match next {
                        Some(completion) => batch.push(completion),
                        None => { closed = true; break }
                    },
                    () = tokio::time::sleep_until(flush_at) => break,
                }
            }
            self.flush(&mut session, &mut batch).await;
            if closed {
                break;
            }
        }
    }

    /// Complete `batch` in one statement; returns (completed, stale).
    async fn flush(
        &self,
        session: &mut HeldSession,
        batch: &mut Vec<Completion>,
    ) -> (usize, usize) {
        let shared = &self.shared;
        if batch.is_empty() {
            return (0, 0);
        }
        // From here on the outcome is being written: the renewer must not report these lost.
        for completion in batch.iter() {
            shared.inflight.remove(&completion.claim);
        }
        let completions = std::mem::take(batch);
        let claims: Vec<Claim> = completions.iter().map(|c| c.claim).collect();
        let mut delay = Duration::from_millis(50);
        // Set once a write failed: it may have committed before its answer was lost.
        let mut outcome_unknown = false;
        for attempt in 1..=WRITE_ATTEMPTS {
            let (written, retry_at_once) = self.write(session, &claims).await;
            match written {
                Ok(mut lost) => {
                    if outcome_unknown && !lost.is_empty() {
                        lost = self.not_completed_earlier(lost).await;
                    }
                    let completed: Vec<Claim> = claims
                        .iter()
                        .filter(|c| !lost.contains(c))
                        .copied()
                        .collect();
                    shared.counters.delivered(completed.len() as u64);
                    for done in completions.iter().filter(|c| !lost.contains(&c.claim)) {
                        shared.counters.delivered_after(
                            &done.event_type,
                            done.since_enqueue + done.claimed_at.elapsed(),
                            done.attempts,
                        );
                    }
                    if shared.config.ordered && !completed.is_empty() {
                        // Committed: each completed event's successor in its aggregate is
                        // claimable now, not at the next poll tick.
                        shared.wake.notify_one();
                    }
                    if !lost.is_empty() {
                        shared.counters.stale(lost.len() as u64);
                        tracing::warn!(
                            worker = %shared.config.name,
                            stale = lost.len(),
                            rows = ?lost.iter().map(|c| c.id).collect::<Vec<_>>(),
                            "completions rejected: the leases were lost before the deliveries finished; another worker delivers these events"
                        );
                    }
                    let counts = (completed.len(), lost.len());
                    shared.hook.emit(|| WorkerEvent::CompletedBatch {
                        completed,
                        stale: lost,
                    });
                    return counts;
                }
                Err(e) if attempt < WRITE_ATTEMPTS => {
                    outcome_unknown = true;
                    tracing::warn!(error = %e, attempt, "writing completions failed; retrying");
                    // A session held since the last batch may have died while idle: the retry
                    // takes a fresh one at once. Other failures back off.
                    if !retry_at_once {
                        tokio::time::sleep(delay).await;
                        delay *= 2;
                    }
                }
                Err(e) => {
                    tracing::error!(
                        error = %e,
                        events = claims.len(),
                        "writing completions failed repeatedly; these events will be delivered again after their leases"
                    );
                }
            }
        }
        (0, 0)
    }

    /// Complete `claims` in one fenced statement on the completer's session; also says whether
    /// a failure is worth retrying at once (it failed on a session kept from an earlier batch,
    /// see [`HeldSession::check_in`]).
    async fn write(
        &self,
        session: &mut HeldSession,
        claims: &[Claim],
    ) -> (Result<Vec<Claim>>, bool) {
        let shared = &self.shared;
        let mut checkout = match session.checkout().await {
            Ok(checkout) => checkout,
            Err(e) => return (Err(e.into()), false),
        };
        let written = shared
            .outcome_store
            .complete_many_on(
                &mut checkout.session,
                claims,
                shared.config.deletes_on_completion(),
            )
            .await;
        let retry_at_once = session.check_in(checkout, &written);
        (written, retry_at_once)
    }

    /// Of the claims a retried write reported lost, the ones the earlier write whose answer was
    /// lost had not completed: a claim that write completed is delivered, not stale.
    async fn not_completed_earlier(&self, lost: Vec<Claim>) -> Vec<Claim> {
        let shared = &self.shared;
        match shared.outcome_store.completed_earlier(&lost).await {
            Ok(done) => {
                if !done.is_empty() {
                    tracing::info!(
                        completed = done.len(),
                        "completions whose answer was lost had been written; counted as delivered"
                    );
                }
                lost.into_iter().filter(|c| !done.contains(c)).collect()
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not check whether completions whose answer was lost had been written; reporting them stale");
                lost
            }
        }
    }
}

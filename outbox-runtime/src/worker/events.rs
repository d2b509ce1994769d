//! A test hook: what the worker just did, sent to a channel only tests (or curious operators)
//! set. Inert by default, so production pays one `Option` check per event.
//!
//! Tests wait on these instead of sleeping ("wait until the batch was claimed, then SIGKILL").

use tokio::sync::mpsc::UnboundedSender;

use crate::store::{Claim, FailOutcome};

/// Something a worker did, reported through [`crate::worker::WorkerBuilder::events`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkerEvent {
    /// The listener is connected and listening (also after every reconnect).
    ListenerConnected,
    /// The listener's connection dropped; it is reconnecting.
    ListenerLost,
    /// A claim statement returned these claims (never sent for an empty claim).
    ClaimedBatch(Vec<Claim>),
    /// A claim statement found nothing to claim (the worker is idle until a wake-up or the
    /// poll tick). Lets a test know the worker has looked, instead of sleeping.
    ClaimedNothing,
    /// One completion statement ran: these claims were completed, these were stale. After a
    /// write whose answer was lost, claims that write had completed count as completed.
    CompletedBatch {
        /// Claims completed.
        completed: Vec<Claim>,
        /// Claims the database rejected: the lease was lost before the completion was written.
        stale: Vec<Claim>,
    },
    /// A claimed row could not be decoded and was exhausted with its own reason, without
    /// delivery (the rest of its batch is delivered as usual).
    Undecodable(Claim),
    /// A failure was recorded for a claim.
    Failed(Claim, FailOutcome),
    /// A handler panicked; the event was failed permanently.
    Panicked(Claim),
    /// The renewer found this claim lost, or saw its lease end by the local clock without a
    /// successful renewal, and cancelled its delivery's `lease_lost` token.
    LeaseLost(Claim),
    /// The renewer extended this many leases.
    Renewed(usize),
    /// An event was handed back at shutdown without charging an attempt: claimed but not
    /// started, or its delivery was interrupted by the shutdown deadline.
    Released(Claim),
    /// This worker became the maintenance leader.
    MaintenanceLeader,
    /// One maintenance pass ran on the leader.
    MaintenanceRan {
        /// Expired leases returned to pending.
        requeued: u64,
        /// Expired leases exhausted.
        exhausted: u64,
        /// Delivered rows purged.
        purged: u64,
    },
    /// The worker stopped: everything is drained and handed back.
    Stopped,
}

/// Where [`WorkerEvent`]s go, if anywhere.
#[derive(Debug, Clone, Default)]
pub(crate) struct Hook(Option<UnboundedSender<WorkerEvent>>);

impl Hook {
    pub(crate) fn new(sender: Option<UnboundedSender<WorkerEvent>>) -> Self {
        Hook(sender)
    }

    pub(crate) fn emit(&self, event: impl FnOnce() -> WorkerEvent) {
        if let Some(tx) = &self.0 {
            // A test that stopped listening is not an error of the worker.
            let _ = tx.send(event());
        }
    }
}

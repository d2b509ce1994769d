//! The claims this worker holds right now, from claim until the completion or failure is
//! written, with the token that tells each delivery its lease is gone.
//!
//! Keyed by the whole [`Claim`] (row id and claim_version): the same row can be claimed again
//! by this very worker after a lease was lost, and the two claims must not be confused.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio_util::sync::CancellationToken;

use crate::store::Claim;

#[derive(Debug, Default)]
pub(crate) struct InFlight {
    claims: Mutex<HashMap<Claim, CancellationToken>>,
}

impl InFlight {
    pub(crate) fn register(&self, claim: Claim, lease_lost: CancellationToken) {
        self.lock().insert(claim, lease_lost);
    }

    /// Forget a claim whose outcome was written (or that was found lost).
    pub(crate) fn remove(&self, claim: &Claim) {
        self.lock().remove(claim);
    }

    /// Forget a claim and tell its delivery the lease is gone; false when it was not here.
    pub(crate) fn lose(&self, claim: &Claim) -> bool {
        match self.lock().remove(claim) {
            Some(token) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    /// The claims to renew.
    pub(crate) fn claims(&self) -> Vec<Claim> {
        self.lock().keys().copied().collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Claim, CancellationToken>> {
        // A panic while holding this lock cannot leave the map inconsistent (single operations).
        self.claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

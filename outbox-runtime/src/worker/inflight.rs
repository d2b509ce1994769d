//! The claims this worker holds right now, from claim until the completion or failure is
//! written, with the token that tells each delivery its lease is gone and when that lease ends
//! by this process's monotonic clock.
//!
//! Keyed by the whole [`Claim`] (row id and claim_version): the same row can be claimed again
//! by this very worker after a lease was lost, and the two claims must not be confused.
//!
//! # The local lease end
//!
//! The database decides when a lease ends (`now() + lease` when the claim or renewal ran). The
//! worker cannot ask it during a partition, when every statement hangs without an error, yet
//! the lease still ends there and another worker may be handed the event. So each claim also
//! carries a local deadline: the moment its last successful claim or renewal statement was
//! *sent*, plus the lease, minus [`safety_margin`]. The statement ran after it was sent, so the
//! database's end is no earlier than the send time plus the lease (as long as the two clocks
//! tick at about the same rate, which the margin also covers); the renewer cancels `lease_lost`
//! once the local deadline passes without a newer successful renewal.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::store::Claim;

/// How much earlier than the database the worker gives a lease up: a tenth of the lease.
/// It absorbs a difference in clock rates and gives the handler time to stop before the
/// database's lease ends (and before a maintenance pass can hand the event to another worker).
pub(crate) fn safety_margin(lease: Duration) -> Duration {
    lease / 10
}

/// The local end of a lease granted by a statement sent at `sent`.
pub(crate) fn local_lease_end(sent: Instant, lease: Duration) -> Instant {
    sent + lease.saturating_sub(safety_margin(lease))
}

#[derive(Debug)]
struct Held {
    lease_lost: CancellationToken,
    /// When the lease ends by the local monotonic clock (see the module docs).
    lease_ends: Instant,
}

#[derive(Debug, Default)]
pub(crate) struct InFlight {
    claims: Mutex<HashMap<Claim, Held>>,
}

impl InFlight {
    pub(crate) fn register(
        &self,
        claim: Claim,
        lease_lost: CancellationToken,
        lease_ends: Instant,
    ) {
        self.lock().insert(
            claim,
            Held {
                lease_lost,
                lease_ends,
            },
        );
    }

    /// Forget a claim whose outcome was written (or that was found lost).
    pub(crate) fn remove(&self, claim: &Claim) {
        self.lock().remove(claim);
    }

    /// Forget a claim and tell its delivery the lease is gone; false when it was not here.
    pub(crate) fn lose(&self, claim: &Claim) -> bool {
        match self.lock().remove(claim) {
            Some(held) => {
                held.lease_lost.cancel();
                true
            }
            None => false,
        }
    }

    /// A renewal of `claims` succeeded: their leases now end at `lease_ends` (claims that left
    /// meanwhile stay gone).
    pub(crate) fn renewed(&self, claims: &[Claim], lease_ends: Instant) {
        let mut held = self.lock();
        for claim in claims {
            if let Some(h) = held.get_mut(claim) {
                h.lease_ends = h.lease_ends.max(lease_ends);
            }
        }
    }

    /// Forget every claim whose local lease end is not after `now`, and tell its delivery the
    /// lease is gone; returns them.
    pub(crate) fn expire(&self, now: Instant) -> Vec<Claim> {
        let mut held = self.lock();
        let ended: Vec<Claim> = held
            .iter()
            .filter(|(_, h)| h.lease_ends <= now)
            .map(|(claim, _)| *claim)
            .collect();
        for claim in &ended {
            if let Some(h) = held.remove(claim) {
                h.lease_lost.cancel();
            }
        }
        ended
    }

    /// The earliest local lease end, if any claim is held.
    pub(crate) fn next_lease_end(&self) -> Option<Instant> {
        self.lock().values().map(|h| h.lease_ends).min()
    }

    /// The claims to renew.
    pub(crate) fn claims(&self) -> Vec<Claim> {
        self.lock().keys().copied().collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Claim, Held>> {
        // A panic while holding this lock cannot leave the map inconsistent (single operations).
        self.claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(id: i64, claim_version: i64) -> Claim {
        Claim { id, claim_version }
    }

    #[test]
    fn the_local_end_is_the_send_time_plus_the_lease_minus_the_margin() {
        let sent = Instant::now();
        let lease = Duration::from_secs(30);
        assert_eq!(local_lease_end(sent, lease), sent + Duration::from_secs(27));
    }

    #[test]
    fn only_claims_past_their_local_end_expire_and_their_tokens_are_cancelled() {
        let inflight = InFlight::default();
        let now = Instant::now();
        let (old, fresh) = (CancellationToken::new(), CancellationToken::new());
        inflight.register(claim(1, 1), old.clone(), now);
        inflight.register(claim(1, 2), fresh.clone(), now + Duration::from_secs(5));
        assert_eq!(inflight.next_lease_end(), Some(now));
        assert_eq!(inflight.expire(now), vec![claim(1, 1)]);
        assert!(old.is_cancelled() && !fresh.is_cancelled());
        // A renewal moves the end forward, never back, and does not bring back a gone claim.
        inflight.renewed(&[claim(1, 1), claim(1, 2)], now + Duration::from_secs(10));
        inflight.renewed(&[claim(1, 2)], now + Duration::from_secs(1));
        assert_eq!(inflight.claims(), vec![claim(1, 2)]);
        assert!(inflight.expire(now + Duration::from_secs(9)).is_empty());
        assert_eq!(
            inflight.expire(now + Duration::from_secs(10)),
            vec![claim(1, 2)]
        );
        assert!(fresh.is_cancelled());
        assert_eq!(inflight.next_lease_end(), None);
    }
}

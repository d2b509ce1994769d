//! Keeps the leases of running deliveries alive: every renew interval, one fenced statement
//! extends all of this worker's in-flight claims. A claim the database no longer gives us was
//! lost (lease expired and recovered, or claimed elsewhere): its delivery is told through
//! `Delivery::lease_lost`.
//!
//! The database cannot say so during a partition: statements hang, with neither an answer nor
//! an error, while the leases run out there all the same. So the renewer also watches each
//! claim's lease end by the local monotonic clock (see `inflight`), between renewals and while
//! a renewal hangs, and tells the delivery once that end passed without a successful renewal.
//!
//! A renewal never waits for a row another transaction holds: it skips it and renews the rest
//! ([`Store::renew_many_if_owned_skipping_held`]). The lock it meets is usually a completion
//! being written (the completer takes a claim out of the in-flight set before writing it, but a
//! renewal that took the set a moment earlier still names that row), and the next renewal no
//! longer names the row. It can also be an operator's `SELECT ... FOR UPDATE` or a migration,
//! held for minutes: waiting for it would let every other lease run down, while skipping it
//! costs only that claim's lease, which the local clock gives up when it ends.
//!
//! [`Store::renew_many_if_owned_skipping_held`]: crate::store::Store::renew_many_if_owned_skipping_held

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::events::WorkerEvent;
use super::inflight::local_lease_end;
use crate::error::Result;

/// When to look at the local lease ends next: at the earliest one, and no later than `at_most`
/// from `now` (claims registered meanwhile end later than that). Never before `now` unless a
/// lease has already ended: a wake-up time in the past would make the renewer's loop spin.
fn next_check(now: Instant, earliest_lease_end: Option<Instant>, at_most: Duration) -> Instant {
    let latest = now + at_most;
    earliest_lease_end.map_or(latest, |end| end.min(latest))
}

/// What one renewal pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RenewCounts {
    pub(crate) renewed: usize,
    pub(crate) lost: usize,
    /// Claims whose rows another transaction held: asked about again next interval.
    pub(crate) held: usize,
}

/// The most important thing a renewal pass has to say (its log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RenewNews {
    /// Some claims were lost: their handlers were told.
    Lost,
    /// None lost, but some rows were held by another transaction and not renewed.
    Held,
    /// Every claim named was renewed.
    Renewed,
    /// No claim was in flight.
    Nothing,
}

impl RenewCounts {
    fn news(self) -> RenewNews {
        if self.lost > 0 {
            RenewNews::Lost
        } else if self.held > 0 {
            RenewNews::Held
        } else if self.renewed > 0 {
            RenewNews::Renewed
        } else {
            RenewNews::Nothing
        }
    }
}

pub(crate) struct Renewer {
    pub(crate) shared: Arc<Shared>,
}

impl Renewer {
    pub(crate) async fn run(self, stop: CancellationToken) {
        let every = self.shared.config.renew_every();
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let renewal = async {
                tick.tick().await;
                self.run_once().await
            };
            let result = tokio::select! {
                biased;
                () = stop.cancelled() => break,
                result = self.expiring_while(renewal) => result,
            };
            let c = match result {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "renewing leases failed; trying again next interval");
                    continue;
                }
            };
            match c.news() {
                RenewNews::Lost => tracing::warn!(
                    worker = %self.shared.config.name,
                    renewed = c.renewed,
                    lost = c.lost,
                    held = c.held,
                    "leases lost; the affected handlers were told to stop"
                ),
                RenewNews::Held => tracing::debug!(
                    renewed = c.renewed,
                    held = c.held,
                    "leases renewed, except those whose rows another transaction holds (asked again next interval)"
                ),
                RenewNews::Renewed => {
                    tracing::trace!(renewed = c.renewed, "leases renewed")
                }
                RenewNews::Nothing => {}
            }
        }
    }

    /// Run `work` (a wait for the next tick and a renewal, which may hang for as long as the
    /// database is unreachable), giving up every lease whose local end passes meanwhile.
    async fn expiring_while<T>(&self, work: impl Future<Output = T>) -> T {
        let mut work = pin!(work);
        // Claims registered while we sleep end no earlier than a lease minus the margin from
        // now, later than one renew interval from now (validated), so waking at least once per
        // interval finds every end in time.
        let at_most = self.shared.config.renew_every();
        loop {
            let check_at = next_check(
                Instant::now(),
                self.shared.inflight.next_lease_end(),
                at_most,
            );
            tokio::select! {
                biased;
                out = &mut work => return out,
                () = tokio::time::sleep_until(check_at) => self.give_up_ended_leases(),
            }
        }
    }

    /// Tell every delivery whose lease ended by the local clock, without a successful renewal,
    /// that its lease is gone.
    fn give_up_ended_leases(&self) {
        let shared = &self.shared;
        let ended = shared.inflight.expire(Instant::now());
        if ended.is_empty() {
            return;
        }
        tracing::warn!(
            worker = %shared.config.name,
            leases = ended.len(),
            rows = ?ended.iter().map(|c| c.id).collect::<Vec<_>>(),
            "no renewal reached the database before these leases ended by the local clock (is the database reachable?); the affected handlers were told to stop"
        );
        for claim in &ended {
            shared.hook.emit(|| WorkerEvent::LeaseLost(*claim));
        }
        shared.counters.lease_lost(ended.len() as u64);
    }

    pub(crate) async fn run_once(&self) -> Result<RenewCounts> {
        let shared = &self.shared;
        let claims = shared.inflight.claims();
        if claims.is_empty() {
            return Ok(RenewCounts::default());
        }
        // Taken before the statement is sent (see `inflight`).
        let lease_ends = local_lease_end(Instant::now(), shared.config.lease);
        let renewal = shared
            .renew_store
            .renew_many_if_owned_skipping_held(&claims, shared.config.lease)
            .await?;
        let renewed: Vec<_> = claims
            .iter()
            .filter(|c| !renewal.lost.contains(c) && !renewal.held.contains(c))
            .copied()
            .collect();
        shared.inflight.renewed(&renewed, lease_ends);
        let mut counts = RenewCounts {
            renewed: renewed.len(),
            lost: 0,
            held: renewal.held.len(),
        };
        for claim in renewal.lost {
            // A claim whose outcome is being written left the in-flight set first; only a claim
            // still running counts as lost.
            if shared.inflight.lose(&claim) {
                counts.lost += 1;
                shared.hook.emit(|| WorkerEvent::LeaseLost(claim));
            }
        }
        shared.counters.renewals(counts.renewed as u64);
        shared.counters.lease_lost(counts.lost as u64);
        if counts.renewed > 0 {
            shared.hook.emit(|| WorkerEvent::Renewed(counts.renewed));
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_lease_is_the_news_then_a_held_row_then_a_renewal() {
        let counts = |renewed, lost, held| RenewCounts {
            renewed,
            lost,
            held,
        };
        assert_eq!(counts(0, 0, 0).news(), RenewNews::Nothing);
        assert_eq!(counts(1, 0, 0).news(), RenewNews::Renewed);
        assert_eq!(counts(1, 0, 1).news(), RenewNews::Held);
        assert_eq!(counts(0, 0, 1).news(), RenewNews::Held);
        assert_eq!(counts(0, 1, 0).news(), RenewNews::Lost);
        assert_eq!(counts(5, 1, 2).news(), RenewNews::Lost);
    }

    #[test]
    fn the_next_check_is_the_earliest_lease_end_within_one_interval() {
        let now = Instant::now();
        let interval = Duration::from_secs(10);
        assert_eq!(next_check(now, None, interval), now + interval);
        let soon = now + Duration::from_secs(3);
        assert_eq!(next_check(now, Some(soon), interval), soon);
        let later = now + Duration::from_secs(25);
        assert_eq!(next_check(now, Some(later), interval), now + interval);
        // A lease that ends now is looked at now.
        assert_eq!(next_check(now, Some(now), interval), now);
    }
}

//! Keeps the leases of running deliveries alive: every renew interval, one fenced statement
//! extends all of this worker's in-flight claims. A claim the database no longer gives us was
//! lost (lease expired and recovered, or claimed elsewhere): its delivery is told through
//! `Delivery::lease_lost`.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::Shared;
use super::events::WorkerEvent;
use crate::error::Result;

/// What one renewal pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RenewCounts {
    pub(crate) renewed: usize,
    pub(crate) lost: usize,
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
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            match self.run_once().await {
                Ok(c) if c.lost > 0 => tracing::warn!(
                    worker = %self.shared.config.name,
                    renewed = c.renewed,
                    lost = c.lost,
                    "leases lost; the affected handlers were told to stop"
                ),
                Ok(c) if c.renewed > 0 => tracing::trace!(renewed = c.renewed, "leases renewed"),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "renewing leases failed; trying again next interval")
                }
            }
        }
    }

    pub(crate) async fn run_once(&self) -> Result<RenewCounts> {
        let shared = &self.shared;
        let claims = shared.inflight.claims();
        if claims.is_empty() {
            return Ok(RenewCounts::default());
        }
        let lost = shared
            .store
            .renew_many_if_owned(&claims, shared.config.lease)
            .await?;
        let mut counts = RenewCounts {
            renewed: claims.len() - lost.len(),
            lost: 0,
        };
        for claim in lost {
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

//! Advertises the worker in `outbox_workers`: its table, its name and the events it claims
//! ([`crate::Sink::handled_events`]), refreshed every maintenance interval, removed when the
//! worker stops claiming. What `outbox status`, the dashboard and the `outbox_unhandled_events`
//! gauge read to say that an event waits because no running worker handles it.
//!
//! Every worker advertises itself, leader or not, with maintenance on or off. A database whose
//! base schema predates `outbox_workers` (migration 0006) gets one warning and no heartbeats:
//! advertising is for operators, and never stops a worker from delivering.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Shared;
use crate::error::Error;

/// A heartbeat counts for this many intervals: a worker that missed two is still live.
const LIVE_FOR_INTERVALS: u32 = 3;

pub(crate) struct Roster {
    pub(crate) shared: Arc<Shared>,
}

impl Roster {
    /// Heartbeat until `stop` (the end of claiming), then leave.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let shared = &self.shared;
        let every = shared.config.maintenance_interval;
        let ttl = every * LIVE_FOR_INTERVALS;
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut advertised = false;
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            match self.heartbeat(ttl).await {
                Ok(()) => advertised = true,
                Err(e) if sqlstate(&e).as_deref() == Some("42P01") => {
                    tracing::warn!(worker = %shared.config.name, "the table outbox_workers does not exist, so this worker is not listed as live and `outbox status` cannot tell which events it handles: apply the base schema (outbox_runtime::migrate)");
                    return;
                }
                Err(e) if sqlstate(&e).as_deref() == Some("42501") => {
                    tracing::warn!(error = %e, worker = %shared.config.name, "this worker's role may not write outbox_workers, so it is not listed as live and `outbox status` cannot tell which events it handles: give it the grants `outbox grants` prints");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, worker = %shared.config.name, "the worker's heartbeat failed; trying again next interval")
                }
            }
        }
        if advertised && let Err(e) = shared.maintenance_store.leave(&shared.config.name).await {
            tracing::debug!(error = %e, worker = %shared.config.name, "leaving outbox_workers failed; the row expires on its own");
        }
    }

    async fn heartbeat(&self, ttl: Duration) -> crate::error::Result<()> {
        let shared = &self.shared;
        shared
            .maintenance_store
            .heartbeat(
                &shared.config.name,
                shared.handled.as_ref().map(|h| h.pairs()),
                ttl,
            )
            .await
    }
}

/// The SQLSTATE of a database error (42P01: no such table; 42501: not allowed).
fn sqlstate(error: &Error) -> Option<String> {
    match error {
        Error::Database(sqlx::Error::Database(db)) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

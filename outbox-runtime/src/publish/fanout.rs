//! [`FanOut`]: one [`Sink`] that delivers every event to several named sinks (a broker and a
//! webhook, say), for a worker that has one sink.
//!
//! An event counts as delivered only when every member accepted it. When one member fails, the
//! whole event is retried, and the members that had accepted it receive it again: each must
//! deduplicate by the event id (JetStream's duplicate window, an HTTP receiver's inbox), which
//! the publishers of this module arrange. The price of fanning out from one outbox row is that
//! a failing member delays the others; when destinations must progress independently, give
//! each its own outbox table and worker.

use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, join_all};

use crate::delivery::{Delivery, FailureKind, HandlerError};
use crate::sink::Sink;
use crate::store::ClaimedEvent;

/// Delivers each event to every member; see the [module docs](self).
#[derive(Clone, Default)]
pub struct FanOut {
    members: Vec<(String, Arc<dyn Sink>)>,
}

impl std::fmt::Debug for FanOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanOut")
            .field("members", &self.names())
            .finish()
    }
}

impl FanOut {
    /// A fan-out with no members (it accepts every event: add members with [`FanOut::to`]).
    pub fn new() -> FanOut {
        FanOut::default()
    }

    /// Add a member under `name` (used in failure reasons: `http: HTTP 503 ...`).
    pub fn to(mut self, name: impl Into<String>, sink: impl Sink) -> FanOut {
        self.members.push((name.into(), Arc::new(sink)));
        self
    }

    /// Add a shared member under `name`.
    pub fn to_shared(mut self, name: impl Into<String>, sink: Arc<dyn Sink>) -> FanOut {
        self.members.push((name.into(), sink));
        self
    }

    /// The members' names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.members.iter().map(|(n, _)| n.as_str()).collect()
    }
}

impl Sink for FanOut {
    /// What every member can deliver: a member that names its events (a dispatcher) limits
    /// the fan-out to them; publishers, which take any event, limit nothing.
    fn handled_events(&self) -> Option<crate::sink::HandledEvents> {
        self.members
            .iter()
            .filter_map(|(_, member)| member.handled_events())
            .reduce(|all, one| all.intersection(&one))
    }

    fn check_lease(&self, lease: std::time::Duration) -> crate::error::Result<()> {
        self.members
            .iter()
            .try_for_each(|(_, member)| member.check_lease(lease))
    }

    fn deliver<'a>(
        &'a self,
        event: &'a ClaimedEvent,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let results = join_all(
                self.members
                    .iter()
                    .map(|(_, sink)| sink.deliver(event, delivery)),
            )
            .await;
            combine(self.members.iter().map(|(n, _)| n.as_str()).zip(results))
        })
    }

    /// The largest batch of any member; each member gets the items in chunks of its own size.
    fn max_batch(&self) -> usize {
        self.members
            .iter()
            .map(|(_, s)| s.max_batch())
            .max()
            .unwrap_or(1)
            .max(1)
    }

    fn deliver_batch<'a>(
        &'a self,
        items: &'a [(ClaimedEvent, Delivery)],
    ) -> BoxFuture<'a, Vec<Result<(), HandlerError>>> {
        Box::pin(async move {
            let per_member = join_all(self.members.iter().map(|(_, sink)| async move {
                let mut results = Vec::with_capacity(items.len());
                for chunk in items.chunks(sink.max_batch().max(1)) {
                    let mut chunk_results = sink.deliver_batch(chunk).await;
                    // A sink that answers for fewer items than it was given leaves the rest
                    // undecided: retry them rather than guess.
                    chunk_results.resize_with(chunk.len(), || {
                        Err(HandlerError::retry(
                            "the sink returned no result for this event",
                        ))
                    });
                    results.extend(chunk_results);
                }
                results
            }))
            .await;
            (0..items.len())
                .map(|i| {
                    combine(
                        self.members
                            .iter()
                            .zip(&per_member)
                            .map(|((name, _), results)| (name.as_str(), results[i].clone())),
                    )
                })
                .collect()
        })
    }
}

/// All members accepted: delivered. Otherwise one error naming each member that failed: it is
/// permanent if any failure is (retrying cannot fix that member), else a retry after the longest
/// delay any member asked for.
fn combine<'n>(
    results: impl IntoIterator<Item = (&'n str, Result<(), HandlerError>)>,
) -> Result<(), HandlerError> {
    let mut accepted = Vec::new();
    let mut failures = Vec::new();
    let mut details = Vec::new();
    let mut permanent = false;
    let mut after: Option<Duration> = None;
    for (name, result) in results {
        match result {
            Ok(()) => accepted.push(name),
            Err(e) => {
                match e.kind {
                    FailureKind::Permanent => permanent = true,
                    FailureKind::Retry { after: Some(d) } => {
                        after = Some(after.map_or(d, |a| a.max(d)))
                    }
                    FailureKind::Retry { after: None } => {}
                }
                failures.push(format!("{name}: {}", e.message));
                if let Some(detail) = &e.detail {
                    details.push(format!("{name}: {detail}"));
                }
            }
        }
    }
    if failures.is_empty() {
        return Ok(());
    }
    let mut message = failures.join("; ");
    if !accepted.is_empty() {
        message.push_str(&format!(
            " (accepted by {}, which will see it again)",
            accepted.join(", ")
        ));
    }
    let failure = match (permanent, after) {
        (true, _) => HandlerError::permanent(message),
        (false, Some(d)) => HandlerError::retry_after(message, d),
        (false, None) => HandlerError::retry(message),
    };
    Err(if details.is_empty() {
        failure
    } else {
        failure.with_detail(details.join("; "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_member_must_accept() {
        assert_eq!(combine([("a", Ok(())), ("b", Ok(()))]), Ok(()));
        let e = combine([
            ("nats", Ok(())),
            ("http", Err(HandlerError::retry("HTTP 503"))),
        ])
        .unwrap_err();
        assert_eq!(
            e,
            HandlerError::retry("http: HTTP 503 (accepted by nats, which will see it again)")
        );
    }

    #[test]
    fn a_permanent_failure_wins_and_the_longest_delay_is_kept() {
        let slow = HandlerError::retry_after("slow", Duration::from_secs(9));
        let fast = HandlerError::retry_after("fast", Duration::from_secs(2));
        let e = combine([("a", Err(fast.clone())), ("b", Err(slow.clone()))]).unwrap_err();
        assert_eq!(
            e.kind,
            FailureKind::Retry {
                after: Some(Duration::from_secs(9))
            }
        );
        let e =
            combine([("a", Err(fast)), ("b", Err(HandlerError::permanent("bad")))]).unwrap_err();
        assert!(e.is_permanent());
        assert_eq!(e.message, "a: fast; b: bad");
    }
}

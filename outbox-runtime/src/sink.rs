//! Where a worker sends claimed events: the [`crate::Dispatcher`] (typed handlers), a broker
//! publisher, an HTTP publisher, or anything else implementing [`Sink`].

use futures::future::BoxFuture;

use crate::delivery::{Delivery, HandlerError};
use crate::store::ClaimedEvent;

/// A destination for claimed events. The worker calls it with no transaction open.
pub trait Sink: Send + Sync + 'static {
    /// Deliver one event. `Ok` means the receiver accepted it and the event may be completed.
    fn deliver<'a>(
        &'a self,
        event: &'a ClaimedEvent,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;

    /// Check the sink's own timeouts against the worker's `lease`, at [`crate::worker::Worker::start`]:
    /// a receiver call that can outlast the lease lets another worker deliver the same event
    /// while the first call is still running. The default accepts any lease; publishers with
    /// a request or acknowledgement timeout refuse one that is not shorter than the lease.
    fn check_lease(&self, lease: std::time::Duration) -> crate::error::Result<()> {
        let _ = lease;
        Ok(())
    }

    /// The stored events this sink can deliver, or `None` (the default) when it takes any event
    /// (a publisher forwards every type and version).
    ///
    /// A worker claims only the events named here: an event of another type or version is
    /// left pending for a worker that handles it, never charged an attempt and never exhausted
    /// for it (see `docs/rolling-deploys.md`). The [`crate::Dispatcher`] names every (name,
    /// version) it has a route for, upcasts included.
    fn handled_events(&self) -> Option<HandledEvents> {
        None
    }

    /// The largest batch [`Sink::deliver_batch`] accepts; 1 (the default) means no batch API.
    fn max_batch(&self) -> usize {
        1
    }

    /// Deliver several events in one call to a receiver's batch API. Returns one result per
    /// item, in order: only the items the receiver accepted count as delivered.
    ///
    /// A worker calls this instead of [`Sink::deliver`] when [`Sink::max_batch`] is above 1,
    /// with chunks of at most that many claimed events. Each item's result is applied on its
    /// own (completed, retried or exhausted). Items without a result (a vector shorter than the
    /// input) are retried; extra results are ignored. A panic fails every item of the chunk as
    /// retryable, not permanently: it cannot be pinned on one item, and the attempts charged at
    /// claim time still bound how often a poison item takes its batch down.
    fn deliver_batch<'a>(
        &'a self,
        items: &'a [(ClaimedEvent, Delivery)],
    ) -> BoxFuture<'a, Vec<Result<(), HandlerError>>> {
        Box::pin(async move {
            let mut results = Vec::with_capacity(items.len());
            for (event, delivery) in items {
                results.push(self.deliver(event, delivery).await);
            }
            results
        })
    }
}

/// A shared sink is a sink: one `Arc<dyn Sink>` (or `Arc<MySink>`) can feed several workers.
impl<S: Sink + ?Sized> Sink for std::sync::Arc<S> {
    fn deliver<'a>(
        &'a self,
        event: &'a ClaimedEvent,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        (**self).deliver(event, delivery)
    }

    fn check_lease(&self, lease: std::time::Duration) -> crate::error::Result<()> {
        (**self).check_lease(lease)
    }

    fn handled_events(&self) -> Option<HandledEvents> {
        (**self).handled_events()
    }

    fn max_batch(&self) -> usize {
        (**self).max_batch()
    }

    fn deliver_batch<'a>(
        &'a self,
        items: &'a [(ClaimedEvent, Delivery)],
    ) -> BoxFuture<'a, Vec<Result<(), HandlerError>>> {
        (**self).deliver_batch(items)
    }
}

/// The stored (event name, version) pairs a sink can deliver ([`Sink::handled_events`]): what
/// a worker claims, and what it advertises as handled to `outbox status` and the dashboard.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HandledEvents {
    /// Sorted and without duplicates.
    pairs: Vec<(String, u32)>,
}

impl HandledEvents {
    /// The given (name, version) pairs, in any order, duplicates allowed.
    pub fn new<N: Into<String>>(pairs: impl IntoIterator<Item = (N, u32)>) -> Self {
        let mut pairs: Vec<(String, u32)> = pairs.into_iter().map(|(n, v)| (n.into(), v)).collect();
        pairs.sort();
        pairs.dedup();
        HandledEvents { pairs }
    }

    /// Every (name, version), sorted.
    pub fn pairs(&self) -> &[(String, u32)] {
        &self.pairs
    }

    /// Whether the stored (name, version) is handled.
    pub fn contains(&self, name: &str, version: u32) -> bool {
        self.pairs
            .binary_search_by(|(n, v)| (n.as_str(), *v).cmp(&(name, version)))
            .is_ok()
    }

    /// Whether nothing at all is handled.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The pairs both sets handle (a fan-out delivers an event only when every member can).
    pub fn intersection(&self, other: &HandledEvents) -> HandledEvents {
        HandledEvents {
            pairs: self
                .pairs
                .iter()
                .filter(|(n, v)| other.contains(n, *v))
                .cloned()
                .collect(),
        }
    }
}

impl std::fmt::Display for HandledEvents {
    /// `order.placed v1, order.placed v2, invoice.sent v1`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (name, version)) in self.pairs.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{} v{version}", crate::contract::shown(name))?;
        }
        Ok(())
    }
}

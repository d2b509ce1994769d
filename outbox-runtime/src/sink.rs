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

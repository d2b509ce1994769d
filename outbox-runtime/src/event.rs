//! What an event type is: a named, versioned payload contract that can only be written inside a
//! database transaction.
//!
//! Implemented by `#[derive(Event)]`; see the crate README for the attributes.

use crate::contract::Contract;
use crate::store::EnqueueOptions;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

/// A versioned event payload. Implemented by `#[derive(Event)]`.
///
/// An older version of an event is a separate type whose [`Event::Current`] is the newest type
/// and whose [`Event::into_current`] upcasts through `From` impls, so handlers only ever see the
/// current type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an outbox event",
    label = "not an event",
    note = "an event is a struct with `#[derive(Serialize, Deserialize, JsonSchema, Event)]` and `#[outbox(version = N)]`"
)]
pub trait Event: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// Stable event name stored in `event_type` (for example `order_confirmed`).
    const NAME: &'static str;
    /// Payload version, >= 1, stored in `event_version`.
    const VERSION: u32;
    /// The outbox table this event is written to (validated as a safe SQL identifier).
    const TABLE: &'static str;
    /// Aggregate type stored with each event when the type has an aggregate id field.
    const AGGREGATE_TYPE: Option<&'static str>;

    /// The newest version of this event; `Self` for the current version.
    type Current: Event;

    /// Upcast this payload to the current version (identity for the current version).
    fn into_current(self) -> Self::Current;

    /// The aggregate id of this event, when one field is marked `#[outbox(aggregate_id)]`.
    fn aggregate_id(&self) -> Option<String>;

    /// The aggregate version, when one field is marked `#[outbox(aggregate_version)]`.
    fn aggregate_version(&self) -> Option<i64>;

    /// The contract (name, version, shape) of this payload.
    fn contract() -> Contract;

    /// Write this event inside `tx`, under `operation_key`, and return its event id.
    ///
    /// Only a transaction is accepted, so the event commits or rolls back with the business
    /// change. Reusing a key with the same payload returns the existing id and writes nothing;
    /// with a different payload it returns [`crate::Error::OperationKeyReused`] and leaves `tx`
    /// usable.
    ///
    /// Only the current version can be enqueued ([`CurrentEvent`]): new events are
    /// written in the newest shape, and older types exist to decode what is already stored.
    /// (`store::enqueue::enqueue_event` writes any version, for tests and backfills.)
    fn enqueue<'t>(
        &self,
        tx: &mut Transaction<'t, Postgres>,
        operation_key: &str,
    ) -> impl std::future::Future<Output = crate::error::Result<Uuid>> + Send
    where
        Self: Sized + CurrentEvent,
    {
        async move { enqueue_typed(tx, self, operation_key, &EnqueueOptions::default()).await }
    }

    /// [`Event::enqueue`] with explicit options (wake-up notification, limits, delay).
    fn enqueue_with<'t>(
        &self,
        tx: &mut Transaction<'t, Postgres>,
        operation_key: &str,
        options: &EnqueueOptions,
    ) -> impl std::future::Future<Output = crate::error::Result<Uuid>> + Send
    where
        Self: Sized + CurrentEvent,
    {
        async move { enqueue_typed(tx, self, operation_key, options).await }
    }
}

/// The typed enqueue behind every public path ([`Event::enqueue`], [`Event::enqueue_with`],
/// and [`crate::producer::ProducerTransaction`]'s): the current trace context is added to the
/// headers here, then the store writes what it is given. One function, so that no path
/// forgets the capture (the producer's once did, and each of its events started a new trace).
pub(crate) async fn enqueue_typed<E: CurrentEvent>(
    tx: &mut Transaction<'_, Postgres>,
    event: &E,
    operation_key: &str,
    options: &EnqueueOptions,
) -> crate::error::Result<Uuid> {
    let traced = with_trace_context(options);
    let options = traced.as_ref().unwrap_or(options);
    crate::store::enqueue::enqueue_event(tx, event, operation_key, options).await
}

/// `options` with the current trace context added to its headers (feature `opentelemetry`,
/// see `trace_context`), or `None` when there is nothing to add. Captured here, in the typed
/// enqueue API: the store only writes the headers it is given.
#[cfg(feature = "opentelemetry")]
fn with_trace_context(options: &EnqueueOptions) -> Option<EnqueueOptions> {
    let headers = crate::trace_context::capture(options.headers.as_ref(), options.trace_baggage)?;
    Some(EnqueueOptions {
        headers: Some(headers),
        ..options.clone()
    })
}

/// Without the `opentelemetry` feature nothing is captured.
#[cfg(not(feature = "opentelemetry"))]
fn with_trace_context(_options: &EnqueueOptions) -> Option<EnqueueOptions> {
    None
}

/// The current version of an event: every [`Event`] whose `Current` is itself (with
/// `#[derive(Event)]`, a type without `upcast`). Only current versions are enqueued and handled;
/// older versions are read from the table and upcast to it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not the current version of an event",
    label = "only the current version of an event is enqueued or handled",
    note = "the current version is the type with `#[derive(Event)]` and no `upcast`; stored older versions are upcast to it when they are read"
)]
pub trait CurrentEvent: Event<Current = Self> {}

impl<E: Event<Current = E>> CurrentEvent for E {}

//! # outbox-runtime
//!
//! The transactional outbox for PostgreSQL. A service writes its business change and an event in
//! one transaction ([`Event::enqueue`] only accepts a `sqlx::Transaction`); workers claim committed
//! events with `FOR UPDATE SKIP LOCKED`, own them through persistent leases fenced by a
//! `claim_version`, and deliver them at least once.
//!
//! ```no_run
//! use outbox_runtime::worker::Worker;
//! use outbox_runtime::{Delivery, Dispatcher, Event, HandlerError, handler};
//! use serde::{Deserialize, Serialize};
//!
//! /// A named, versioned contract: its JSON Schema is the shape the version stands for.
//! #[derive(Serialize, Deserialize, schemars::JsonSchema, Event)]
//! #[outbox(name = "order.confirmed", version = 1)]
//! pub struct OrderConfirmed {
//!     #[outbox(aggregate_id)]
//!     pub order_id: uuid::Uuid,
//!     pub total_cents: i64,
//! }
//!
//! /// Runs at least once per event, with no transaction open: deduplicate on the event id.
//! #[handler]
//! async fn on_order_confirmed(event: OrderConfirmed, ctx: Delivery) -> Result<(), HandlerError> {
//!     println!("order {} confirmed ({})", event.order_id, ctx.event_id());
//!     Ok(())
//! }
//!
//! # async fn service(pool: sqlx::PgPool, order_id: uuid::Uuid) -> outbox_runtime::error::Result<()> {
//! outbox_runtime::migrate(&pool).await?; // the base schema: outbox table, contract registry, inbox
//!
//! // The business change and the event commit together, or not at all.
//! let mut tx = pool.begin().await?;
//! // ... UPDATE orders SET status = 'confirmed' WHERE id = $1 ...
//! let event = OrderConfirmed { order_id, total_cents: 4200 };
//! event.enqueue(&mut tx, &format!("confirm-order/{order_id}")).await?;
//! tx.commit().await?;
//!
//! // A worker delivers committed events to their handlers (or to NATS, HTTP: any `Sink`).
//! let dispatcher = Dispatcher::builder().handler(on_order_confirmed).build()?;
//! let worker = Worker::builder(pool, dispatcher).start().await?;
//! // ... until shutdown:
//! worker.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Limits worth knowing before the first event: an operation key is 1 to
//! [`store::enqueue::MAX_OPERATION_KEY_BYTES`] bytes; a payload is at most 256 KiB
//! ([`store::EnqueueOptions::max_payload_bytes`]) and nests at most
//! [`payload_limits::MAX_JSON_DEPTH`] levels. The first enqueue of each event type in a process
//! checks its contract against the database's registry and refuses a payload that changed shape
//! without a version bump.
//!
//! ## Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `macros` | yes | `#[derive(Event)]`, `#[handler]` and `#[catalogue]`, re-exported from `outbox-macros` |
//! | `cli` | yes | [`cli`]: the `outbox` command (migrate, generate and check migrations, status, retry, purge, grants) to embed in a binary of your service |
//! | `nats` | no | `publish::nats`: a NATS JetStream publisher |
//! | `http` | no | `publish::http`: an HTTP publisher (single and batch) |
//! | `amqp` | no | `publish::amqp`: a RabbitMQ publisher with publisher confirms |
//! | `kafka` | no | `publish::kafka`: a Kafka publisher (`acks=all`, keyed by aggregate) |
//! | `dashboard` | no | `dashboard`: the operator dashboard (`outbox dashboard`, or an axum router to mount) |
//! | `opentelemetry` | no | `trace_context`: W3C trace context from the enqueuing span to the consumer |
//! | `testing` | no | `testing`: a fresh database per test on a real PostgreSQL, assertions, synchronous draining, fault injection and the idempotency check, for your tests (not for production code) |
//!
//! ## Modules
//!
//! One job each:
//! - [`store`]: every SQL statement against the outbox table, each fenced where it must be.
//! - [`event`] and [`contract`]: what an event type is, its versions and its payload shape.
//! - [`delivery`] and [`dispatcher`]: routing a claimed row to the handler of its current type.
//! - [`worker`]: claimer, renewer, completer, maintenance and listener, supervised together.
//! - [`publish`]: sinks that hand events to a broker or a receiver, and fan-out.
//! - [`producer`]: transactions that enqueue without an in-transaction NOTIFY and wake the
//!   workers after their own commit (the fast path).
//! - [`waker`]: wake-ups sent after commit, for services that enqueue at high rates.
//! - [`inbox`]: apply each event once on the consumer's side.
//! - [`generate`]: migrations and the contract lock, generated from the event definitions.
//! - [`relay`]: delivery from the write-ahead log through a logical slot (first slice: the
//!   `pgoutput` decoder; docs/relay.md).
//! - `trace_context` (feature `opentelemetry`): W3C trace context from the enqueuing span,
//!   through the worker's delivery span and the publishers, to the consumer.
//! - [`migrate()`]: the embedded base schema.
//! - `testing` (feature `testing`): a database per test, assertions on what was enqueued,
//!   synchronous draining, seeded fault injection and an idempotency check for handlers.
#![warn(missing_docs)]

#[cfg(feature = "cli")]
pub mod cli;
pub mod contract;
#[cfg(feature = "dashboard")]
pub mod dashboard;
pub mod delivery;
pub mod dispatcher;
pub mod error;
pub mod event;
// Fuzz targets: the crate's own property tests run them; the `fuzz/` crate enables `fuzzing`.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzz_targets;
pub mod generate;
mod held_session;
pub mod inbox;
mod macro_support;
pub mod migrate;
pub mod payload_limits;
pub mod producer;
pub mod publish;
pub mod relay;
pub mod sink;
pub mod store;
#[cfg(feature = "opentelemetry")]
pub mod trace_context;
pub mod waker;
pub mod worker;

#[cfg(feature = "testing")]
pub mod testing;

pub use delivery::{Delivery, HandlerError};
pub use dispatcher::Dispatcher;
pub use error::Error;
pub use event::Event;
pub use migrate::migrate;
pub use producer::Producer;
pub use sink::Sink;
pub use store::{EventStatus, Store};

#[cfg(feature = "macros")]
pub use outbox_macros::*;

/// Support for code generated by `outbox-macros`. Not public API: it may change in any release.
#[doc(hidden)]
pub mod __private {
    pub use ::inventory;
    pub use ::schemars;
    pub use ::serde;
    pub use ::serde_json;
    pub use ::sqlx;
    pub use ::uuid;
    // Helpers of `#[derive(Event)]`, `#[handler]` and `#[catalogue]` (see macro_support.rs).
    pub use crate::macro_support::*;
}

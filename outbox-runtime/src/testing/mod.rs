//! The test kit (feature `testing`): what a service needs to test its use of the outbox against
//! a real PostgreSQL, and to prove its handlers survive at-least-once delivery.
//!
//! One job a module:
//! - [`database`]: [`TestDatabase`], a fresh database per test (any pool works with the rest of
//!   the kit, `#[sqlx::test]` pools included);
//! - [`assertions`]: [`enqueued`], [`assert_enqueued`], [`assert_not_enqueued`]: what a
//!   transaction or a service wrote, decoded with the event's own contract;
//! - [`drain`](mod@drain): [`drain()`](drain::drain), [`deliver_one`] and [`Drain`]: deliver what is ready
//!   in the calling task, through the store's own claim, complete and fail statements, and report
//!   each delivery;
//! - [`faults`]: [`Faults`], a seeded plan of duplicates, failures, lost responses, lost leases,
//!   panics, delays and reordering, applied to any [`Sink`](crate::Sink) by the drain;
//! - [`idempotency`]: [`check_idempotent`], which redelivers every event under duplicates, a lost
//!   response and a lost lease and fails with the first redelivery that changed the service's
//!   observed state.
//!
//! Nothing here keeps global state besides the test server's address: every function works on
//! the pool it is given, so tests run in parallel. See `docs/testing.md`.

pub mod assertions;
pub mod database;
pub mod drain;
pub mod faults;
pub mod idempotency;

pub use assertions::{EventMeta, assert_enqueued, assert_not_enqueued, enqueued};
pub use database::{TestDatabase, server_options};
pub use drain::{DeliveryRecord, Drain, DrainReport, Outcome, deliver_one, drain};
pub use faults::{Failure, Faults, Faulty, Injected, Pick};
pub use idempotency::{IdempotencyError, IdempotencyReport, TestEvent, check_idempotent};

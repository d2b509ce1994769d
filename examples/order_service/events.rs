//! The events of the order service.
//!
//! These definitions are the source of truth for the service's outbox migration: the
//! `outbox migrations generate` command reads them (it includes this file) and writes
//! `examples/order_service/migrations/` with the table and the contract registry rows. Change a
//! payload, bump its `version`, generate, commit.
//!
//! This file only names external crates, so it can be included by more than one binary.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A customer confirmed an order: the order is now binding at this price. Written in the same
/// transaction as the order's status change, so there is no confirmed order without this event
/// and no event without the confirmed order.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, outbox_runtime::Event,
)]
#[outbox(name = "order.confirmed", version = 1)]
pub struct OrderConfirmed {
    /// The order (the aggregate: its events are delivered in order when the worker is ordered).
    #[outbox(aggregate_id)]
    pub order_id: Uuid,
    /// The order's version after the confirmation; consumers can ignore anything older.
    #[outbox(aggregate_version)]
    pub order_version: i64,
    /// Who ordered.
    pub customer: String,
    /// The confirmed total, in cents.
    pub total_cents: i64,
}

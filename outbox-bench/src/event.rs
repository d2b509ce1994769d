//! The one event type every workload writes, through the derive's typed enqueue.

use outbox_runtime::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An order was paid: the payload is `{"order_id": i}` (the small payload of the peer harness),
/// plus an optional `pad` string when `--payload-bytes` asks for a bigger payload.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "bench.order_paid", version = 1)]
pub struct OrderPaid {
    /// The order whose transaction wrote this event; the latency workload keys its clocks on it.
    pub order_id: i64,
    /// Filler that makes the serialized payload about `--payload-bytes` long (absent when empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pad: String,
}

/// Builds payloads of the size asked for on the command line.
#[derive(Debug, Clone)]
pub struct PayloadShape {
    pad: String,
}

impl PayloadShape {
    /// Payloads of about `bytes` serialized bytes; 0 (or anything below the bare
    /// `{"order_id":i}`) gives the bare payload.
    pub fn new(bytes: usize) -> Self {
        // `{"order_id":12345,"pad":""}` is about 27 bytes before the padding itself.
        let pad = bytes.saturating_sub(27);
        PayloadShape {
            pad: "x".repeat(pad),
        }
    }

    /// The event of order `order_id`.
    pub fn event(&self, order_id: i64) -> OrderPaid {
        OrderPaid {
            order_id,
            pad: self.pad.clone(),
        }
    }

    /// The same payload as JSON, for the hand-written inserts.
    pub fn json(&self, order_id: i64) -> serde_json::Value {
        serde_json::to_value(self.event(order_id))
            .expect("a struct of an integer and a string serializes")
    }
}

/// The order id in a delivered payload (`None` for anything that is not ours).
pub fn order_id_of(payload: &serde_json::Value) -> Option<i64> {
    payload.get("order_id").and_then(serde_json::Value::as_i64)
}

/// A step of an order: the ordered workload's event (and the enqueue variants that take the
/// per-aggregate producer lock). Its aggregate is the order, so an ordered worker delivers one
/// order's steps one at a time, in commit order.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "bench.order_step", version = 1, aggregate = "order")]
pub struct OrderStep {
    /// The order (the aggregate).
    #[outbox(aggregate_id)]
    pub order_id: i64,
    /// The step's place in its order (the aggregate version).
    #[outbox(aggregate_version)]
    pub step: i64,
}

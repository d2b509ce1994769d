use outbox_runtime::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "order.confirmed", version = 1, aggregate = "Order Items")]
pub struct OrderConfirmed {
    #[outbox(aggregate_id)]
    pub order_id: u64,
}

fn main() {}

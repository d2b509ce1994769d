use outbox_runtime::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "order.confirmed", version = 1, name = "order.placed")]
pub struct OrderConfirmed {
    pub order_id: u64,
}

fn main() {}

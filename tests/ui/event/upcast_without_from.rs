use outbox_runtime::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "order.confirmed", version = 2)]
pub struct OrderConfirmed {
    pub order_id: u64,
    pub currency: String,
}

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1, upcast = OrderConfirmed)]
pub struct OrderConfirmedV1 {
    pub order_id: u64,
}

fn main() {}

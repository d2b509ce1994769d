use outbox_runtime::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "order.confirmed", version = 1)]
pub struct OrderConfirmed {
    pub order_id: u64,
}

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 2, upcast = OrderConfirmed)]
pub struct OrderConfirmedV2 {
    pub order_id: u64,
}

impl From<OrderConfirmedV2> for OrderConfirmed {
    fn from(v: OrderConfirmedV2) -> Self {
        OrderConfirmed { order_id: v.order_id }
    }
}

fn main() {}

use outbox_runtime::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "order.shipped", version = 2)]
pub struct OrderShipped {
    pub order_id: u64,
}

// An upcast stays within one event: this names another event.
#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "order.confirmed", version = 1, upcast = OrderShipped)]
pub struct OrderConfirmedV1 {
    pub order_id: u64,
}

impl From<OrderConfirmedV1> for OrderShipped {
    fn from(v: OrderConfirmedV1) -> Self {
        OrderShipped { order_id: v.order_id }
    }
}

fn main() {}

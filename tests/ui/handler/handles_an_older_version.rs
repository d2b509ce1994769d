use outbox_runtime::{Delivery, Event, HandlerError, handler};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 2)]
pub struct OrderConfirmed {
    pub order_id: u64,
}

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1, upcast = OrderConfirmed)]
pub struct OrderConfirmedV1 {
    pub order_id: u64,
}

impl From<OrderConfirmedV1> for OrderConfirmed {
    fn from(v: OrderConfirmedV1) -> Self {
        OrderConfirmed { order_id: v.order_id }
    }
}

// Handlers take the current version; stored v1 payloads are upcast before they arrive.
#[handler]
async fn on_order_confirmed(event: OrderConfirmedV1, ctx: Delivery) -> Result<(), HandlerError> {
    let _ = (event, ctx);
    Ok(())
}

fn main() {}

use outbox_runtime::{Delivery, Event, HandlerError, handler};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1)]
pub struct OrderConfirmed {
    pub order_id: u64,
}

#[handler]
fn on_order_confirmed(event: OrderConfirmed, ctx: Delivery) -> Result<(), HandlerError> {
    let _ = (event, ctx);
    Ok(())
}

fn main() {}

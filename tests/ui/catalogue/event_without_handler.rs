use outbox_runtime::{Delivery, HandlerError, catalogue};

#[catalogue]
pub mod events {
    use outbox_runtime::Event;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(name = "order.confirmed", version = 1)]
    pub struct OrderConfirmed {
        pub order_id: u64,
    }

    #[derive(Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(name = "order.shipped", version = 1)]
    pub struct OrderShipped {
        pub order_id: u64,
    }
}

struct Service;

// `order_shipped` was added to the catalogue but nobody handles it yet.
impl events::EventsHandler for Service {
    async fn order_confirmed(&self, event: events::OrderConfirmed, ctx: Delivery) -> Result<(), HandlerError> {
        let _ = (event, ctx);
        Ok(())
    }
}

fn main() {}

use outbox_runtime::catalogue;

#[catalogue]
pub mod events {
    use outbox_runtime::Event;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(name = "order.confirmed", version = 1)]
    pub struct OrderConfirmedV1 {
        pub order_id: u64,
    }

    // Version 2 was added, but version 1 still claims to be current.
    #[derive(Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(name = "order.confirmed", version = 2)]
    pub struct OrderConfirmed {
        pub order_id: u64,
        pub currency: String,
    }
}

fn main() {}

use outbox_runtime::catalogue;

#[catalogue]
pub mod events {
    use outbox_runtime::Event;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(name = "order.confirmed", version = 3)]
    pub struct OrderConfirmed {
        pub order_id: u64,
    }

    // Rows stored as version 2 would have nothing to decode into.
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
}

fn main() {}

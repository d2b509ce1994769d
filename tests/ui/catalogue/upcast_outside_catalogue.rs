use outbox_runtime::catalogue;

#[catalogue]
pub mod events {
    use outbox_runtime::Event;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(version = 1, upcast = super::OrderConfirmed)]
    pub struct OrderConfirmedV1 {
        pub order_id: u64,
    }

    impl From<OrderConfirmedV1> for super::OrderConfirmed {
        fn from(v: OrderConfirmedV1) -> Self {
            super::OrderConfirmed { order_id: v.order_id }
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, outbox_runtime::Event)]
#[outbox(name = "order.confirmed", version = 2)]
pub struct OrderConfirmed {
    pub order_id: u64,
}

fn main() {}

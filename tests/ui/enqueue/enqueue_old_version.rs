use outbox_runtime::Event;
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

// Only the current version is written; older types exist to read what is stored.
async fn confirm(pool: sqlx::PgPool) {
    let mut tx = pool.begin().await.unwrap();
    let _ = OrderConfirmedV1 { order_id: 1 }.enqueue(&mut tx, "confirm-1").await;
}

fn main() {}

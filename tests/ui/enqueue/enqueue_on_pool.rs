use outbox_runtime::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1)]
pub struct OrderConfirmed {
    pub order_id: u64,
}

// A pool cannot enqueue: the event must commit with the business change.
async fn confirm(pool: sqlx::PgPool) {
    let _ = OrderConfirmed { order_id: 1 }.enqueue(&pool, "confirm-1").await;
}

fn main() {}

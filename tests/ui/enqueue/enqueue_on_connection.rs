use outbox_runtime::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1)]
pub struct OrderConfirmed {
    pub order_id: u64,
}

// A bare connection cannot enqueue either (it would commit on its own).
async fn confirm(pool: sqlx::PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let _ = OrderConfirmed { order_id: 1 }.enqueue(&mut *conn, "confirm-1").await;
}

fn main() {}

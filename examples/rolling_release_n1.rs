//! Release N+1 of the rolling-deploy example: `rolling.order_placed` gains version 2 (a new
//! field), and version 1 upcasts to it, so its workers handle both versions; its producers
//! write version 2. Deployed after release N following `docs/rolling-deploys.md`: workers of N
//! leave version 2 pending (they have no handler for it) until these workers run.
//!
//! ```text
//! DATABASE_URL=postgres://... cargo run --example rolling_release_n1 -- --name w1 --mode worker
//! ```

#[path = "rolling_deploy/shared.rs"]
mod shared;

use outbox_runtime::{Delivery, Dispatcher, Event};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Version 1, as release N wrote it: read and upcast to version 2.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "rolling.order_placed", version = 1, aggregate = "order", upcast = OrderPlaced)]
struct OrderPlacedV1 {
    #[outbox(aggregate_id)]
    order: String,
    seq: i64,
}

/// Version 2, the current version of this release.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "rolling.order_placed", version = 2, aggregate = "order")]
struct OrderPlaced {
    #[outbox(aggregate_id)]
    order: String,
    seq: i64,
    channel: String,
}

impl From<OrderPlacedV1> for OrderPlaced {
    fn from(v1: OrderPlacedV1) -> Self {
        OrderPlaced {
            order: v1.order,
            seq: v1.seq,
            channel: "unknown".to_owned(),
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    shared::main(
        "n1",
        |recorder| {
            Dispatcher::builder()
                .handler(move |_event: OrderPlaced, ctx: Delivery| {
                    let recorder = recorder.clone();
                    async move { recorder.record(&ctx).await }
                })
                .build()
                .expect("one handler, version 1 upcast")
        },
        |pool, order, seq| async move {
            let mut tx = pool.begin().await?;
            let key = format!("{order}-{seq}-{}", uuid::Uuid::new_v4());
            OrderPlaced {
                order,
                seq,
                channel: "web".to_owned(),
            }
            .enqueue(&mut tx, &key)
            .await?;
            tx.commit().await?;
            Ok(())
        },
    )
    .await
}

//! Release N of the rolling-deploy example: `rolling.order_placed` exists in version 1 only.
//! Its workers handle version 1; its producers write version 1. See
//! `examples/rolling_release_n1.rs` (release N+1), `tests/rolling_deploy.rs` and
//! `docs/rolling-deploys.md`.
//!
//! ```text
//! DATABASE_URL=postgres://... cargo run --example rolling_release_n -- --name w1 --mode worker
//! ```

#[path = "rolling_deploy/shared.rs"]
mod shared;

use outbox_runtime::{Delivery, Dispatcher, Event};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Version 1, the current version of this release.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "rolling.order_placed", version = 1, aggregate = "order")]
struct OrderPlaced {
    #[outbox(aggregate_id)]
    order: String,
    seq: i64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    shared::main(
        "n",
        |recorder| {
            Dispatcher::builder()
                .handler(move |_event: OrderPlaced, ctx: Delivery| {
                    let recorder = recorder.clone();
                    async move { recorder.record(&ctx).await }
                })
                .build()
                .expect("one handler")
        },
        |pool, order, seq| async move {
            let mut tx = pool.begin().await?;
            let key = format!("{order}-{seq}-{}", uuid::Uuid::new_v4());
            OrderPlaced { order, seq }.enqueue(&mut tx, &key).await?;
            tx.commit().await?;
            Ok(())
        },
    )
    .await
}

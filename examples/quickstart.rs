//! Quickstart: an event written in the same transaction as the business change, and a handler
//! that receives it.
//!
//! ```text
//! cargo run --example quickstart                      # a throwaway database on the local server
//! DATABASE_URL=postgres://... cargo run --example quickstart
//! ```

use std::time::Duration;

use outbox_runtime::testing::TestDatabase;
use outbox_runtime::{Delivery, Dispatcher, Event, HandlerError, Sink, Store, handler};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The event: a named, versioned contract (its JSON Schema is the shape).
#[derive(Debug, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "order.confirmed", version = 1)]
pub struct OrderConfirmed {
    #[outbox(aggregate_id)]
    pub order_id: Uuid,
    pub total_cents: i64,
}

/// The handler: runs at least once per event, with no database transaction open.
#[handler]
async fn on_order_confirmed(event: OrderConfirmed, ctx: Delivery) -> Result<(), HandlerError> {
    println!(
        "handled {} (attempt {}): order {} confirmed for {} cents",
        ctx.event_id(),
        ctx.attempt(),
        event.order_id,
        event.total_cents
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // DATABASE_URL when set, else a fresh database; both get the outbox schema.
    let _test_db;
    let pool = match std::env::var("DATABASE_URL") {
        Ok(url) => sqlx::PgPool::connect(&url).await?,
        Err(_) => {
            _test_db = TestDatabase::new().await;
            _test_db.pool().clone()
        }
    };
    outbox_runtime::migrate(&pool).await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS orders (id uuid PRIMARY KEY, status text NOT NULL)")
        .execute(&pool)
        .await?;

    // 1. The business change and the event commit together, or not at all.
    let order_id = Uuid::new_v4();
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO orders (id, status) VALUES ($1, 'confirmed')")
        .bind(order_id)
        .execute(&mut *tx)
        .await?;
    let event = OrderConfirmed {
        order_id,
        total_cents: 4200,
    };
    let event_id = event
        .enqueue(&mut tx, &format!("confirm-order/{order_id}"))
        .await?;
    tx.commit().await?;
    println!("enqueued {event_id} with order {order_id}");

    // 2. Claim committed events, deliver each through the dispatcher, record the outcome.
    let store = Store::new(pool.clone());
    let dispatcher = Dispatcher::builder().handler(on_order_confirmed).build()?;
    for claimed in store
        .claim_batch("quickstart", 10, Duration::from_secs(30), false)
        .await?
    {
        let delivery = Delivery::new(&claimed, CancellationToken::new());
        match dispatcher.deliver(&claimed, &delivery).await {
            Ok(()) => println!(
                "completed: {:?}",
                store.complete_if_owned(claimed.claim()).await?
            ),
            Err(err) => {
                let retry_in = Duration::from_secs(5);
                let outcome = store
                    .fail_if_owned(claimed.claim(), &err.message, retry_in, err.is_permanent())
                    .await?;
                println!("failed ({err}): {outcome:?}");
            }
        }
    }
    let stats = store.stats().await?;
    println!(
        "outbox now: {} pending, {} delivered, {} exhausted",
        stats.pending, stats.delivered, stats.exhausted
    );
    Ok(())
}

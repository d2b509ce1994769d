//! Quickstart: an event written in the same transaction as the business change, and a handler
//! that receives it.
//!
//! ```text
//! cargo run --example quickstart                      # a throwaway database on the local server
//! DATABASE_URL=postgres://... cargo run --example quickstart
//! ```

use std::time::Duration;

use outbox_runtime::testing::TestDatabase;
use outbox_runtime::worker::Worker;
use outbox_runtime::{Delivery, Dispatcher, Event, HandlerError, Store, handler};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
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

    // 2. A worker claims committed events and delivers each to its handler, at least once.
    let dispatcher = Dispatcher::builder().handler(on_order_confirmed).build()?;
    let worker = Worker::builder(pool.clone(), dispatcher)
        .concurrency(8)
        .lease(Duration::from_secs(30))
        .start()
        .await?;
    let store = Store::new(pool.clone());
    while store.stats().await?.delivered < 1 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.shutdown().await;

    let stats = store.stats().await?;
    println!(
        "outbox now: {} pending, {} delivered, {} exhausted",
        stats.pending, stats.delivered, stats.exhausted
    );
    Ok(())
}

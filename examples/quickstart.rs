//! Quickstart: an event written in the same transaction as the business change, and a handler
//! that receives it. It needs a PostgreSQL database it may create tables in:
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres cargo run --example quickstart
//! ```

use std::process::ExitCode;
use std::time::Duration;

use outbox_runtime::worker::Worker;
use outbox_runtime::{
    Delivery, Dispatcher, Event, EventStatus, HandlerError, Producer, Store, handler,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
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
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| {
        "set DATABASE_URL to a PostgreSQL database the quickstart may create tables in, \
         for example DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres"
    })?;
    // A short timeout: a database that does not answer is reported after 5 s, not 30.
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(5))
        .connect(&url)
        .await
        .map_err(|e| {
            format!("cannot connect to DATABASE_URL within 5 s ({e}): is PostgreSQL running there?")
        })?;
    outbox_runtime::migrate(&pool).await?; // the outbox schema; safe to run on every start
    sqlx::query("CREATE TABLE IF NOT EXISTS orders (id uuid PRIMARY KEY, status text NOT NULL)")
        .execute(&pool)
        .await?;

    // 1. The business change and the event commit together, or not at all. A producer (one
    //    per service) begins the transaction and wakes the workers once it has committed.
    let producer = Producer::new(pool.clone());
    let order_id = Uuid::new_v4();
    let mut tx = producer.begin().await?;
    sqlx::query("INSERT INTO orders (id, status) VALUES ($1, 'confirmed')")
        .bind(order_id)
        .execute(&mut *tx)
        .await?;
    let event = OrderConfirmed {
        order_id,
        total_cents: 4200,
    };
    let event_id = tx
        .enqueue(&event, &format!("confirm-order/{order_id}"))
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

    // 3. Wait for this run's event (the database may hold earlier runs' events too).
    let store = Store::new(pool);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let delivered = loop {
        let status = store.event_status(event_id).await?;
        if status == Some(EventStatus::Delivered) || tokio::time::Instant::now() >= deadline {
            break status == Some(EventStatus::Delivered);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    worker.shutdown().await;
    if !delivered {
        return Err(format!(
            "event {event_id} was not delivered within 10 s (see `outbox status`)"
        )
        .into());
    }

    let stats = store.stats().await?;
    println!(
        "delivered {event_id}; outbox now: {} pending, {} delivered, {} exhausted",
        stats.pending, stats.delivered, stats.exhausted
    );
    Ok(())
}

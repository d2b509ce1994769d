//! Events from the outbox to RabbitMQ and into a consumer that applies each once:
//!
//! ```text
//! cargo run --example amqp_consumer                  # RabbitMQ on 127.0.0.1:5672 (guest/guest)
//! AMQP_URL=amqp://user:password@host:5672/vhost cargo run --example amqp_consumer
//! ```
//!
//! Confirms a few orders (each enqueues `order.confirmed` in its transaction), lets a worker
//! publish them to the topic exchange `outbox.example` with publisher confirms, then runs the
//! ledger consumer (`consumer.rs`) on a durable queue bound to `order.*`. It then sends the
//! first two messages again, as a publisher retry after a lost confirm would (same
//! `message_id`), and the ledger drops both as duplicates.
//!
//! Needs PostgreSQL, found like the tests find it (`DATABASE_URL`, else 127.0.0.1:5432, else a
//! throwaway server), and RabbitMQ. The queue is deleted at exit.

mod consumer;

use std::time::Duration;

use lapin::options::{BasicPublishOptions, QueueDeleteOptions};
use lapin::{BasicProperties, Connection, ExchangeKind};
use outbox_runtime::publish::amqp::{self, AmqpConfig, AmqpPublisher};
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::worker::Worker;
use outbox_runtime::{Event, Store};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The event this example publishes.
#[derive(Debug, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "order.confirmed", version = 1)]
pub struct OrderConfirmed {
    #[outbox(aggregate_id)]
    pub order_id: Uuid,
    pub total_cents: i64,
}

const EXCHANGE: &str = "outbox.example";
const ORDERS: i64 = 5;

#[tokio::main]
async fn main() -> Result<(), consumer::BoxError> {
    let url = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let _test_db;
    let pool = match std::env::var("DATABASE_URL") {
        Ok(url) => sqlx::PgPool::connect(&url).await?,
        Err(_) => {
            _test_db = TestDatabase::new().await;
            _test_db.pool().clone()
        }
    };
    outbox_runtime::migrate(&pool).await?;
    consumer::create_schema(&pool).await?;

    // The publisher declares the exchange; the consumer side declares and binds its queue.
    let config = AmqpConfig {
        exchange: EXCHANGE.to_owned(),
        declare_exchange: Some(ExchangeKind::Topic),
        ..AmqpConfig::default()
    };
    let publisher = AmqpPublisher::connect(&url, config).await?;
    let connection = Connection::connect(&url, amqp::connection_properties()).await?;
    let channel = connection.create_channel().await?;
    let queue = format!("ledger-example-{}", Uuid::new_v4().simple());
    consumer::declare_queue(&channel, &queue, EXCHANGE, "order.*").await?;

    // Orders confirmed: each event commits with its business transaction.
    for n in 0..ORDERS {
        let mut tx = pool.begin().await?;
        let order_id = Uuid::new_v4();
        OrderConfirmed {
            order_id,
            total_cents: 1000 + n,
        }
        .enqueue(&mut tx, &format!("confirm-order/{order_id}"))
        .await?;
        tx.commit().await?;
    }

    // A worker publishes them; each is delivered only after RabbitMQ's confirm.
    let worker = Worker::builder(pool.clone(), publisher.clone())
        .lease(Duration::from_secs(30))
        .start()
        .await?;
    let store = Store::new(pool.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while store.stats().await?.delivered < ORDERS {
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "not every event was delivered within 30 s: {:?}",
                store.stats().await?
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.shutdown().await;
    println!("published: {:?}", publisher.stats());
    publisher.close().await;

    let first = consumer::consume(
        &pool,
        &channel,
        &queue,
        ORDERS as u64,
        Duration::from_secs(30),
    )
    .await?;
    println!("ledger, first pass: {first:?}");

    // What a publisher retry after a lost confirm sends: the same messages again.
    let again: Vec<(Uuid, i64)> =
        sqlx::query_as("SELECT event_id, total_cents FROM ledger ORDER BY id LIMIT 2")
            .fetch_all(&pool)
            .await?;
    for (event_id, total_cents) in &again {
        let envelope = serde_json::json!({
            "id": event_id, "type": "order.confirmed", "version": 1,
            "payload": {"total_cents": total_cents},
        });
        channel
            .basic_publish(
                EXCHANGE,
                "order.confirmed",
                BasicPublishOptions::default(),
                &serde_json::to_vec(&envelope)?,
                BasicProperties::default().with_message_id(event_id.to_string().into()),
            )
            .await?;
    }
    let second = consumer::consume(
        &pool,
        &channel,
        &queue,
        again.len() as u64,
        Duration::from_secs(30),
    )
    .await?;
    println!("ledger, redelivered messages: {second:?}");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger")
        .fetch_one(&pool)
        .await?;
    println!("ledger rows: {rows} for {ORDERS} events");

    channel
        .queue_delete(&queue, QueueDeleteOptions::default())
        .await?;
    let _ = connection.close(200, "done").await;
    if first.applied as i64 == ORDERS && second.duplicates == again.len() as u64 && rows == ORDERS {
        println!("result: OK");
        Ok(())
    } else {
        Err("the ledger did not apply every event exactly once".into())
    }
}

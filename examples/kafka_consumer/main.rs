//! Events from the outbox to Kafka and into a consumer that applies each once:
//!
//! ```text
//! cargo run --example kafka_consumer                 # a Kafka-protocol broker on 127.0.0.1:9092
//! KAFKA_BROKERS=host:9092 cargo run --example kafka_consumer
//! ```
//!
//! Confirms a few orders (each enqueues `order.confirmed` in its transaction), lets a worker
//! produce them to a new topic of three partitions, keyed by order, then runs the ledger
//! consumer (`consumer.rs`), which stores its position with its effects. It then writes the
//! first two records again, as a publisher retry after a lost acknowledgement would (same
//! `Outbox-Event-Id`), and the ledger drops both as duplicates.
//!
//! Needs PostgreSQL, found like the tests find it (`DATABASE_URL`, else 127.0.0.1:5432, else a
//! throwaway server), and a Kafka-protocol broker (`.ci/run` installs tansu; start it with
//! `tansu broker --listener-url tcp://127.0.0.1:9092 --advertised-listener-url tcp://127.0.0.1:9092`).
//! The topic is deleted at exit.

mod consumer;

use std::time::Duration;

use outbox_runtime::publish::kafka::{KafkaConfig, KafkaPublisher};
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::worker::Worker;
use outbox_runtime::{Event, Store};
use rskafka::client::partition::{Compression, UnknownTopicHandling};
use rskafka::record::RecordAndOffset;
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

const ORDERS: i64 = 5;
const PARTITIONS: i32 = 3;

#[tokio::main]
async fn main() -> Result<(), consumer::BoxError> {
    let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
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

    let topic = format!("outbox-example-{}", Uuid::new_v4().simple());
    let config = KafkaConfig {
        topic: topic.clone(),
        create_topic: Some((PARTITIONS, 1)),
        ..KafkaConfig::default()
    };
    let publisher = KafkaPublisher::connect(&brokers, config).await?;

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

    // A worker produces them; each is delivered only after the partition leader's ack.
    let worker = Worker::builder(pool.clone(), publisher.clone())
        .lease(Duration::from_secs(30))
        .start()
        .await?;
    let store = Store::new(pool.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while store.stats().await?.delivered < ORDERS {
        if tokio::time::Instant::now() > deadline {
            return Err("not every event was delivered within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.shutdown().await;
    println!("produced: {:?}", publisher.stats());

    let client = publisher.client();
    let first = consumer::consume(
        &pool,
        client,
        &topic,
        PARTITIONS,
        ORDERS as u64,
        Duration::from_secs(30),
    )
    .await?;
    println!("ledger, first pass: {first:?}");

    // What a publisher retry after a lost acknowledgement writes: the same records again.
    let mut again = 0;
    for partition in 0..PARTITIONS {
        let reader = client
            .partition_client(topic.clone(), partition, UnknownTopicHandling::Retry)
            .await?;
        let (records, _) = reader.fetch_records(0, 1..1_000_000, 200).await?;
        let copies: Vec<_> = records
            .into_iter()
            .take(2 - again)
            .map(|RecordAndOffset { record, .. }| record)
            .collect();
        again += copies.len();
        if !copies.is_empty() {
            reader.produce(copies, Compression::NoCompression).await?;
        }
        if again == 2 {
            break;
        }
    }
    let second = consumer::consume(
        &pool,
        client,
        &topic,
        PARTITIONS,
        again as u64,
        Duration::from_secs(30),
    )
    .await?;
    println!("ledger, records written twice: {second:?}");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger")
        .fetch_one(&pool)
        .await?;
    println!("ledger rows: {rows} for {ORDERS} events");

    if let Ok(controller) = client.controller_client() {
        let _ = controller.delete_topic(topic.clone(), 5_000).await;
    }
    if first.applied as i64 == ORDERS && second.duplicates == again as u64 && rows == ORDERS {
        println!("result: OK");
        Ok(())
    } else {
        Err("the ledger did not apply every event exactly once".into())
    }
}

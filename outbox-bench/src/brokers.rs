//! Broker drains: the drain's events delivered by the worker to a real broker, each next to
//! the same drain into the no-op sink measured in the same run (the ratio says what the broker
//! round trip costs on top of the outbox itself).
//!
//! - RabbitMQ: a durable topic exchange of the run's own with one durable queue bound to
//!   every routing key, so each persistent message is routed, stored and confirmed. Checked
//!   after each drain: the queue holds at least one message per event.
//! - Kafka: a topic of the run's own (deleted after), records acknowledged by all in-sync
//!   replicas. Checked after each drain: the topic holds at least one record per event.

use std::time::{Duration, Instant};

use lapin::options::{
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ExchangeKind};
use outbox_runtime::publish::HEADER_EVENT_ID;
use outbox_runtime::publish::amqp::{self, AmqpConfig, AmqpPublisher};
use outbox_runtime::publish::kafka::{KafkaConfig, KafkaPublisher};
use rskafka::client::partition::{OffsetAt, UnknownTopicHandling};

use crate::BenchResult;
use crate::db::BenchDb;
use crate::drain::{self, DrainSetting, Drained};
use crate::event::PayloadShape;

/// A broker drain that has not finished by then is reported as failed.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(600);

/// One drain of `n` events into RabbitMQ at `url`, with `batch` events per
/// `deliver_batch` call (`None`: one publish per delivery).
pub async fn run_amqp(
    db: &BenchDb,
    url: &str,
    n: i64,
    shape: &PayloadShape,
    setting: DrainSetting,
    batch: Option<usize>,
) -> BenchResult<Drained> {
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let exchange = format!("outbox.bench.{unique}");
    let queue = format!("outbox-bench-{unique}");
    let config = AmqpConfig {
        exchange: exchange.clone(),
        declare_exchange: Some(ExchangeKind::Topic),
        batch,
        ..AmqpConfig::default()
    };
    let publisher = AmqpPublisher::connect(url, config).await?;
    let connection = Connection::connect(url, amqp::connection_properties()).await?;
    let channel = connection.create_channel().await?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(&queue, durable, FieldTable::default())
        .await?;
    channel
        .queue_bind(
            &queue,
            &exchange,
            "#",
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;

    db.truncate_outboxes().await?;
    drain::prefill_typed(db, n, shape, false).await?;
    db.settle().await?;
    let started = Instant::now();
    let handles = setting.start(db, &publisher).await?;
    let drained = db.wait_drained(DRAIN_TIMEOUT).await?;
    let secs = started.elapsed().as_secs_f64();
    drain::stop(handles).await;

    let stored = channel
        .queue_delete(&queue, QueueDeleteOptions::default())
        .await?;
    channel
        .exchange_delete(&exchange, ExchangeDeleteOptions::default())
        .await?;
    let _ = connection.close(200, "bench done").await;
    publisher.close().await;
    if !drained {
        return Err(format!("the RabbitMQ drain did not finish within {DRAIN_TIMEOUT:?}").into());
    }
    let stored = i64::from(stored);
    if stored < n {
        return Err(format!("the queue holds {stored} messages for {n} delivered events").into());
    }
    Ok(Drained {
        secs,
        rate: n as f64 / secs,
        handled: stored,
        cpu: None,
        allocs: None,
    })
}

/// One drain of `n` events into a new topic of `partitions` partitions on the Kafka brokers
/// `brokers`, with `batch` events per `deliver_batch` call (`None`: one produce per delivery).
/// Checked after the drain: the topic holds at least one record per event.
pub async fn run_kafka(
    db: &BenchDb,
    brokers: &str,
    n: i64,
    shape: &PayloadShape,
    setting: DrainSetting,
    batch: Option<usize>,
    partitions: i32,
) -> BenchResult<Drained> {
    let topic = format!("outbox-bench-{}", uuid::Uuid::new_v4().simple());
    let config = KafkaConfig {
        topic: topic.clone(),
        create_topic: Some((partitions, 1)),
        batch,
        ..KafkaConfig::default()
    };
    let publisher = KafkaPublisher::connect(brokers, config).await?;

    db.truncate_outboxes().await?;
    drain::prefill_typed(db, n, shape, false).await?;
    db.settle().await?;
    let started = Instant::now();
    let handles = setting.start(db, &publisher).await?;
    let drained = db.wait_drained(DRAIN_TIMEOUT).await?;
    let secs = started.elapsed().as_secs_f64();
    drain::stop(handles).await;
    if !drained {
        return Err(format!("the Kafka drain did not finish within {DRAIN_TIMEOUT:?}").into());
    }

    // Read the topic back: every record, and the distinct event ids among them.
    let mut stored = 0;
    let mut events = std::collections::HashSet::new();
    let mut watermarks = 0;
    for partition in 0..partitions {
        let reader = publisher
            .client()
            .partition_client(topic.clone(), partition, UnknownTopicHandling::Retry)
            .await?;
        watermarks += reader.get_offset(OffsetAt::Latest).await?;
        let mut from = reader.get_offset(OffsetAt::Earliest).await?;
        loop {
            let (records, _) = reader.fetch_records(from, 1..50_000_000, 100).await?;
            let Some(last) = records.last() else { break };
            from = last.offset + 1;
            stored += records.len() as i64;
            events.extend(
                records
                    .iter()
                    .filter_map(|r| r.record.headers.get(HEADER_EVENT_ID).cloned()),
            );
        }
    }
    if let Ok(controller) = publisher.client().controller_client() {
        let _ = controller.delete_topic(topic, 10_000).await;
    }
    if (events.len() as i64) < n {
        return Err(format!(
            "the topic holds {stored} records of {} distinct events (high watermarks {watermarks}) \
             for {n} delivered events",
            events.len()
        )
        .into());
    }
    Ok(Drained {
        secs,
        rate: n as f64 / secs,
        handled: stored,
        cpu: None,
        allocs: None,
    })
}

//! The Kafka publisher against a real Kafka-protocol broker: tansu (a broker written in Rust,
//! Apache-2.0), one process per test with in-memory storage on a loopback port of its own,
//! killed at the end (`.ci/run` installs it once; see `brokers_support::tansu_bin`). Faults go
//! through a TCP proxy the broker advertises as its address, so every connection of the
//! publisher really dies when the proxy cuts it.
//!
//! What the receiver recorded is what the topic holds, and what the ledger consumer
//! (`examples/kafka_consumer/consumer.rs`) applied through the inbox.

mod adapters_support;
mod brokers_support;
#[path = "../examples/kafka_consumer/consumer.rs"]
mod consumer;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use adapters_support::{
    OrderShipped, Settled, TRACEPARENT, attempt, claim, closed_port, enqueue, row, settle, status,
    wait_until,
};
use brokers_support::Tansu;
use outbox_runtime::publish::Envelope;
use outbox_runtime::publish::kafka::{KafkaConfig, KafkaPublisher, partition_for};
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::worker::{RetryPolicy, Worker};
use outbox_runtime::{Sink, Store};
use rskafka::client::partition::UnknownTopicHandling;
use rskafka::record::RecordAndOffset;
use uuid::Uuid;

fn config(partitions: i32) -> KafkaConfig {
    KafkaConfig {
        topic: format!("outbox-test-{}", Uuid::new_v4().simple()),
        ack_timeout: Duration::from_secs(3),
        create_topic: Some((partitions, 1)),
        batch: None,
    }
}

/// Every record of the publisher's topic, partition by partition.
async fn records(publisher: &KafkaPublisher) -> BTreeMap<i32, Vec<RecordAndOffset>> {
    let mut all = BTreeMap::new();
    for partition in 0..publisher.partitions() {
        let reader = publisher
            .client()
            .partition_client(
                publisher.config().topic.clone(),
                partition,
                UnknownTopicHandling::Retry,
            )
            .await
            .unwrap();
        let (records, _) = reader.fetch_records(0, 1..10_000_000, 100).await.unwrap();
        all.insert(partition, records);
    }
    all
}

async fn record_count(publisher: &KafkaPublisher) -> usize {
    records(publisher).await.values().map(Vec::len).sum()
}

fn header(record: &RecordAndOffset, name: &str) -> Option<String> {
    record
        .record
        .headers
        .get(name)
        .map(|v| String::from_utf8(v.clone()).unwrap())
}

#[tokio::test]
async fn an_event_is_delivered_once_acknowledged_keyed_by_its_aggregate_with_its_headers() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let tansu = Tansu::start().await;
    let publisher = KafkaPublisher::connect(&tansu.bootstrap(), config(3))
        .await
        .unwrap();
    assert_eq!(publisher.partitions(), 3);
    let (event_id, event) = enqueue(db.pool(), "once", 10).await;

    let (outcome, settled) = attempt(&store, &publisher).await;

    assert_eq!(outcome, Ok(()));
    assert_eq!(settled, Settled::Delivered);
    assert_eq!(status(db.pool(), event_id).await, "delivered");
    assert_eq!(publisher.stats().acknowledged, 1);
    let key = event.order_id.to_string();
    let expected_partition = partition_for(key.as_bytes(), 3);
    let all = records(&publisher).await;
    for (partition, records) in &all {
        let expected = usize::from(*partition == expected_partition);
        assert_eq!(records.len(), expected, "partition {partition}");
    }
    let record = &all[&expected_partition][0];
    assert_eq!(record.record.key.as_deref(), Some(key.as_bytes()));
    assert_eq!(
        header(record, "Outbox-Event-Id"),
        Some(event_id.to_string())
    );
    assert_eq!(
        header(record, "Outbox-Event-Type").as_deref(),
        Some("test.order_shipped")
    );
    assert_eq!(header(record, "Outbox-Event-Version").as_deref(), Some("3"));
    assert_eq!(header(record, "Outbox-Attempt").as_deref(), Some("1"));
    assert_eq!(header(record, "Outbox-Aggregate-Id"), Some(key.clone()));
    assert_eq!(
        header(record, "Outbox-Aggregate-Version").as_deref(),
        Some("7")
    );
    assert_eq!(header(record, "traceparent").as_deref(), Some(TRACEPARENT));
    let envelope: Envelope =
        serde_json::from_slice(record.record.value.as_deref().unwrap()).unwrap();
    assert_eq!(envelope.id, event_id);
    assert_eq!(
        serde_json::from_value::<OrderShipped>(envelope.payload).unwrap(),
        event
    );
}

/// The broker writes the record, but its acknowledgement never reaches the publisher (the
/// proxy holds the broker's answers back): the event is not delivered. The retry writes it
/// again under the same event id.
#[tokio::test]
async fn a_record_the_broker_wrote_is_not_delivered_until_its_acknowledgement_arrives() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let (tansu, proxy) = Tansu::behind_proxy().await;
    let publisher = KafkaPublisher::connect(
        &tansu.bootstrap(),
        KafkaConfig {
            ack_timeout: Duration::from_millis(1500),
            ..config(1)
        },
    )
    .await
    .unwrap();
    let (event_id, _) = enqueue(db.pool(), "unacknowledged", 10).await;

    proxy.hold_replies();
    let (outcome, settled) = attempt(&store, &publisher).await;
    let err = outcome.unwrap_err();
    assert!(!err.is_permanent());
    assert!(
        err.message.contains("no acknowledgement from Kafka") && err.message.contains("1.5s"),
        "{err}"
    );
    assert_eq!(settled, Settled::Rescheduled);
    assert_eq!(row(db.pool(), event_id).await.status, "pending");
    proxy.release_replies();
    // The broker had written it: the copy is there before any retry.
    wait_until(
        "the broker kept the unacknowledged record",
        Duration::from_secs(10),
        || async { record_count(&publisher).await == 1 },
    )
    .await;

    let (outcome, settled) = attempt(&store, &publisher).await;
    assert_eq!(outcome, Ok(()));
    assert_eq!(settled, Settled::Delivered);
    let all = records(&publisher).await;
    let copies: Vec<&RecordAndOffset> = all.values().flatten().collect();
    assert_eq!(copies.len(), 2, "the retry wrote a second copy");
    for copy in copies {
        assert_eq!(header(copy, "Outbox-Event-Id"), Some(event_id.to_string()));
    }
}

/// A worker produces through a proxy; the broker goes away (every connection closed, new ones
/// refused) while events keep coming, then comes back. Every event ends up delivered, in the
/// topic, and applied once by the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_then_up_loses_nothing() {
    let db = TestDatabase::new().await;
    consumer::create_schema(db.pool()).await.unwrap();
    let (tansu, proxy) = Tansu::behind_proxy().await;
    let publisher = KafkaPublisher::connect(&tansu.bootstrap(), config(3))
        .await
        .unwrap();
    let worker = Worker::builder(db.pool().clone(), publisher.clone())
        .lease(Duration::from_secs(30))
        .poll_interval(Duration::from_millis(50))
        .retry(RetryPolicy {
            base: Duration::from_millis(50),
            max: Duration::from_millis(300),
            jitter: false,
        })
        .start()
        .await
        .unwrap();
    let all_delivered = |ids: Vec<Uuid>| {
        let pool = db.pool().clone();
        move || {
            let (pool, ids) = (pool.clone(), ids.clone());
            async move {
                for id in &ids {
                    if status(&pool, *id).await != "delivered" {
                        return false;
                    }
                }
                true
            }
        }
    };
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(enqueue(db.pool(), "before", 100).await.0);
    }
    wait_until(
        "the first events delivered",
        Duration::from_secs(30),
        all_delivered(ids.clone()),
    )
    .await;

    proxy.down();
    let mut during = Vec::new();
    for _ in 0..5 {
        during.push(enqueue(db.pool(), "during", 100).await.0);
    }
    wait_until(
        "every event enqueued while the broker is away tried and retried",
        Duration::from_secs(60),
        || async {
            for id in &during {
                if row(db.pool(), *id).await.handler_failures < 1 {
                    return false;
                }
            }
            true
        },
    )
    .await;
    for id in &during {
        let r = row(db.pool(), *id).await;
        assert_ne!(
            r.status, "delivered",
            "delivered while the broker was away: {r:?}"
        );
        assert!(
            r.last_error.as_deref().unwrap_or("").contains("Kafka"),
            "{r:?}"
        );
    }

    proxy.up().await;
    ids.extend(&during);
    wait_until(
        "every event delivered after the broker came back",
        Duration::from_secs(60),
        all_delivered(ids.clone()),
    )
    .await;
    worker.shutdown().await;

    let in_topic = record_count(&publisher).await;
    assert!(
        in_topic >= 10,
        "every delivered event is in the topic: {in_topic}"
    );
    let counts = consumer::consume(
        db.pool(),
        publisher.client(),
        &publisher.config().topic,
        publisher.partitions(),
        in_topic as u64,
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    assert_eq!(counts.applied, 10);
    assert_eq!(counts.duplicates, in_topic as u64 - 10);
    let applied: BTreeSet<Uuid> = sqlx::query_scalar("SELECT event_id FROM ledger")
        .fetch_all(db.pool())
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(applied, ids.iter().copied().collect());
}

/// Batch mode: twenty events over four partitions, one produce request per partition, the
/// connection killed right before the third request while the broker's answers are held back.
/// The broker has the records of two partitions; the publisher has no acknowledgement, so all
/// twenty are retried, and the retry writes those two partitions' records a second time under
/// the same event ids. The ledger applies each event once.
#[tokio::test]
async fn a_connection_killed_mid_batch_loses_nothing_and_the_inbox_drops_the_duplicates() {
    let db = TestDatabase::new().await;
    consumer::create_schema(db.pool()).await.unwrap();
    let store = Store::new(db.pool().clone());
    let (tansu, proxy) = Tansu::behind_proxy().await;
    let publisher = KafkaPublisher::connect(
        &tansu.bootstrap(),
        KafkaConfig {
            batch: Some(20),
            ..config(4)
        },
    )
    .await
    .unwrap();
    assert_eq!(publisher.max_batch(), 20);
    let mut ids = BTreeSet::new();
    for _ in 0..20 {
        ids.insert(enqueue(db.pool(), "batch", 10).await.0);
    }

    let items = claim(&store, 20).await;
    let partitions_used: BTreeSet<i32> = items
        .iter()
        .map(|(e, _)| partition_for(e.aggregate_id.as_deref().unwrap().as_bytes(), 4))
        .collect();
    assert!(
        partitions_used.len() >= 3,
        "twenty random keys spread over the partitions"
    );
    proxy.hold_replies();
    proxy.cut_before(2);
    let results = publisher.deliver_batch(&items).await;
    assert_eq!(proxy.cuts(), 1, "the connection was cut");
    assert_eq!(results.len(), 20);
    for ((event, _), result) in items.iter().zip(&results) {
        let err = result.as_ref().unwrap_err();
        assert!(!err.is_permanent(), "{err}");
        assert_eq!(settle(&store, event, result).await, Settled::Rescheduled);
    }
    proxy.release_replies();
    let written_first = record_count(&publisher).await;
    assert!(
        (1..20).contains(&written_first),
        "the two whole requests were written, the rest not: {written_first}"
    );

    let items = claim(&store, 20).await;
    let results = publisher.deliver_batch(&items).await;
    for ((event, _), result) in items.iter().zip(&results) {
        assert_eq!(result, &Ok(()));
        assert_eq!(settle(&store, event, result).await, Settled::Delivered);
    }

    // Each event's copies carry its id and the same envelope.
    let all = records(&publisher).await;
    let mut copies: BTreeMap<Uuid, Vec<Envelope>> = BTreeMap::new();
    for record in all.values().flatten() {
        let envelope: Envelope =
            serde_json::from_slice(record.record.value.as_deref().unwrap()).unwrap();
        assert_eq!(
            header(record, "Outbox-Event-Id"),
            Some(envelope.id.to_string())
        );
        copies.entry(envelope.id).or_default().push(envelope);
    }
    assert_eq!(copies.keys().copied().collect::<BTreeSet<_>>(), ids);
    let total: usize = copies.values().map(Vec::len).sum();
    assert_eq!(total, 20 + written_first);
    for list in copies.values().filter(|c| c.len() > 1) {
        assert_eq!(list.len(), 2);
        assert_eq!(list[0], list[1]);
    }

    let counts = consumer::consume(
        db.pool(),
        publisher.client(),
        &publisher.config().topic,
        4,
        total as u64,
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    assert_eq!(
        (counts.applied, counts.duplicates, counts.skipped),
        (20, written_first as u64, 0)
    );
    let per_event: Vec<i64> = sqlx::query_scalar("SELECT count(*) FROM ledger GROUP BY event_id")
        .fetch_all(db.pool())
        .await
        .unwrap();
    assert_eq!(per_event, vec![1; 20], "each event applied once");
}

/// Many deliveries in flight at once (a worker with 200 slots, single records): every event the
/// worker completed is in the topic, read back record by record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_record_is_in_the_topic_under_concurrency() {
    let db = TestDatabase::new().await;
    let tansu = Tansu::start().await;
    let publisher = KafkaPublisher::connect(&tansu.bootstrap(), config(3))
        .await
        .unwrap();
    let mut ids = BTreeSet::new();
    for _ in 0..300 {
        ids.insert(enqueue(db.pool(), "many", 10).await.0);
    }
    let worker = Worker::builder(db.pool().clone(), publisher.clone())
        .lease(Duration::from_secs(30))
        .concurrency(200)
        .batch_size(100)
        .start()
        .await
        .unwrap();
    let store = Store::new(db.pool().clone());
    wait_until("every event delivered", Duration::from_secs(60), || async {
        store.stats().await.unwrap().delivered == 300
    })
    .await;
    worker.shutdown().await;
    let in_topic: BTreeSet<Uuid> = records(&publisher)
        .await
        .values()
        .flatten()
        .map(|r| header(r, "Outbox-Event-Id").unwrap().parse().unwrap())
        .collect();
    assert_eq!(in_topic, ids, "every delivered event is in the topic");
}

#[tokio::test]
async fn the_ack_timeout_must_be_shorter_than_the_lease_and_the_topic_must_exist() {
    let db = TestDatabase::new().await;
    let tansu = Tansu::start().await;
    let missing = KafkaConfig {
        create_topic: None,
        ..config(1)
    };
    let err = KafkaPublisher::connect(&tansu.bootstrap(), missing)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("does not exist") && err.contains("create_topic"),
        "{err}"
    );

    let publisher = KafkaPublisher::connect(&tansu.bootstrap(), config(1))
        .await
        .unwrap();
    let err = Worker::builder(db.pool().clone(), publisher)
        .lease(Duration::from_secs(3))
        .start()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Kafka ack timeout (3s) must be shorter than the worker's lease (3s)"),
        "{err}"
    );
}

#[tokio::test]
async fn connecting_to_no_broker_says_so_within_the_ack_timeout() {
    let config = KafkaConfig {
        ack_timeout: Duration::from_secs(2),
        ..KafkaConfig::default()
    };
    let started = std::time::Instant::now();
    let err = KafkaPublisher::connect(&format!("127.0.0.1:{}", closed_port()), config)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Kafka") && err.contains("start a broker"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

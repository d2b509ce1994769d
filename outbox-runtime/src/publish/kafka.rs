//! A [`Sink`] that produces events to a Kafka topic, on the pure-Rust client
//! [`rskafka`](https://docs.rs/rskafka).
//!
//! Each event is one record of the configured topic:
//!
//! - key: the aggregate id (the event id for an event without aggregate), and the partition is
//!   chosen from the key the way Kafka's default partitioner does (murmur2, see
//!   [`partition_for`]), so every event of an aggregate lands in the same partition, in the
//!   order it was produced, next to what other producers write for that key;
//! - value: the [`Envelope`] as JSON;
//! - headers: the metadata of [`metadata_headers`] (`Outbox-Event-Id` first: consumers
//!   deduplicate on it);
//! - acknowledged by all in-sync replicas (`acks=all`; rskafka always asks for it).
//!
//! An event counts as delivered only once the partition leader acknowledged its record with an
//! offset. A missing acknowledgement (timeout, broken connection, leader changes) is a retry;
//! a record the broker refuses as too large or invalid is permanent.
//!
//! # Not the idempotent producer
//!
//! rskafka does not implement Kafka's idempotent producer (producer ids and sequence numbers),
//! and no pure-Rust client here does: a retry after a lost acknowledgement writes the record a
//! second time, at a new offset, with the same `Outbox-Event-Id` header and the same envelope.
//! Consumers must deduplicate, for example with [`crate::inbox`] (see the `kafka_consumer`
//! example). The client reconnects by itself after a broken connection.
//!
//! # Ordering and batches
//!
//! Records of one produce request are one record batch of one partition, which Kafka appends
//! whole or not at all. In batch mode ([`KafkaConfig::batch`]) a chunk of events becomes one
//! produce request per partition, sent concurrently; each event's result is its partition's.
//! A partition keeps the order in which records are produced: for per-aggregate order the
//! worker must not have two events of one aggregate in flight at once
//! ([`crate::worker::WorkerBuilder::ordered`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use rskafka::BackoffConfig;
use rskafka::client::error::{Error as KafkaError, ProtocolError};
use rskafka::client::partition::{Compression, OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record;

use super::{Envelope, metadata_headers, unless_lease_lost};
use crate::delivery::{Delivery, HandlerError};
use crate::error::{Error, Result};
use crate::sink::Sink;
use crate::store::ClaimedEvent;

/// Kafka's limit on a topic name's length.
const MAX_TOPIC_NAME: usize = 249;
/// The seed of Kafka's default partitioner's murmur2.
const KAFKA_MURMUR2_SEED: u32 = 0x9747_b28c;

/// Settings of a [`KafkaPublisher`].
#[derive(Debug, Clone)]
pub struct KafkaConfig {
    /// The topic every event is produced to (default `outbox`): 1 to 249 letters, digits, `.`,
    /// `_` and `-`.
    pub topic: String,
    /// How long one delivery may take in all, the client's own retries included (default
    /// 5 s). Must be shorter than the worker's lease ([`KafkaPublisher::check_lease`]).
    pub ack_timeout: Duration,
    /// `Some((partitions, replication factor))`: [`KafkaPublisher::connect`] creates the topic
    /// when it does not exist. `None` (the default): the topic must exist.
    pub create_topic: Option<(i32, i16)>,
    /// `Some(n)`: batch mode, up to `n` events per [`Sink::deliver_batch`] call, one produce
    /// request per partition. `None` (the default): one event per call.
    pub batch: Option<usize>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            topic: "outbox".to_owned(),
            ack_timeout: Duration::from_secs(5),
            create_topic: None,
            batch: None,
        }
    }
}

/// Counts of what a [`KafkaPublisher`] was told by the brokers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KafkaStats {
    /// Records the partition leaders acknowledged.
    pub acknowledged: u64,
    /// Produce requests that failed or got no acknowledgement in time.
    pub failed_requests: u64,
}

#[derive(Debug, Default)]
struct Counts {
    acknowledged: AtomicU64,
    failed_requests: AtomicU64,
}

struct Shared {
    client: Client,
    /// The bootstrap brokers, as given (host:port, no credentials).
    brokers: String,
    config: KafkaConfig,
    /// One client per partition of the topic, each already connected to its leader.
    partitions: Vec<Arc<PartitionClient>>,
    counts: Counts,
}

/// Produces claimed events to a Kafka topic; see the [module docs](self).
#[derive(Clone)]
pub struct KafkaPublisher {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("brokers", &self.shared.brokers)
            .field("config", &self.shared.config)
            .field("partitions", &self.shared.partitions.len())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// Connect to the bootstrap brokers (`host:port`, comma-separated), create the topic when
    /// [`KafkaConfig::create_topic`] asks for it, and read how many partitions it has. Fails
    /// when the settings are invalid, no broker answers within the ack timeout, or the topic
    /// does not exist.
    pub async fn connect(brokers: &str, config: KafkaConfig) -> Result<KafkaPublisher> {
        validate(&config)?;
        let bootstrap: Vec<String> = brokers
            .split(',')
            .map(|b| b.trim().to_owned())
            .filter(|b| !b.is_empty())
            .collect();
        if bootstrap.is_empty() {
            return Err(Error::Config(
                "no Kafka broker given; write them as host:port[,host:port...]".into(),
            ));
        }
        let backoff = BackoffConfig {
            deadline: Some(config.ack_timeout),
            ..BackoffConfig::default()
        };
        let build = ClientBuilder::new(bootstrap)
            .client_id("outbox-publisher")
            .backoff_config(backoff)
            .build();
        let client = match tokio::time::timeout(config.ack_timeout, build).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                return Err(Error::Config(format!(
                    "cannot connect to Kafka at {brokers}: {e}; start a broker or fix the address"
                )));
            }
            Err(_) => {
                return Err(Error::Config(format!(
                    "no Kafka broker at {brokers} answered within {:?}; start a broker or fix the address",
                    config.ack_timeout
                )));
            }
        };
        KafkaPublisher::with_client(client, brokers, config).await
    }

    /// A publisher over a client built by the caller (for TLS or SASL, which need rskafka's
    /// features and credentials of the caller's own); `brokers` names them in messages.
    pub async fn with_client(
        client: Client,
        brokers: &str,
        config: KafkaConfig,
    ) -> Result<KafkaPublisher> {
        validate(&config)?;
        let topic = &config.topic;
        let wait = config.ack_timeout;
        if let Some((partitions, replication)) = config.create_topic {
            let controller = client.controller_client().map_err(|e| {
                Error::Config(format!(
                    "cannot reach the Kafka controller at {brokers}: {e}"
                ))
            })?;
            let timeout_ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
            let create =
                controller.create_topic(topic.clone(), partitions, replication, timeout_ms);
            match tokio::time::timeout(wait, create).await {
                Ok(Ok(())) => {}
                Ok(Err(KafkaError::ServerError {
                    protocol_error: ProtocolError::TopicAlreadyExists,
                    ..
                })) => {}
                Ok(Err(e)) => {
                    return Err(Error::Config(format!(
                        "cannot create Kafka topic `{topic}` at {brokers}: {e}"
                    )));
                }
                Err(_) => {
                    return Err(Error::Config(format!(
                        "creating Kafka topic `{topic}` at {brokers} took over {wait:?}"
                    )));
                }
            }
        }
        let partitions = partition_count(&client, topic, wait).await.map_err(|e| {
            Error::Config(format!(
                "cannot read Kafka topic `{topic}` at {brokers}: {e}"
            ))
        })?;
        let Some(partitions) = partitions.filter(|n| *n > 0) else {
            return Err(Error::Config(format!(
                "Kafka topic `{topic}` does not exist at {brokers}; create it (for example \
                 `kafka-topics.sh --create --topic {topic} --partitions 6`) or set KafkaConfig::create_topic"
            )));
        };
        // Reach every partition's leader now: a topic without leaders fails at start, not at
        // the first event.
        let mut clients = Vec::new();
        for partition in 0..partitions {
            let reach = async {
                let client = client
                    .partition_client(topic.clone(), partition, UnknownTopicHandling::Retry)
                    .await?;
                client.get_offset(OffsetAt::Latest).await?;
                Ok::<_, KafkaError>(client)
            };
            let partition_client = match tokio::time::timeout(wait, reach).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    return Err(Error::Config(format!(
                        "cannot reach the leader of Kafka topic `{topic}` partition {partition} at {brokers}: {e}"
                    )));
                }
                Err(_) => {
                    return Err(Error::Config(format!(
                        "the leader of Kafka topic `{topic}` partition {partition} at {brokers} did not answer within {wait:?}"
                    )));
                }
            };
            clients.push(Arc::new(partition_client));
        }
        Ok(KafkaPublisher {
            shared: Arc::new(Shared {
                client,
                brokers: brokers.to_owned(),
                config,
                partitions: clients,
                counts: Counts::default(),
            }),
        })
    }

    /// The settings of this publisher.
    pub fn config(&self) -> &KafkaConfig {
        &self.shared.config
    }

    /// The rskafka client, for reading the topic or managing others.
    pub fn client(&self) -> &Client {
        &self.shared.client
    }

    /// Partitions of the topic (read at connect: a topic that grows later needs a restart, and
    /// growing it moves keys to other partitions anyway).
    pub fn partitions(&self) -> i32 {
        i32::try_from(self.shared.partitions.len()).unwrap_or(i32::MAX)
    }

    /// What the brokers answered so far.
    pub fn stats(&self) -> KafkaStats {
        let c = &self.shared.counts;
        KafkaStats {
            acknowledged: c.acknowledged.load(Ordering::Relaxed),
            failed_requests: c.failed_requests.load(Ordering::Relaxed),
        }
    }

    /// Check at start-up that a delivery fits in the worker's lease: a produce still waiting
    /// for its acknowledgement when the lease ends may be sent again by another worker.
    pub fn check_lease(&self, lease: Duration) -> Result<()> {
        let timeout = self.shared.config.ack_timeout;
        if timeout >= lease {
            return Err(Error::Config(format!(
                "the Kafka ack timeout ({timeout:?}) must be shorter than the worker's lease ({lease:?}); \
                 lower KafkaConfig::ack_timeout or lengthen the lease"
            )));
        }
        Ok(())
    }

    /// The record of an event and its partition.
    fn record(
        &self,
        event: &ClaimedEvent,
        delivery: &Delivery,
    ) -> Result<(i32, Record), HandlerError> {
        let key = match &event.aggregate_id {
            Some(id) => id.clone().into_bytes(),
            None => event.event_id.to_string().into_bytes(),
        };
        let value = serde_json::to_vec(&Envelope::of(event)).map_err(|e| {
            HandlerError::permanent(format!("event cannot be encoded as JSON: {e}"))
        })?;
        let headers: BTreeMap<String, Vec<u8>> = metadata_headers(event, delivery)
            .into_iter()
            .map(|(name, value)| (name, value.into_bytes()))
            .collect();
        let partition = partition_for(&key, self.partitions());
        Ok((
            partition,
            Record {
                key: Some(key),
                value: Some(value),
                headers,
                timestamp: record_timestamp(),
            },
        ))
    }

    /// Produce `records` to one partition as one request; one outcome for all of them.
    async fn produce(&self, partition: i32, records: Vec<Record>) -> Result<(), HandlerError> {
        let n = records.len() as u64;
        let topic = &self.shared.config.topic;
        let timeout = self.shared.config.ack_timeout;
        let client = &self.shared.partitions[usize::try_from(partition).unwrap_or(0)];
        let produce = client.produce(records, Compression::NoCompression);
        let outcome = match tokio::time::timeout(timeout, produce).await {
            Ok(Ok(offsets)) => {
                self.shared
                    .counts
                    .acknowledged
                    .fetch_add(n, Ordering::Relaxed);
                tracing::trace!(topic = %topic, partition, ?offsets, "records acknowledged");
                return Ok(());
            }
            Ok(Err(e)) => produce_error(topic, partition, &e),
            Err(_) => HandlerError::retry(format!(
                "no acknowledgement from Kafka for topic `{topic}` partition {partition} within {timeout:?}; \
                 the broker may have written the record, and the retry carries the same Outbox-Event-Id"
            )),
        };
        self.shared
            .counts
            .failed_requests
            .fetch_add(1, Ordering::Relaxed);
        Err(outcome)
    }

    /// Produce `items`, one request per partition, concurrently: one result per item, in
    /// order.
    async fn produce_all(
        &self,
        items: &[(&ClaimedEvent, &Delivery)],
    ) -> Vec<Result<(), HandlerError>> {
        let mut results: Vec<Option<Result<(), HandlerError>>> = vec![None; items.len()];
        let mut by_partition: BTreeMap<i32, (Vec<usize>, Vec<Record>)> = BTreeMap::new();
        for (i, (event, delivery)) in items.iter().enumerate() {
            if delivery.lease_lost().is_cancelled() {
                results[i] = Some(Err(HandlerError::retry(
                    "the lease was lost before the record was produced; the event will be delivered again",
                )));
                continue;
            }
            match self.record(event, delivery) {
                Ok((partition, record)) => {
                    let entry = by_partition.entry(partition).or_default();
                    entry.0.push(i);
                    entry.1.push(record);
                }
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        let requests = by_partition
            .into_iter()
            .map(|(partition, (indexes, records))| async move {
                (indexes, self.produce(partition, records).await)
            });
        for (indexes, outcome) in futures::future::join_all(requests).await {
            for i in indexes {
                results[i] = Some(outcome.clone());
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(HandlerError::retry("no result for this event"))))
            .collect()
    }
}

impl Sink for KafkaPublisher {
    fn check_lease(&self, lease: Duration) -> Result<()> {
        KafkaPublisher::check_lease(self, lease)
    }

    fn deliver<'a>(
        &'a self,
        event: &'a ClaimedEvent,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(unless_lease_lost(delivery, async move {
            self.produce_all(&[(event, delivery)])
                .await
                .pop()
                .unwrap_or_else(|| Err(HandlerError::retry("no result for this event")))
        }))
    }

    fn max_batch(&self) -> usize {
        self.shared.config.batch.unwrap_or(1)
    }

    fn deliver_batch<'a>(
        &'a self,
        items: &'a [(ClaimedEvent, Delivery)],
    ) -> BoxFuture<'a, Vec<Result<(), HandlerError>>> {
        Box::pin(async move {
            let refs: Vec<(&ClaimedEvent, &Delivery)> = items.iter().map(|(e, d)| (e, d)).collect();
            let chunk = self.shared.config.batch.unwrap_or(1);
            let mut results = Vec::with_capacity(items.len());
            for part in refs.chunks(chunk) {
                results.extend(self.produce_all(part).await);
            }
            results
        })
    }
}

/// The partition Kafka's default partitioner picks for `key` among `partitions`: the positive
/// part of murmur2 (Kafka's seed) of the key's bytes, modulo the partition count.
pub fn partition_for(key: &[u8], partitions: i32) -> i32 {
    let hash = murmur2::murmur2(key, KAFKA_MURMUR2_SEED) & 0x7fff_ffff;
    let partitions = u32::try_from(partitions.max(1)).unwrap_or(1);
    i32::try_from(hash % partitions).unwrap_or(0)
}

/// A record's `CreateTime`. Kafka's protocol takes it from the producer's clock; it is
/// metadata for consumers (and for time-based retention), and the outbox computes no lease,
/// availability or age from it.
#[allow(clippy::disallowed_methods)]
fn record_timestamp() -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now()
}

async fn partition_count(
    client: &Client,
    topic: &str,
    wait: Duration,
) -> std::result::Result<Option<i32>, String> {
    let topics = tokio::time::timeout(wait, client.list_topics())
        .await
        .map_err(|_| format!("no answer within {wait:?}"))?
        .map_err(|e| e.to_string())?;
    Ok(topics
        .into_iter()
        .find(|t| t.name == topic)
        .map(|t| i32::try_from(t.partitions.len()).unwrap_or(i32::MAX)))
}

fn produce_error(topic: &str, partition: i32, e: &KafkaError) -> HandlerError {
    let reason = format!("producing to Kafka topic `{topic}` partition {partition} failed: {e}");
    match e {
        // No retry makes the record smaller or valid.
        KafkaError::ServerError {
            protocol_error:
                ProtocolError::MessageTooLarge
                | ProtocolError::RecordListTooLarge
                | ProtocolError::InvalidRecord
                | ProtocolError::CorruptMessage,
            ..
        } => HandlerError::permanent(reason),
        _ => HandlerError::retry(format!(
            "{reason}; the broker may have written the record, and the retry carries the same Outbox-Event-Id"
        )),
    }
}

fn validate(config: &KafkaConfig) -> Result<()> {
    let topic = &config.topic;
    let valid = (1..=MAX_TOPIC_NAME).contains(&topic.len())
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !valid {
        return Err(Error::Config(format!(
            "`{topic}` is not a valid Kafka topic name: use 1 to {MAX_TOPIC_NAME} letters, digits, `.`, `_` and `-`"
        )));
    }
    if config.ack_timeout.is_zero() {
        return Err(Error::Config(
            "KafkaConfig::ack_timeout must be greater than zero".into(),
        ));
    }
    if config.batch == Some(0) {
        return Err(Error::Config(
            "KafkaConfig::batch must be at least 1 (or None for one event per call)".into(),
        ));
    }
    if let Some((partitions, replication)) = config.create_topic {
        if partitions < 1 || replication < 1 {
            return Err(Error::Config(format!(
                "KafkaConfig::create_topic needs at least 1 partition and a replication factor of at least 1, not ({partitions}, {replication})"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's own test vectors of its murmur2 (`UtilsTest.testMurmur2`, as signed 32-bit).
    #[test]
    fn keys_hash_like_kafkas_default_partitioner() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (key, expected) in cases {
            let hash = murmur2::murmur2(key, KAFKA_MURMUR2_SEED);
            assert_eq!(
                i32::from_ne_bytes(hash.to_ne_bytes()),
                expected,
                "{}",
                String::from_utf8_lossy(key)
            );
        }
        assert_eq!(partition_for(b"abc", 1), 0);
        let p = partition_for(b"order-42", 6);
        assert!((0..6).contains(&p));
        assert_eq!(partition_for(b"order-42", 6), p, "stable");
    }

    #[test]
    fn settings_are_validated() {
        assert!(validate(&KafkaConfig::default()).is_ok());
        for bad in ["", ".", "a b", "a/b", &"x".repeat(250)] {
            let config = KafkaConfig {
                topic: bad.to_owned(),
                ..KafkaConfig::default()
            };
            let err = validate(&config).unwrap_err().to_string();
            assert!(err.contains("not a valid Kafka topic name"), "{bad}: {err}");
        }
        let zero = KafkaConfig {
            ack_timeout: Duration::ZERO,
            ..KafkaConfig::default()
        };
        assert!(validate(&zero).is_err());
        let no_partitions = KafkaConfig {
            create_topic: Some((0, 1)),
            ..KafkaConfig::default()
        };
        assert!(validate(&no_partitions).is_err());
    }
}

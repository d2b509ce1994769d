//! The ledger service on Kafka: reads the outbox topic partition by partition (rskafka) and
//! writes one ledger row per event through the inbox, keyed by the record's `Outbox-Event-Id`
//! header (the event id).
//!
//! Each record is applied in one transaction with its inbox row and the partition's next
//! offset, so the consumer's position and its effects commit together: after a crash it reads
//! again from the last committed record, and nothing is applied twice by the consumer itself.
//! The inbox drops what the producer wrote twice: a publisher retry after a lost
//! acknowledgement writes the record again at a new offset, with the same event id. A record
//! that can never be applied (no event id, a value that is not an envelope) is skipped, with
//! its position committed, so it cannot block the partition.

use std::time::Duration;

use outbox_runtime::inbox::{self, ApplyOutcome};
use outbox_runtime::publish::{Envelope, HEADER_EVENT_ID};
use rskafka::client::Client;
use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::record::RecordAndOffset;
use sqlx::PgPool;
use uuid::Uuid;

/// The inbox consumer name of the ledger service.
pub const CONSUMER: &str = "ledger";

/// One row per applied event. No unique key on purpose: a second application would show up
/// as a second row.
const CREATE_LEDGER: &str = "CREATE TABLE IF NOT EXISTS ledger (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id    uuid   NOT NULL,
    event_type  text   NOT NULL,
    total_cents bigint NOT NULL
)";

/// Where the ledger stands in each partition: the offset of the next record to read.
const CREATE_POSITIONS: &str = "CREATE TABLE IF NOT EXISTS ledger_positions (
    topic       text    NOT NULL,
    partition   integer NOT NULL,
    next_offset bigint  NOT NULL,
    PRIMARY KEY (topic, partition)
)";

const INSERT_ENTRY: &str =
    "INSERT INTO ledger (event_id, event_type, total_cents) VALUES ($1, $2, $3)";

const READ_POSITION: &str =
    "SELECT next_offset FROM ledger_positions WHERE topic = $1 AND partition = $2";

const SAVE_POSITION: &str = "INSERT INTO ledger_positions (topic, partition, next_offset) \
     VALUES ($1, $2, $3) ON CONFLICT (topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset";

/// The most bytes one fetch asks for.
const FETCH_BYTES: i32 = 1024 * 1024;
/// How long a fetch waits on the broker for records to arrive.
const FETCH_WAIT_MS: i32 = 200;

/// Any failure of the consumer.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What one run of the consumer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LedgerCounts {
    /// Records read and applied or recognised.
    pub received: u64,
    /// Ledger rows written.
    pub applied: u64,
    /// Records the inbox recognised and dropped.
    pub duplicates: u64,
    /// Records skipped because they can never be applied.
    pub skipped: u64,
}

/// Create the ledger tables.
pub async fn create_schema(pool: &PgPool) -> sqlx::Result<()> {
    sqlx::query(CREATE_LEDGER).execute(pool).await?;
    sqlx::query(CREATE_POSITIONS).execute(pool).await?;
    Ok(())
}

/// Read `topic` (all its `partitions`) from the committed positions until `expected` records
/// have been handled, or fail when `within` passes first.
pub async fn consume(
    pool: &PgPool,
    client: &Client,
    topic: &str,
    partitions: i32,
    expected: u64,
    within: Duration,
) -> Result<LedgerCounts, BoxError> {
    let mut readers = Vec::new();
    for partition in 0..partitions {
        let reader = client
            .partition_client(topic.to_owned(), partition, UnknownTopicHandling::Retry)
            .await?;
        readers.push(reader);
    }
    let mut counts = LedgerCounts::default();
    let run = async {
        while counts.received + counts.skipped < expected {
            for (partition, reader) in (0..partitions).zip(&readers) {
                let from = position(pool, reader, topic, partition).await?;
                let (records, _high_watermark) = reader
                    .fetch_records(from, 1..FETCH_BYTES, FETCH_WAIT_MS)
                    .await?;
                // A fetch returns whole record batches: skip what is before the position.
                for record in records.into_iter().filter(|r| r.offset >= from) {
                    match apply(pool, topic, partition, &record).await? {
                        Some(ApplyOutcome::Applied) => counts.applied += 1,
                        Some(ApplyOutcome::Duplicate) => counts.duplicates += 1,
                        None => {
                            counts.skipped += 1;
                            continue;
                        }
                    }
                    counts.received += 1;
                }
            }
        }
        Ok::<(), BoxError>(())
    };
    match tokio::time::timeout(within, run).await {
        Ok(Ok(())) => Ok(counts),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!(
            "the ledger handled {} of {expected} records within {within:?} ({counts:?})",
            counts.received + counts.skipped
        )
        .into()),
    }
}

/// The next offset to read in `partition`: the committed one, or the earliest kept.
async fn position(
    pool: &PgPool,
    reader: &PartitionClient,
    topic: &str,
    partition: i32,
) -> Result<i64, BoxError> {
    let saved: Option<i64> = sqlx::query_scalar(READ_POSITION)
        .bind(topic)
        .bind(partition)
        .fetch_optional(pool)
        .await?;
    match saved {
        Some(offset) => Ok(offset),
        None => Ok(reader.get_offset(OffsetAt::Earliest).await?),
    }
}

/// The event id and envelope of a record, if it has both and they agree.
fn decode(record: &RecordAndOffset) -> Option<(Uuid, Envelope)> {
    let id = record.record.headers.get(HEADER_EVENT_ID)?;
    let event_id: Uuid = std::str::from_utf8(id).ok()?.parse().ok()?;
    let envelope: Envelope = serde_json::from_slice(record.record.value.as_deref()?).ok()?;
    (envelope.id == event_id).then_some((event_id, envelope))
}

/// Apply one record: the ledger row (unless the inbox knows the event) and the partition's new
/// position, in one transaction. `None`: the record can never be applied; only the position
/// moves.
async fn apply(
    pool: &PgPool,
    topic: &str,
    partition: i32,
    record: &RecordAndOffset,
) -> Result<Option<ApplyOutcome>, BoxError> {
    let mut tx = pool.begin().await?;
    let outcome = match decode(record) {
        Some((event_id, envelope)) => {
            let outcome = inbox::apply_once(&mut tx, CONSUMER, event_id).await?;
            if outcome == ApplyOutcome::Applied {
                sqlx::query(INSERT_ENTRY)
                    .bind(event_id)
                    .bind(&envelope.event_type)
                    .bind(envelope.payload["total_cents"].as_i64().unwrap_or(0))
                    .execute(&mut *tx)
                    .await?;
            }
            Some(outcome)
        }
        None => None,
    };
    sqlx::query(SAVE_POSITION)
        .bind(topic)
        .bind(partition)
        .bind(record.offset + 1)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(outcome)
}

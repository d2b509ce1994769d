//! The ledger service: a RabbitMQ consumer of the outbox's events. It writes one ledger row per
//! event through the inbox, keyed by the message's `message_id` (the event id), and acks a
//! message only after its transaction has committed.
//!
//! RabbitMQ does not deduplicate: a publisher retry after a lost confirm, a connection that
//! died mid-batch, or a message redelivered because its ack was lost all reach the queue or
//! the consumer again, with the same `message_id`. The inbox turns them into "applied once".
//! A message that can never be applied (no `message_id`, a body that is not an envelope) is
//! rejected without requeueing, so it cannot block the queue: give the queue a dead-letter
//! exchange to keep such messages.

use std::time::Duration;

use futures::StreamExt;
use lapin::Channel;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, BasicRejectOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use outbox_runtime::inbox::{self, ApplyOutcome};
use outbox_runtime::publish::Envelope;
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

const INSERT_ENTRY: &str =
    "INSERT INTO ledger (event_id, event_type, total_cents) VALUES ($1, $2, $3)";

/// Messages fetched ahead of the acks: enough to keep the consumer busy, few enough that a
/// crash redelivers little.
const PREFETCH: u16 = 50;

/// Any failure of the consumer.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What one run of the consumer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LedgerCounts {
    /// Messages received and acked after being applied or recognised.
    pub received: u64,
    /// Ledger rows written.
    pub applied: u64,
    /// Messages the inbox recognised and dropped.
    pub duplicates: u64,
    /// Messages rejected because they can never be applied.
    pub rejected: u64,
}

/// Create the ledger table.
pub async fn create_schema(pool: &PgPool) -> sqlx::Result<()> {
    sqlx::query(CREATE_LEDGER).execute(pool).await.map(|_| ())
}

/// Declare the durable queue `queue` and bind it to `exchange` for `binding_key` (a topic
/// pattern such as `order.*` or `#`).
pub async fn declare_queue(
    channel: &Channel,
    queue: &str,
    exchange: &str,
    binding_key: &str,
) -> lapin::Result<()> {
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue, durable, FieldTable::default())
        .await?;
    channel
        .queue_bind(
            queue,
            exchange,
            binding_key,
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
}

/// Consume `queue` until `expected` messages have been handled, or fail when `within` passes
/// first (or the channel closes).
pub async fn consume(
    pool: &PgPool,
    channel: &Channel,
    queue: &str,
    expected: u64,
    within: Duration,
) -> Result<LedgerCounts, BoxError> {
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    let tag = format!("{CONSUMER}-{}", Uuid::new_v4().simple());
    let mut deliveries = channel
        .basic_consume(
            queue,
            &tag,
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut counts = LedgerCounts::default();
    let run = async {
        while counts.received + counts.rejected < expected {
            let Some(delivery) = deliveries.next().await else {
                return Err::<(), BoxError>("the consumer was cancelled by the broker".into());
            };
            let delivery = delivery?;
            let Some((event_id, envelope)) = decode(&delivery) else {
                // Never requeued: it would come back forever.
                delivery
                    .reject(BasicRejectOptions { requeue: false })
                    .await?;
                counts.rejected += 1;
                continue;
            };
            match apply(pool, event_id, &envelope).await? {
                ApplyOutcome::Applied => counts.applied += 1,
                ApplyOutcome::Duplicate => counts.duplicates += 1,
            }
            // Only after the commit: a crash before this line redelivers the message, and the
            // inbox drops the redelivery.
            delivery.ack(BasicAckOptions::default()).await?;
            counts.received += 1;
        }
        Ok(())
    };
    let outcome = tokio::time::timeout(within, run).await;
    // Stop receiving; messages prefetched but not acked go back to the queue.
    let _ = channel
        .basic_cancel(&tag, lapin::options::BasicCancelOptions::default())
        .await;
    match outcome {
        Ok(Ok(())) => Ok(counts),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!(
            "the ledger handled {} of {expected} messages within {within:?} ({counts:?})",
            counts.received + counts.rejected
        )
        .into()),
    }
}

/// The event id (the `message_id`) and the envelope of a message, if it has both and they
/// agree.
fn decode(delivery: &lapin::message::Delivery) -> Option<(Uuid, Envelope)> {
    let message_id = delivery.properties.message_id().as_ref()?;
    let event_id: Uuid = message_id.as_str().parse().ok()?;
    let envelope: Envelope = serde_json::from_slice(&delivery.data).ok()?;
    (envelope.id == event_id).then_some((event_id, envelope))
}

/// Write the ledger row and the inbox row in one transaction.
async fn apply(
    pool: &PgPool,
    event_id: Uuid,
    envelope: &Envelope,
) -> outbox_runtime::error::Result<ApplyOutcome> {
    let mut tx = pool.begin().await?;
    let outcome = inbox::apply_once(&mut tx, CONSUMER, event_id).await?;
    if outcome == ApplyOutcome::Applied {
        sqlx::query(INSERT_ENTRY)
            .bind(event_id)
            .bind(&envelope.event_type)
            .bind(envelope.payload["total_cents"].as_i64().unwrap_or(0))
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(outcome)
}

//! The billing service: a JetStream consumer of `order.confirmed`. It writes one invoice per
//! event through the inbox, keyed by the message's `Nats-Msg-Id` (the event id), and acks a
//! message only after its transaction has committed.
//!
//! The stream's duplicate window drops the redeliveries the publisher makes. The consumer
//! still needs its own deduplication, because it redelivers messages too: an ack can be lost,
//! and a consumer that loses its position replays the stream. The example shows this by
//! consuming the stream twice, the second time from the start as a new consumer.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull};
use futures::StreamExt;
use outbox_runtime::inbox::{self, ApplyOutcome};
use outbox_runtime::publish::Envelope;
use sqlx::PgPool;
use tracing::Instrument;
use uuid::Uuid;

use crate::events::OrderConfirmed;

/// The inbox consumer name of the billing service.
pub const CONSUMER: &str = "billing";

/// One row per invoice. Like `shipments`, it has no unique key, so a second application would
/// show up as a second invoice.
const CREATE_INVOICES: &str = "CREATE TABLE IF NOT EXISTS invoices (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id    uuid   NOT NULL,
    event_id    uuid   NOT NULL,
    total_cents bigint NOT NULL
)";

const INSERT_INVOICE: &str =
    "INSERT INTO invoices (order_id, event_id, total_cents) VALUES ($1, $2, $3)";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What one pass over the stream did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BillingCounts {
    /// Messages received (and acked).
    pub received: u64,
    /// Invoices written.
    pub applied: u64,
    /// Messages the inbox recognised and dropped.
    pub duplicates: u64,
}

/// Create the billing table.
pub async fn create_schema(pool: &PgPool) -> sqlx::Result<()> {
    sqlx::query(CREATE_INVOICES).execute(pool).await.map(|_| ())
}

/// Consume `stream` from its first message with a new consumer until `expected` messages have
/// been handled, or 10 s have passed with some still missing.
pub async fn consume_from_start(
    pool: &PgPool,
    stream: &jetstream::stream::Stream,
    expected: u64,
) -> Result<BillingCounts, BoxError> {
    let consumer = stream
        .create_consumer(pull::Config {
            deliver_policy: jetstream::consumer::DeliverPolicy::All,
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    let mut counts = BillingCounts::default();
    let started = Instant::now();
    while counts.received < expected {
        if started.elapsed() > Duration::from_secs(10) {
            return Err(format!(
                "billing received {} of {expected} messages within 10 s",
                counts.received
            )
            .into());
        }
        let mut batch = consumer
            .fetch()
            .max_messages(usize::try_from(expected - counts.received).unwrap_or(usize::MAX))
            .expires(Duration::from_millis(500))
            .messages()
            .await?;
        while let Some(message) = batch.next().await {
            let message = message?;
            let event_id: Uuid = message
                .headers
                .as_ref()
                .and_then(|h| h.get("Nats-Msg-Id"))
                .ok_or("a message without Nats-Msg-Id")?
                .as_str()
                .parse()?;
            let envelope: Envelope = serde_json::from_slice(&message.payload)?;
            let event: OrderConfirmed = serde_json::from_value(envelope.payload)?;
            // The consumer's span continues the trace of the delivery that published it.
            let span = tracing::info_span!("billing.apply_once", %event_id);
            if let Some(headers) = &message.headers {
                let pairs: Vec<(String, String)> = headers
                    .iter()
                    .flat_map(|(name, values)| {
                        values
                            .iter()
                            .map(move |v| (name.to_string(), v.as_str().to_owned()))
                    })
                    .collect();
                outbox_runtime::inbox::continue_trace(
                    &span,
                    pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                );
            }
            match apply(pool, event_id, &event).instrument(span).await? {
                ApplyOutcome::Applied => counts.applied += 1,
                ApplyOutcome::Duplicate => counts.duplicates += 1,
            }
            // Only after the commit: a crash before this line redelivers, and the inbox
            // drops the redelivery.
            message.ack().await?;
            counts.received += 1;
        }
    }
    Ok(counts)
}

async fn apply(
    pool: &PgPool,
    event_id: Uuid,
    event: &OrderConfirmed,
) -> outbox_runtime::error::Result<ApplyOutcome> {
    let mut tx = pool.begin().await?;
    let outcome = inbox::apply_once(&mut tx, CONSUMER, event_id).await?;
    if outcome == ApplyOutcome::Applied {
        sqlx::query(INSERT_INVOICE)
            .bind(event.order_id)
            .bind(event_id)
            .bind(event.total_cents)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(outcome)
}

//! Publishers: [`crate::Sink`]s that hand claimed events to a broker or an HTTP receiver.
//!
//! - `nats::NatsPublisher` (feature `nats`): JetStream, with the event id as `Nats-Msg-Id` so
//!   the stream's duplicate window drops redeliveries; an event counts as delivered only once the
//!   stream acknowledged it.
//! - `http::HttpPublisher` (feature `http`): a JSON `POST` with the stable `Idempotency-Key`,
//!   one event per request or, in batch mode, an array answered with per-item results.
//! - [`amqp::AmqpPublisher`] (feature `amqp`): RabbitMQ, persistent messages to an exchange
//!   with the event id as `message_id`; an event counts as delivered only after the broker's
//!   publisher confirm.
//! - [`kafka::KafkaPublisher`] (feature `kafka`): Kafka, keyed by the aggregate id so a
//!   partition keeps an aggregate's order, acknowledged by all in-sync replicas.
//! - [`FanOut`]: one sink that hands each event to several (a broker and a webhook), delivered
//!   only when all of them accepted it.
//!
//! Delivery is at least once: a publisher can send an event that the receiver already has (a lost
//! acknowledgement, a worker that crashed after sending). Both publishers send the same key on
//! every attempt so the receiver can drop the duplicate, for example with [`crate::inbox`].
//!
//! A publisher whose broker (or receiver) went away does not open a connection per delivery:
//! it reconnects one attempt at a time with capped exponential backoff and jitter
//! ([`reconnect::ReconnectBackoff`], one setting per publisher config), and deliveries that
//! arrive meanwhile fail at once as retries.
//!
//! Both publishers describe an event the same way: the [`Envelope`] as the body, and the
//! metadata of [`metadata_headers`] as message headers.
//!
//! ```no_run
//! # #[cfg(all(feature = "nats", feature = "http"))]
//! # async fn f(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use outbox_runtime::publish::FanOut;
//! use outbox_runtime::publish::http::{HttpConfig, HttpPublisher};
//! use outbox_runtime::publish::nats::{NatsConfig, NatsPublisher};
//! use outbox_runtime::worker::Worker;
//!
//! let lease = Duration::from_secs(30);
//! let broker = NatsPublisher::connect("nats://127.0.0.1:4222", NatsConfig::default()).await?;
//! broker.ensure_stream("OUTBOX", Duration::from_secs(2 * 3600)).await?; // subjects `outbox.>`
//! let webhook = HttpPublisher::new("https://billing.internal/events", HttpConfig::default())?;
//! broker.check_lease(lease)?; // the ack timeout must be shorter than the lease
//! webhook.check_lease(lease)?; // so must the request timeout
//! let sink = FanOut::new().to("nats", broker).to("billing", webhook);
//! let worker = Worker::builder(pool, sink).lease(lease).start().await?;
//! # Ok(()) }
//! ```

#[cfg(feature = "amqp")]
pub mod amqp;
pub mod fanout;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(any(
    feature = "nats",
    feature = "http",
    feature = "amqp",
    feature = "kafka"
))]
pub mod reconnect;
#[cfg(any(
    feature = "nats",
    feature = "http",
    feature = "amqp",
    feature = "kafka"
))]
pub mod redact;

pub use fanout::FanOut;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::delivery::Delivery;
#[cfg(any(
    feature = "nats",
    feature = "http",
    feature = "amqp",
    feature = "kafka"
))]
use crate::delivery::HandlerError;
use crate::store::ClaimedEvent;

/// Header carrying the stable idempotency key (the event id) on HTTP requests.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// Header carrying the event id.
pub const HEADER_EVENT_ID: &str = "Outbox-Event-Id";
/// Header carrying the event name.
pub const HEADER_EVENT_TYPE: &str = "Outbox-Event-Type";
/// Header carrying the stored payload version.
pub const HEADER_EVENT_VERSION: &str = "Outbox-Event-Version";
/// Header carrying the aggregate type, when the event has an aggregate.
pub const HEADER_AGGREGATE_TYPE: &str = "Outbox-Aggregate-Type";
/// Header carrying the aggregate id, when the event has an aggregate.
pub const HEADER_AGGREGATE_ID: &str = "Outbox-Aggregate-Id";
/// Header carrying the aggregate version, when the event has one.
pub const HEADER_AGGREGATE_VERSION: &str = "Outbox-Aggregate-Version";
/// Header carrying this attempt's number (1 for the first delivery). Receivers can log it; they
/// must not use it for deduplication (the idempotency key does that).
pub const HEADER_ATTEMPT: &str = "Outbox-Attempt";

/// Longest header name copied from an event's stored headers.
const MAX_HEADER_NAME: usize = 64;
/// Longest header value copied from an event's stored headers.
const MAX_HEADER_VALUE: usize = 4096;

/// How a publisher describes one event in a request or message body.
///
/// The payload is sent as stored, at its stored `version`: receivers that know several versions
/// of an event decide themselves how to read an older one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// The stable event id; also the idempotency key.
    pub id: Uuid,
    /// The event name.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The stored payload version.
    pub version: i32,
    /// The aggregate, when the event has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate: Option<EnvelopeAggregate>,
    /// The event's stored headers that are safe to forward (trace context and the like).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub headers: serde_json::Map<String, serde_json::Value>,
    /// The JSON payload.
    pub payload: serde_json::Value,
}

/// The aggregate part of an [`Envelope`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvelopeAggregate {
    /// Aggregate type (for example `order`).
    #[serde(rename = "type")]
    pub aggregate_type: String,
    /// Aggregate id.
    pub id: String,
    /// Aggregate version, when the event carries one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
}

impl Envelope {
    /// The envelope of a claimed event.
    pub fn of(event: &ClaimedEvent) -> Envelope {
        let aggregate = match (&event.aggregate_type, &event.aggregate_id) {
            (Some(t), Some(id)) => Some(EnvelopeAggregate {
                aggregate_type: t.clone(),
                id: id.clone(),
                version: event.aggregate_version,
            }),
            _ => None,
        };
        Envelope {
            id: event.event_id,
            event_type: event.event_type.clone(),
            version: event.event_version,
            aggregate,
            headers: forwarded_headers(&event.headers)
                .into_iter()
                .map(|(k, v)| (k, v.into()))
                .collect(),
            payload: event.payload.clone(),
        }
    }
}

/// The headers a publisher sends with an event, in a fixed order: the event id, name and
/// version, the attempt, the aggregate when there is one, then the event's stored headers that
/// are safe to forward (see [`forwarded_headers`]), such as a W3C `traceparent`. With the
/// `opentelemetry` feature, `traceparent` and `tracestate` are those of the current (delivery)
/// span when there is one, so the receiver's span is a child of the delivery.
pub fn metadata_headers(event: &ClaimedEvent, delivery: &Delivery) -> Vec<(String, String)> {
    let mut headers = vec![
        (HEADER_EVENT_ID.to_owned(), event.event_id.to_string()),
        (HEADER_EVENT_TYPE.to_owned(), event.event_type.clone()),
        (
            HEADER_EVENT_VERSION.to_owned(),
            event.event_version.to_string(),
        ),
        (HEADER_ATTEMPT.to_owned(), delivery.attempt().to_string()),
    ];
    if let Some(aggregate) = delivery.aggregate() {
        headers.push((
            HEADER_AGGREGATE_TYPE.to_owned(),
            aggregate.aggregate_type.clone(),
        ));
        headers.push((HEADER_AGGREGATE_ID.to_owned(), aggregate.id.clone()));
        if let Some(version) = aggregate.version {
            headers.push((HEADER_AGGREGATE_VERSION.to_owned(), version.to_string()));
        }
    }
    headers.extend(forwarded_headers(&event.headers));
    // The receiver's span continues the delivery span (itself a child of the producer's).
    #[cfg(feature = "opentelemetry")]
    crate::trace_context::forward_current(&mut headers);
    headers
}

/// The stored headers of an event (a JSON object) that can travel as message headers.
///
/// Kept: string, number and boolean values whose name is 1 to 64 characters of letters, digits,
/// `-`, `_` and `.`, and whose value is at most 4096 printable ASCII characters. Dropped, with a
/// warning: anything else, and names a publisher sets itself (`Outbox-*`, `Nats-*`,
/// `Idempotency-Key`, `Content-*`), so a stored header can never change how an event is
/// deduplicated or framed.
pub fn forwarded_headers(stored: &serde_json::Value) -> Vec<(String, String)> {
    let Some(object) = stored.as_object() else {
        return Vec::new();
    };
    let mut kept = Vec::with_capacity(object.len());
    for (name, value) in object {
        let value = match value {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            _ => {
                tracing::warn!(header = %name, "event header is not a string, number or boolean; not forwarded");
                continue;
            }
        };
        if !is_forwardable_name(name) || !is_forwardable_value(&value) {
            tracing::warn!(header = %name, "event header has a reserved or invalid name, or an invalid value; not forwarded");
            continue;
        }
        kept.push((name.clone(), value));
    }
    kept
}

fn is_forwardable_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    let reserved = lower.starts_with("outbox-")
        || lower.starts_with("nats-")
        || lower.starts_with("content-")
        || lower == IDEMPOTENCY_KEY.to_ascii_lowercase()
        || lower == "host"
        || lower == "content-length";
    !reserved
        && (1..=MAX_HEADER_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn is_forwardable_value(value: &str) -> bool {
    value.len() <= MAX_HEADER_VALUE && value.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// Run `send` unless, or until, the delivery's lease is lost (the worker could not renew it, or
/// shutdown's deadline passed): then another worker may deliver the event, and this attempt's
/// outcome could not be recorded anyway, so the request or publish is abandoned. A lease lost
/// before sending sends nothing.
#[cfg(any(
    feature = "nats",
    feature = "http",
    feature = "amqp",
    feature = "kafka"
))]
pub(crate) async fn unless_lease_lost(
    delivery: &Delivery,
    send: impl std::future::Future<Output = Result<(), HandlerError>>,
) -> Result<(), HandlerError> {
    tokio::select! {
        biased;
        () = delivery.lease_lost().cancelled() => Err(HandlerError::retry(
            "the lease was lost before the receiver answered; the event will be delivered again \
             (the receiver may already have it)",
        )),
        outcome = send => outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn forwards_trace_context_and_drops_reserved_or_invalid_headers() {
        let stored = json!({
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "tenant": 42,
            "Idempotency-Key": "spoofed",
            "Outbox-Event-Id": "spoofed",
            "Nats-Msg-Id": "spoofed",
            "bad name": "x",
            "multi": "line\r\nInjected: yes",
            "nested": {"a": 1},
        });
        let mut kept = forwarded_headers(&stored);
        kept.sort();
        assert_eq!(
            kept,
            vec![
                ("tenant".to_owned(), "42".to_owned()),
                (
                    "traceparent".to_owned(),
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned()
                ),
            ]
        );
    }

    proptest::proptest! {
        /// Whatever a producer stores as headers, what is forwarded can never set a header the
        /// publisher owns (in any letter case), never carries a line break or control byte, and
        /// stays within the documented name and value bounds.
        #[test]
        fn forwarded_headers_never_override_or_inject(
            headers in proptest::collection::btree_map(
                "(?i:outbox-|nats-|content-|idempotency-key|host)?[A-Za-z0-9._ :-]{0,12}|\\PC{0,8}",
                "[ -~]{0,20}|\\PC{0,10}|[a-z]{0,3}\r\n[A-Za-z-]{1,8}: [a-z]{1,8}",
                0..8,
            ),
        ) {
            let stored = serde_json::to_value(&headers).unwrap();
            for (name, value) in forwarded_headers(&stored) {
                let lower = name.to_ascii_lowercase();
                proptest::prop_assert!(
                    !lower.starts_with("outbox-") && !lower.starts_with("nats-")
                        && !lower.starts_with("content-") && lower != "idempotency-key" && lower != "host",
                    "reserved header forwarded: {:?}", name
                );
                proptest::prop_assert!((1..=MAX_HEADER_NAME).contains(&name.len()), "{:?}", name);
                proptest::prop_assert!(
                    name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')),
                    "{:?}", name
                );
                proptest::prop_assert!(value.len() <= MAX_HEADER_VALUE);
                proptest::prop_assert!(value.bytes().all(|b| (0x20..0x7f).contains(&b)), "{:?}", value);
                proptest::prop_assert_eq!(Some(&value), headers.get(&name), "forwarded unchanged");
            }
        }
    }
}

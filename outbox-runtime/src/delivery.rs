//! What a handler is told about the delivery it runs in, and how it reports failure.

use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::store::ClaimedEvent;

/// The aggregate an event belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aggregate {
    /// Aggregate type (for example `order`).
    pub aggregate_type: String,
    /// Aggregate id.
    pub id: String,
    /// Aggregate version, when the event carries one.
    pub version: Option<i64>,
}

/// Context of one delivery attempt. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Delivery {
    inner: Arc<DeliveryInner>,
}

#[derive(Debug)]
struct DeliveryInner {
    event_id: Uuid,
    event_type: String,
    event_version: u32,
    attempt: u32,
    max_attempts: u32,
    aggregate: Option<Aggregate>,
    headers: serde_json::Value,
    lease_lost: CancellationToken,
}

impl Delivery {
    /// Build the context of a claimed event. `lease_lost` is cancelled when the worker learns it
    /// no longer owns the event (the lease could not be renewed) or when shutdown's deadline ends.
    pub fn new(event: &ClaimedEvent, lease_lost: CancellationToken) -> Self {
        let aggregate = match (&event.aggregate_type, &event.aggregate_id) {
            (Some(t), Some(id)) => Some(Aggregate {
                aggregate_type: t.clone(),
                id: id.clone(),
                version: event.aggregate_version,
            }),
            _ => None,
        };
        Delivery {
            inner: Arc::new(DeliveryInner {
                event_id: event.event_id,
                event_type: event.event_type.clone(),
                event_version: u32::try_from(event.event_version).unwrap_or(0),
                attempt: u32::try_from(event.attempts).unwrap_or(0),
                max_attempts: u32::try_from(event.max_attempts).unwrap_or(0),
                aggregate,
                headers: event.headers.clone(),
                lease_lost,
            }),
        }
    }

    /// The event id: generated once per operation key, the same on every attempt.
    pub fn event_id(&self) -> Uuid {
        self.inner.event_id
    }

    /// The idempotency key to give receivers (for example an `Idempotency-Key` header). It is
    /// derived from the operation key, so every attempt of one event sends the same key.
    pub fn idempotency_key(&self) -> String {
        self.inner.event_id.to_string()
    }

    /// Event name as stored.
    pub fn event_type(&self) -> &str {
        &self.inner.event_type
    }

    /// The version the payload was stored with (before any upcast).
    pub fn stored_version(&self) -> u32 {
        self.inner.event_version
    }

    /// This attempt's number, starting at 1 (attempts are charged when an event is claimed).
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }

    /// The number of attempts after which the event is exhausted.
    pub fn max_attempts(&self) -> u32 {
        self.inner.max_attempts
    }

    /// The aggregate of the event, if it has one.
    pub fn aggregate(&self) -> Option<&Aggregate> {
        self.inner.aggregate.as_ref()
    }

    /// Headers stored with the event (a JSON object).
    pub fn headers(&self) -> &serde_json::Value {
        &self.inner.headers
    }

    /// Cancelled when the lease was lost: another worker may now deliver the event, so a long
    /// handler should stop at its next safe point.
    pub fn lease_lost(&self) -> &CancellationToken {
        &self.inner.lease_lost
    }
}

/// How a delivery failed, and what should happen next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureKind {
    /// Try again later: after `after`, or after the worker's backoff when `None`.
    Retry {
        /// A delay the handler asks for (for example from a `Retry-After` header).
        after: Option<Duration>,
    },
    /// Never try again: the event goes to `exhausted` with the reason kept.
    Permanent,
}

/// The error a handler returns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HandlerError {
    /// Retry or permanent.
    pub kind: FailureKind,
    /// The reason, stored in `last_error` and logged with the failure.
    pub message: String,
    /// Text that came from outside, such as the start of a receiver's response body: stored in
    /// `last_error` after the message, but logged only at DEBUG, since a receiver decides what
    /// it holds (publishers redact their own secrets from it first).
    pub detail: Option<String>,
}

impl HandlerError {
    /// A failure worth retrying after the worker's backoff.
    pub fn retry(reason: impl std::fmt::Display) -> Self {
        HandlerError {
            kind: FailureKind::Retry { after: None },
            message: reason.to_string(),
            detail: None,
        }
    }

    /// A failure worth retrying after at least `after`.
    pub fn retry_after(reason: impl std::fmt::Display, after: Duration) -> Self {
        HandlerError {
            kind: FailureKind::Retry { after: Some(after) },
            message: reason.to_string(),
            detail: None,
        }
    }

    /// A failure that no retry can fix (a rejected payload, an unknown version).
    pub fn permanent(reason: impl std::fmt::Display) -> Self {
        HandlerError {
            kind: FailureKind::Permanent,
            message: reason.to_string(),
            detail: None,
        }
    }

    /// The same failure with `detail` attached (see [`HandlerError::detail`]).
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// What `last_error` records: the message, then the detail when there is one.
    pub fn stored_reason(&self) -> String {
        match &self.detail {
            Some(detail) => format!("{}: {detail}", self.message),
            None => self.message.clone(),
        }
    }

    /// Whether this failure ends the event.
    pub fn is_permanent(&self) -> bool {
        self.kind == FailureKind::Permanent
    }
}

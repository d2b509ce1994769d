//! Shared by the dispatch tests: an order event in two versions, a recording handler, and the
//! claim -> deliver -> complete/fail loop the worker runs, written out so the tests can see
//! every step.

#![allow(dead_code)] // each test binary uses a different part

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::store::{ClaimedEvent, FailOutcome, Ownership};
use outbox_runtime::{Delivery, Event, HandlerError, Sink, Store};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The current version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "order.confirmed", version = 2)]
pub struct OrderConfirmed {
    #[outbox(aggregate_id)]
    pub order_id: Uuid,
    pub total_cents: i64,
    pub currency: String,
}

/// Version 1 had no currency: everything was in EUR.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1, upcast = OrderConfirmed)]
pub struct OrderConfirmedV1 {
    #[outbox(aggregate_id)]
    pub order_id: Uuid,
    pub total_cents: i64,
}

impl From<OrderConfirmedV1> for OrderConfirmed {
    fn from(v1: OrderConfirmedV1) -> Self {
        OrderConfirmed {
            order_id: v1.order_id,
            total_cents: v1.total_cents,
            currency: "EUR".into(),
        }
    }
}

/// What a handler saw: the event and the parts of its delivery context.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen<E> {
    pub event: E,
    pub event_id: Uuid,
    pub attempt: u32,
    pub stored_version: u32,
    pub aggregate: Option<(String, String)>,
}

impl<E> Seen<E> {
    pub fn new(event: E, ctx: &Delivery) -> Self {
        Seen {
            event,
            event_id: ctx.event_id(),
            attempt: ctx.attempt(),
            stored_version: ctx.stored_version(),
            aggregate: ctx
                .aggregate()
                .map(|a| (a.aggregate_type.clone(), a.id.clone())),
        }
    }
}

/// A list the handlers append to.
pub type Record<E> = Arc<Mutex<Vec<Seen<E>>>>;

/// The outcome of one delivery, as the worker would record it.
#[derive(Debug)]
pub struct Outcome {
    pub event: ClaimedEvent,
    pub result: Result<(), HandlerError>,
}

/// Claim everything ready, deliver each event through `sink`, then complete it or record the
/// failure (permanent failures go to exhausted), as the worker does.
pub async fn deliver_ready(store: &Store, sink: &dyn Sink) -> Vec<Outcome> {
    let claimed = store
        .claim_batch("dispatch-test", 100, Duration::from_secs(30), false)
        .await
        .expect("claim");
    let mut outcomes = Vec::new();
    for event in claimed {
        let delivery = Delivery::new(&event, CancellationToken::new());
        let result = sink.deliver(&event, &delivery).await;
        match &result {
            Ok(()) => {
                assert_eq!(
                    store
                        .complete_if_owned(event.claim())
                        .await
                        .expect("complete"),
                    Ownership::Owned
                );
            }
            Err(err) => {
                let retry_after = match err.kind {
                    outbox_runtime::delivery::FailureKind::Retry { after } => {
                        after.unwrap_or(Duration::ZERO)
                    }
                    outbox_runtime::delivery::FailureKind::Permanent => Duration::ZERO,
                };
                let outcome = store
                    .fail_if_owned(
                        event.claim(),
                        &err.stored_reason(),
                        retry_after,
                        err.is_permanent(),
                    )
                    .await
                    .expect("fail");
                assert_ne!(outcome, FailOutcome::Lost);
            }
        }
        outcomes.push(Outcome { event, result });
    }
    outcomes
}

/// (status, attempts, last_error) of the event with `event_id`: its queue row's, or
/// (`delivered`, None, None) when it has none (a delivered event keeps no delivery state).
pub async fn row_state(store: &Store, event_id: Uuid) -> (String, Option<i32>, Option<String>) {
    sqlx::query_as(
        "SELECT coalesce(q.status, 'delivered'), q.attempts, q.last_error
         FROM outbox AS e LEFT JOIN outbox_queue AS q ON q.id = e.id WHERE e.event_id = $1",
    )
    .bind(event_id)
    .fetch_one(store.pool())
    .await
    .expect("event exists")
}

/// Insert a row the way another binary (or a corrupted producer) could have written it: any
/// name, version and payload, bypassing the typed enqueue.
pub async fn insert_raw(
    store: &Store,
    operation_key: &str,
    event_type: &str,
    version: i32,
    payload: serde_json::Value,
) -> Uuid {
    // Both rows, as the enqueue writes them: the event and its queue row.
    sqlx::query_scalar(
        "WITH e AS ( \
             INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload) \
             VALUES (gen_random_uuid(), $1, '\\x00', $2, $3, $4) \
             RETURNING id, event_id, aggregate_type, aggregate_id \
         ), q AS ( \
             INSERT INTO outbox_queue (id, aggregate_type, aggregate_id) \
             SELECT id, aggregate_type, aggregate_id FROM e \
         ) \
         SELECT event_id FROM e",
    )
    .bind(operation_key)
    .bind(event_type)
    .bind(version)
    .bind(payload)
    .fetch_one(store.pool())
    .await
    .expect("raw insert")
}

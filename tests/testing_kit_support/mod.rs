//! Shared by the test kit's tests: events (one in two versions), a sink that records every call,
//! and an effects table written by an idempotent and a non-idempotent handler.

#![allow(dead_code)] // each test uses a different part

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use outbox_runtime::inbox::{self, ApplyOutcome};
use outbox_runtime::store::ClaimedEvent;
use outbox_runtime::{Delivery, Event, HandlerError, Sink};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

/// The current version of an order event (an aggregate: the order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "order.placed", version = 2)]
pub struct OrderPlaced {
    #[outbox(aggregate_id)]
    pub order: u32,
    pub total_cents: i64,
    pub currency: String,
}

/// Version 1 had no currency: everything was in EUR.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1, upcast = OrderPlaced)]
pub struct OrderPlacedV1 {
    #[outbox(aggregate_id)]
    pub order: u32,
    pub total_cents: i64,
}

impl From<OrderPlacedV1> for OrderPlaced {
    fn from(v1: OrderPlacedV1) -> Self {
        OrderPlaced {
            order: v1.order,
            total_cents: v1.total_cents,
            currency: "EUR".into(),
        }
    }
}

/// An event without an aggregate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "ping", version = 1)]
pub struct Ping {
    pub n: u32,
}

/// Enqueue `event` under `key` in a transaction of its own.
pub async fn enqueue<E: outbox_runtime::event::CurrentEvent>(
    pool: &PgPool,
    event: E,
    key: &str,
) -> Uuid {
    let mut tx = pool.begin().await.unwrap();
    let id = event.enqueue(&mut tx, key).await.unwrap();
    tx.commit().await.unwrap();
    id
}

/// One call of the recording sink.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub event_id: Uuid,
    pub event_type: String,
    pub aggregate: Option<String>,
    pub attempt: u32,
    pub payload: serde_json::Value,
    /// Whether `lease_lost` was cancelled while the call ran (only watched on attempt 1 when
    /// the sink is told to wait for it).
    pub saw_lease_lost: bool,
}

/// A sink that accepts everything and records each call. With `wait_for_lease_loss`, its first
/// attempt of each event waits (at most 10 s) for `lease_lost` to be cancelled.
#[derive(Clone, Default)]
pub struct Recorder {
    pub calls: Arc<Mutex<Vec<Call>>>,
    pub wait_for_lease_loss: bool,
}

impl Recorder {
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn calls_of(&self, event_id: Uuid) -> usize {
        self.calls()
            .iter()
            .filter(|c| c.event_id == event_id)
            .count()
    }
}

impl Sink for Recorder {
    fn deliver<'a>(
        &'a self,
        event: &'a ClaimedEvent,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let mut saw_lease_lost = false;
            if self.wait_for_lease_loss && delivery.attempt() == 1 {
                tokio::time::timeout(Duration::from_secs(10), delivery.lease_lost().cancelled())
                    .await
                    .expect("lease_lost was not cancelled within 10 s");
                saw_lease_lost = true;
            }
            self.calls.lock().unwrap().push(Call {
                event_id: event.event_id,
                event_type: event.event_type.clone(),
                aggregate: event.aggregate_id.clone(),
                attempt: delivery.attempt(),
                payload: event.payload.clone(),
                saw_lease_lost,
            });
            Ok(())
        })
    }
}

/// A table of effects: one row per application of an event.
pub async fn create_effects(pool: &PgPool) {
    sqlx::query(
        "CREATE TABLE effects (id bigint GENERATED ALWAYS AS IDENTITY, event_id uuid NOT NULL, what text NOT NULL)",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// The effects, as (what, how many), sorted: the "business state" the checks observe.
pub async fn effects(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT what, count(*) FROM effects GROUP BY what ORDER BY what")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Write an effect for `event_id`: once (through the inbox) when `dedupe`, else every time.
pub async fn apply_effect(
    pool: &PgPool,
    event_id: Uuid,
    what: &str,
    dedupe: bool,
) -> Result<(), HandlerError> {
    let mut tx = pool.begin().await.map_err(HandlerError::retry)?;
    if dedupe
        && inbox::apply_once(&mut tx, "effects", event_id)
            .await
            .map_err(HandlerError::retry)?
            == ApplyOutcome::Duplicate
    {
        return Ok(());
    }
    sqlx::query("INSERT INTO effects (event_id, what) VALUES ($1, $2)")
        .bind(event_id)
        .bind(what)
        .execute(&mut *tx)
        .await
        .map_err(HandlerError::retry)?;
    tx.commit().await.map_err(HandlerError::retry)
}

/// An event and its delivery state, for checking what the store recorded. The state lives on
/// the event's queue row, which the completion deletes: a delivered event reads `delivered`
/// with every counter `None`.
#[derive(Debug, sqlx::FromRow)]
pub struct Row {
    pub status: String,
    pub attempts: Option<i32>,
    pub claim_version: Option<i64>,
    pub lease_expiries: Option<i32>,
    pub handler_failures: Option<i32>,
    pub last_error: Option<String>,
}

pub async fn row(pool: &PgPool, event_id: Uuid) -> Row {
    sqlx::query_as(
        "SELECT coalesce(q.status, 'delivered') AS status, q.attempts, q.claim_version,
                q.lease_expiries, q.handler_failures, q.last_error
         FROM outbox e LEFT JOIN outbox_queue q ON q.id = e.id
         WHERE e.event_id = $1",
    )
    .bind(event_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Delivered events of table `outbox`: those without a queue row.
pub async fn delivered(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM outbox e WHERE NOT EXISTS (SELECT 1 FROM outbox_queue q WHERE q.id = e.id)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

//! A real receiver for the worker tests: a [`Sink`] that applies an effect in the test
//! database (one row per idempotency key, deduplicated like a careful receiver would) and logs
//! every delivery it saw, with knobs to be slow, fail, panic, or lose its response.
//!
//! Shared by the in-process tests (`tests/worker_*.rs`, through `worker_support`) and the worker
//! process `examples/crash_target.rs` (through `#[path]`), so both record the same way.
#![allow(dead_code)] // each user needs a different subset

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use outbox_runtime::store::ClaimedEvent;
use outbox_runtime::{Delivery, HandlerError, Sink};
use sqlx::PgPool;

/// The receiver's tables: `receiver_log` (every delivery, in arrival order) and
/// `receiver_effects` (the effect, once per idempotency key).
pub const SETUP: &str = "
CREATE TABLE IF NOT EXISTS receiver_log (
    seq               bigserial PRIMARY KEY,
    event_id          uuid        NOT NULL,
    idempotency_key   text        NOT NULL,
    event_type        text        NOT NULL,
    attempt           integer     NOT NULL,
    worker            text        NOT NULL,
    aggregate_id      text,
    aggregate_version bigint,
    outcome           text        NOT NULL,
    claim_version     bigint      NOT NULL,
    -- The event's queue row in `outbox` as the delivery saw it (null when the event is not in
    -- that table). A delivered event keeps no state, so a test asks here what the claim that
    -- delivered it had: its worker, leases that ran out before, failures recorded before.
    claimed_by        text,
    lease_expiries    integer,
    handler_failures  integer,
    last_error        text,
    received_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS receiver_effects (
    idempotency_key text PRIMARY KEY,
    event_id        uuid NOT NULL,
    worker          text NOT NULL
);
CREATE TABLE IF NOT EXISTS worker_events (
    seq     bigserial PRIMARY KEY,
    worker  text NOT NULL,
    kind    text NOT NULL,
    row_id  bigint,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)";

const LOG: &str = "INSERT INTO receiver_log (event_id, idempotency_key, event_type, attempt, worker, aggregate_id, aggregate_version, outcome,
                                          claim_version, claimed_by, lease_expiries, handler_failures, last_error)
                   SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, q.claimed_by, q.lease_expiries, q.handler_failures, q.last_error
                   FROM (SELECT $10::bigint AS id) AS e LEFT JOIN outbox_queue AS q ON q.id = e.id";
const EFFECT: &str =
    "INSERT INTO receiver_effects (idempotency_key, event_id, worker) VALUES ($1, $2, $3)
                      ON CONFLICT (idempotency_key) DO NOTHING";

/// Create the receiver's tables.
pub async fn setup(pool: &PgPool) {
    sqlx::raw_sql(SETUP)
        .execute(pool)
        .await
        .expect("creating the receiver tables");
}

/// How the receiver behaves.
#[derive(Debug, Clone, Default)]
pub struct Knobs {
    /// Sleep this long before accepting each event.
    pub delay: Duration,
    /// Stop sleeping early when the worker says the lease was lost (and then fail).
    pub stop_on_lease_lost: bool,
    /// Fail attempts 1..=fail_first (a retryable error), without applying the effect.
    pub fail_first: u32,
    /// Ask for this delay when failing (`HandlerError::retry_after`).
    pub retry_after: Option<Duration>,
    /// Fail every attempt permanently.
    pub permanent: bool,
    /// Panic on attempts 1..=panic_first.
    pub panic_first: u32,
    /// Apply the effect on attempts 1..=lose_response_first, then report an error as if the
    /// response never reached the worker.
    pub lose_response_first: u32,
}

/// The recording sink.
#[derive(Debug, Clone)]
pub struct Receiver {
    pub pool: PgPool,
    pub worker: String,
    pub knobs: Knobs,
    /// Deliveries that reached the receiver (counted on entry, before any knob applies), shared
    /// by every clone: a test waits on it for "the handler is running".
    started: Arc<AtomicU64>,
}

impl Receiver {
    pub fn new(pool: PgPool, worker: &str, knobs: Knobs) -> Self {
        Receiver {
            pool,
            worker: worker.to_owned(),
            knobs,
            started: Arc::new(AtomicU64::new(0)),
        }
    }

    /// How many deliveries reached the receiver so far.
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }

    async fn log(
        &self,
        event: &ClaimedEvent,
        delivery: &Delivery,
        outcome: &str,
    ) -> Result<(), HandlerError> {
        sqlx::query(LOG)
            .bind(delivery.event_id())
            .bind(delivery.idempotency_key())
            .bind(&event.event_type)
            .bind(event.attempts)
            .bind(&self.worker)
            .bind(&event.aggregate_id)
            .bind(event.aggregate_version)
            .bind(outcome)
            .bind(event.claim_version)
            .bind(event.id)
            .execute(&self.pool)
            .await
            .map(|_| ())
            .map_err(|e| HandlerError::retry(format!("receiver log: {e}")))
    }

    async fn apply_effect(&self, delivery: &Delivery) -> Result<(), HandlerError> {
        sqlx::query(EFFECT)
            .bind(delivery.idempotency_key())
            .bind(delivery.event_id())
            .bind(&self.worker)
            .execute(&self.pool)
            .await
            .map(|_| ())
            .map_err(|e| HandlerError::retry(format!("receiver effect: {e}")))
    }

    async fn receive(&self, event: &ClaimedEvent, delivery: &Delivery) -> Result<(), HandlerError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        let k = &self.knobs;
        let attempt = delivery.attempt();
        if !k.delay.is_zero() {
            if k.stop_on_lease_lost {
                tokio::select! {
                    () = tokio::time::sleep(k.delay) => {}
                    () = delivery.lease_lost().cancelled() => {
                        self.log(event, delivery, "stopped_lease_lost").await?;
                        return Err(HandlerError::retry("lease lost"));
                    }
                }
            } else {
                tokio::time::sleep(k.delay).await;
            }
        }
        if attempt <= k.panic_first {
            self.log(event, delivery, "panic").await?;
            panic!(
                "receiver panics on attempt {attempt} of event {}",
                delivery.event_id()
            );
        }
        if k.permanent {
            self.log(event, delivery, "rejected").await?;
            return Err(HandlerError::permanent("receiver rejects this payload"));
        }
        if attempt <= k.fail_first {
            self.log(event, delivery, "failed").await?;
            return Err(match k.retry_after {
                Some(after) => HandlerError::retry_after("receiver unavailable", after),
                None => HandlerError::retry("receiver unavailable"),
            });
        }
        self.apply_effect(delivery).await?;
        if attempt <= k.lose_response_first {
            self.log(event, delivery, "lost_response").await?;
            return Err(HandlerError::retry(
                "response lost (connection reset after the receiver applied the effect)",
            ));
        }
        self.log(event, delivery, "ok").await
    }
}

impl Sink for Receiver {
    fn deliver<'a>(
        &'a self,
        event: &'a ClaimedEvent,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(self.receive(event, delivery))
    }
}

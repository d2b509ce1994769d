//! The shipping service: an HTTP receiver of `order.confirmed` that the example runs on
//! loopback. It applies each event once through the inbox: the shipment row and the inbox row
//! commit together, and a redelivered event (same `Idempotency-Key`) is answered `409` and
//! changes nothing.
//!
//! To show that this matters, it can lose its first few responses on purpose: it applies the
//! event, commits, then holds the answer past the publisher's timeout, so the publisher retries
//! an event the receiver already has.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use outbox_runtime::inbox::{self, ApplyOutcome};
use outbox_runtime::publish::Envelope;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use crate::events::OrderConfirmed;

/// The inbox consumer name of the shipping service.
pub const CONSUMER: &str = "shipping";

/// The receiver's own table. No unique key on purpose: a second application would show up as
/// a second shipment, so the counts prove the inbox did its job.
const CREATE_SHIPMENTS: &str = "CREATE TABLE IF NOT EXISTS shipments (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id    uuid   NOT NULL,
    event_id    uuid   NOT NULL,
    total_cents bigint NOT NULL
)";

const INSERT_SHIPMENT: &str =
    "INSERT INTO shipments (order_id, event_id, total_cents) VALUES ($1, $2, $3)";

/// What the receiver counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReceiverCounts {
    /// Requests received.
    pub requests: u64,
    /// Events applied (a shipment written).
    pub applied: u64,
    /// Redeliveries recognised by the inbox and dropped.
    pub duplicates: u64,
    /// Responses held back on purpose after applying.
    pub lost_responses: u64,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    applied: AtomicU64,
    duplicates: AtomicU64,
    lost_responses: AtomicU64,
}

struct Shared {
    pool: PgPool,
    counters: Counters,
    /// How many more responses to lose.
    lose: AtomicU64,
    /// How long a lost response is held (longer than the publisher's timeout).
    hold: Duration,
}

/// The running receiver; stops when dropped.
pub struct ShippingReceiver {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl ShippingReceiver {
    /// Create its table and start it on a free loopback port. The first `lose_responses`
    /// applied events have their response held for `hold`.
    pub async fn start(
        pool: &PgPool,
        lose_responses: u64,
        hold: Duration,
    ) -> std::io::Result<ShippingReceiver> {
        create_schema(pool).await.map_err(std::io::Error::other)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            pool: pool.clone(),
            counters: Counters::default(),
            lose: AtomicU64::new(lose_responses),
            hold,
        });
        let app = Router::new()
            .route("/order-events", post(on_event))
            .with_state(shared.clone());
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(stopped.cancelled_owned())
                .await
            {
                eprintln!("shipping receiver stopped: {e}");
            }
        });
        Ok(ShippingReceiver { addr, shared, stop })
    }

    /// The URL the publisher posts to.
    pub fn url(&self) -> String {
        format!("http://{}/order-events", self.addr)
    }

    /// What it counted so far.
    pub fn counts(&self) -> ReceiverCounts {
        let c = &self.shared.counters;
        ReceiverCounts {
            requests: c.requests.load(Ordering::Relaxed),
            applied: c.applied.load(Ordering::Relaxed),
            duplicates: c.duplicates.load(Ordering::Relaxed),
            lost_responses: c.lost_responses.load(Ordering::Relaxed),
        }
    }
}

impl Drop for ShippingReceiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn on_event(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    // The request's span continues the trace of the delivery that sent it (its `traceparent`).
    let span = tracing::info_span!("shipping.receive");
    outbox_runtime::inbox::continue_trace(
        &span,
        headers
            .iter()
            .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?))),
    );
    receive(shared, body).instrument(span).await
}

async fn receive(shared: Arc<Shared>, body: Bytes) -> Response {
    shared.counters.requests.fetch_add(1, Ordering::Relaxed);
    let envelope: Envelope = match serde_json::from_slice(&body) {
        Ok(envelope) => envelope,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("not an event envelope: {e}"),
            )
                .into_response();
        }
    };
    if envelope.event_type != "order.confirmed" || envelope.version != 1 {
        // A permanent refusal: the publisher keeps this body as the reason.
        let why = format!(
            "shipping does not handle {} v{}",
            envelope.event_type, envelope.version
        );
        return (StatusCode::UNPROCESSABLE_ENTITY, why).into_response();
    }
    let event: OrderConfirmed = match serde_json::from_value(envelope.payload.clone()) {
        Ok(event) => event,
        Err(e) => {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("bad order.confirmed payload: {e}"),
            )
                .into_response();
        }
    };
    // On a task of its own: if the publisher gives up and closes the connection, hyper drops
    // this handler, and the transaction must still finish as a whole.
    let pool = shared.pool.clone();
    let apply_span = tracing::info_span!("shipping.apply_once", event_id = %envelope.id);
    let applied = match tokio::spawn(
        async move { ship(&pool, envelope.id, &event).await }.instrument(apply_span),
    )
    .await
    {
        Ok(applied) => applied,
        Err(e) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("shipping task failed: {e}"),
            )
                .into_response();
        }
    };
    match applied {
        Ok(ApplyOutcome::Applied) => {
            shared.counters.applied.fetch_add(1, Ordering::Relaxed);
            let lose = shared
                .lose
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok();
            if lose {
                // Applied and committed; the publisher gives up waiting for this answer.
                shared
                    .counters
                    .lost_responses
                    .fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(shared.hold).await;
            }
            StatusCode::OK.into_response()
        }
        Ok(ApplyOutcome::Duplicate) => {
            shared.counters.duplicates.fetch_add(1, Ordering::Relaxed);
            (StatusCode::CONFLICT, "already applied").into_response()
        }
        // The database is unwell: ask for a retry.
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("shipping database error: {e}"),
        )
            .into_response(),
    }
}

/// Create the shipping service's table.
pub async fn create_schema(pool: &PgPool) -> sqlx::Result<()> {
    sqlx::query(CREATE_SHIPMENTS)
        .execute(pool)
        .await
        .map(|_| ())
}

/// The shipping handler: ship the order of event `event_id` once. The inbox row and the
/// shipment commit together, or neither does; a redelivered event is a `Duplicate` and writes
/// nothing.
pub async fn ship(
    pool: &PgPool,
    event_id: Uuid,
    event: &OrderConfirmed,
) -> outbox_runtime::error::Result<ApplyOutcome> {
    let mut tx = pool.begin().await?;
    let outcome = inbox::apply_once(&mut tx, CONSUMER, event_id).await?;
    if outcome == ApplyOutcome::Applied {
        sqlx::query(INSERT_SHIPMENT)
            .bind(event.order_id)
            .bind(event_id)
            .bind(event.total_cents)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(outcome)
}

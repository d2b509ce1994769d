//! The order service's own data: an `orders` table, and the confirmation that changes an order
//! and enqueues [`OrderConfirmed`] in one transaction.

use outbox_runtime::Event;
use sqlx::PgPool;
use uuid::Uuid;

use crate::events::OrderConfirmed;

/// The service's table. A real service keeps this in its migrations folder; the example
/// creates it at start so that folder holds only what `outbox migrations generate` writes.
const CREATE_ORDERS: &str = "CREATE TABLE IF NOT EXISTS orders (
    id           uuid        PRIMARY KEY,
    customer     text        NOT NULL,
    total_cents  bigint      NOT NULL,
    status       text        NOT NULL DEFAULT 'placed' CHECK (status IN ('placed', 'confirmed')),
    -- Optimistic concurrency: every change presents the version it read and bumps it.
    version      bigint      NOT NULL DEFAULT 1,
    confirmed_at timestamptz
)";

const PLACE_ORDER: &str = "INSERT INTO orders (id, customer, total_cents) VALUES ($1, $2, $3)";

/// Confirm only the version the caller read, and only a placed order. No row: someone else
/// changed the order first (or it is already confirmed).
const CONFIRM_ORDER: &str = "UPDATE orders
    SET status = 'confirmed', version = version + 1, confirmed_at = now()
    WHERE id = $1 AND version = $2 AND status = 'placed'
    RETURNING version, customer, total_cents";

/// An order as the customer's session read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderRef {
    /// The order id.
    pub id: Uuid,
    /// The version that was read.
    pub version: i64,
}

/// What a confirmation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmation {
    /// The order changed and its event was enqueued, both committed.
    Confirmed {
        /// The stable event id (the receivers' idempotency key).
        event_id: Uuid,
    },
    /// The version check matched no row: the transaction was rolled back, nothing was written.
    Stale,
}

/// Create the table if needed.
pub async fn create_schema(pool: &PgPool) -> sqlx::Result<()> {
    sqlx::query(CREATE_ORDERS).execute(pool).await.map(|_| ())
}

/// Place an order (version 1).
pub async fn place_order(
    pool: &PgPool,
    customer: &str,
    total_cents: i64,
) -> sqlx::Result<OrderRef> {
    let id = Uuid::new_v4();
    sqlx::query(PLACE_ORDER)
        .bind(id)
        .bind(customer)
        .bind(total_cents)
        .execute(pool)
        .await?;
    Ok(OrderRef { id, version: 1 })
}

/// Confirm `order` if it is still at the version read: update it and enqueue `OrderConfirmed`
/// in the same transaction. When the update matches no row, roll back: no event without the
/// change it announces. The span is the producer's: the enqueue stores its trace context with
/// the event, and every delivery and receiver continues that trace.
#[tracing::instrument(name = "confirm_order", skip_all, fields(order_id = %order.id))]
pub async fn confirm_order(
    pool: &PgPool,
    order: OrderRef,
) -> outbox_runtime::error::Result<Confirmation> {
    let mut tx = pool.begin().await?;
    let row: Option<(i64, String, i64)> = sqlx::query_as(CONFIRM_ORDER)
        .bind(order.id)
        .bind(order.version)
        .fetch_optional(&mut *tx)
        .await?;
    let Some((order_version, customer, total_cents)) = row else {
        tx.rollback().await?;
        return Ok(Confirmation::Stale);
    };
    let event = OrderConfirmed {
        order_id: order.id,
        order_version,
        customer,
        total_cents,
    };
    // One business action, one key: a retried confirmation command gets the same event back.
    let event_id = event
        .enqueue(&mut tx, &format!("confirm-order/{}", order.id))
        .await?;
    tx.commit().await?;
    Ok(Confirmation::Confirmed { event_id })
}

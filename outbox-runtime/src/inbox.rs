//! The consumer-side inbox: apply a received event at most once.
//!
//! Delivery is at least once, so a consumer sees some events twice (a lost acknowledgement, a
//! worker that crashed after sending). The inbox turns that into "applied once": inside the
//! transaction that applies the event's effect, call [`apply_once`] first. It records
//! `(consumer, event_id)` in `outbox_inbox` (schema: `migrations/0003_inbox.sql`, applied by
//! [`crate::migrate()`]) and says whether this is the first time:
//!
//! ```no_run
//! # async fn on_order_confirmed(pool: &sqlx::PgPool, event_id: uuid::Uuid, order_id: uuid::Uuid) -> outbox_runtime::error::Result<()> {
//! use outbox_runtime::inbox::{self, ApplyOutcome};
//!
//! let mut tx = pool.begin().await?;
//! if inbox::apply_once(&mut tx, "invoicing", event_id).await? == ApplyOutcome::Applied {
//!     sqlx::query("INSERT INTO invoices (order_id) VALUES ($1)").bind(order_id).execute(&mut *tx).await?;
//! }
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! The effect and the inbox row commit together or not at all: if the transaction rolls back,
//! no row stays behind and a redelivery applies the event. A duplicate is answered by
//! `INSERT ... ON CONFLICT DO NOTHING`, so it never raises an error and never aborts the
//! caller's transaction.
//!
//! Concurrent duplicates (two deliveries of one event at the same time, on two connections) are
//! serialised by the primary key: the second [`apply_once`] waits until the first transaction
//! ends, then reports [`ApplyOutcome::Duplicate`] if it committed, or [`ApplyOutcome::Applied`] if
//! it rolled back. This holds at PostgreSQL's default `READ COMMITTED` isolation; under
//! `REPEATABLE READ` or `SERIALIZABLE` the second transaction gets a serialization failure
//! instead, and retrying it sees the duplicate.
//!
//! Only the effects written in the same database transaction are covered. An effect outside
//! it (an email, a call to another service) needs that service's own idempotency.
//!
//! With the `opentelemetry` feature, [`continue_trace`] makes the consumer's span a child of the
//! delivery that sent the message (the `traceparent` the HTTP and NATS publishers send), so the
//! consumer's work joins the trace of the request that enqueued the event:
//!
//! ```no_run
//! # #[cfg(feature = "opentelemetry")]
//! # fn on_request(headers: &[(&str, &str)]) {
//! let span = tracing::info_span!("apply_order_confirmed");
//! outbox_runtime::inbox::continue_trace(&span, headers.iter().copied());
//! let _entered = span.enter(); // then apply_once(...) and the effect, inside the span
//! # }
//! ```

use std::time::Duration;

use sqlx::{PgExecutor, PgPool, Postgres, Transaction};
use uuid::Uuid;

use crate::error::{Error, Result};

/// The inbox table, created by `migrations/0003_inbox.sql`.
pub const TABLE: &str = "outbox_inbox";

/// Record that `consumer` applies `event_id`, unless it already did. Uses the primary key
/// `(consumer, event_id)`.
const RECORD: &str = "INSERT INTO outbox_inbox (consumer, event_id) VALUES ($1, $2) \
                      ON CONFLICT (consumer, event_id) DO NOTHING";

/// Whether `consumer` applied `event_id` (committed, or earlier in the caller's transaction).
const IS_APPLIED: &str =
    "SELECT EXISTS (SELECT 1 FROM outbox_inbox WHERE consumer = $1 AND event_id = $2)";

/// Delete up to $2 rows received more than $1 seconds ago, oldest first, by the database
/// clock. Uses `outbox_inbox_received_at_idx`; SKIP LOCKED keeps two purgers (or a purger and a
/// consumer about to see a duplicate) from waiting on each other.
const PURGE_BATCH: &str = "WITH doomed AS ( \
                               SELECT consumer, event_id FROM outbox_inbox \
                               WHERE received_at < now() - make_interval(secs => $1) \
                               ORDER BY received_at \
                               LIMIT $2 \
                               FOR UPDATE SKIP LOCKED) \
                           DELETE FROM outbox_inbox i USING doomed d \
                           WHERE i.consumer = d.consumer AND i.event_id = d.event_id";

/// Rows deleted per statement by [`purge`], so retention never holds long locks.
const PURGE_BATCH_SIZE: i64 = 5000;

/// Longest consumer name accepted (the table's CHECK constraint agrees).
const MAX_CONSUMER_LEN: usize = 200;

/// What [`apply_once`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "apply the event's effect only when the outcome is `Applied`"]
pub enum ApplyOutcome {
    /// First time: apply the effect in the same transaction.
    Applied,
    /// Already applied by a committed transaction (or earlier in this one): skip the effect.
    Duplicate,
}

/// Record, inside the consumer's transaction `tx`, that `consumer` applies `event_id`.
///
/// Returns [`ApplyOutcome::Applied`] the first time; then apply the effect in `tx` and commit.
/// Returns [`ApplyOutcome::Duplicate`] when the event was already applied; `tx` stays usable.
/// See the [module docs](self) for concurrency and rollback.
pub async fn apply_once(
    tx: &mut Transaction<'_, Postgres>,
    consumer: &str,
    event_id: Uuid,
) -> Result<ApplyOutcome> {
    validate_consumer(consumer)?;
    let inserted = sqlx::query(RECORD)
        .bind(consumer)
        .bind(event_id)
        .execute(&mut **tx)
        .await?
        .rows_affected();
    Ok(if inserted == 1 {
        ApplyOutcome::Applied
    } else {
        ApplyOutcome::Duplicate
    })
}

/// Whether `consumer` has applied `event_id` (as seen by `executor`).
pub async fn is_applied<'e>(
    executor: impl PgExecutor<'e>,
    consumer: &str,
    event_id: Uuid,
) -> Result<bool> {
    validate_consumer(consumer)?;
    Ok(sqlx::query_scalar(IS_APPLIED)
        .bind(consumer)
        .bind(event_id)
        .fetch_one(executor)
        .await?)
}

/// Retention: delete inbox rows received more than `older_than` ago (by the database clock), in
/// batches, and return how many were deleted.
///
/// Choose `older_than` longer than the longest time an event can still be delivered after its
/// first delivery (the publisher's attempts times its backoff cap, plus how long an operator
/// may wait before retrying an exhausted event): a duplicate arriving after its inbox row was
/// purged is applied again.
pub async fn purge(pool: &PgPool, older_than: Duration) -> Result<u64> {
    let seconds = older_than.as_secs_f64();
    let mut total = 0;
    loop {
        let deleted = sqlx::query(PURGE_BATCH)
            .bind(seconds)
            .bind(PURGE_BATCH_SIZE)
            .execute(pool)
            .await?
            .rows_affected();
        total += deleted;
        if deleted < PURGE_BATCH_SIZE as u64 {
            return Ok(total);
        }
    }
}

/// Make `span` (created, not yet entered) a child of the trace context carried by a received
/// message's `headers` (`traceparent`, `tracestate`, and `baggage` when the producer copied it),
/// so the consumer's work continues the trace of the request that enqueued the event. Returns
/// whether a context was found and set: false for a message without (or with a malformed)
/// `traceparent`, or when no `tracing-opentelemetry` layer records `span`.
///
/// For a received HTTP request, pass its headers as pairs, e.g.
/// `headers.iter().filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?)))`; for a batch
/// envelope, the `headers` of that envelope ([`crate::trace_context::context_from_stored`]).
#[cfg(feature = "opentelemetry")]
pub fn continue_trace<'a>(
    span: &tracing::Span,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> bool {
    use opentelemetry::trace::TraceContextExt;
    let cx = crate::trace_context::context_from_headers(headers);
    cx.span().span_context().is_valid() && crate::trace_context::set_parent(span, cx)
}

/// A consumer name is checked before it reaches SQL so a bad one is an error that says so,
/// not a CHECK violation that aborts the caller's transaction.
fn validate_consumer(consumer: &str) -> Result<()> {
    if consumer.is_empty() || consumer.chars().count() > MAX_CONSUMER_LEN {
        return Err(Error::Config(format!(
            "inbox consumer name must be 1 to {MAX_CONSUMER_LEN} characters, got {} characters; \
             use a stable name such as the service or handler name",
            consumer.chars().count()
        )));
    }
    Ok(())
}

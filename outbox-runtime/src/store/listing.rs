//! Reading back what an outbox table holds, event by event, on any executor (a pool, a
//! connection, or an open transaction through `&mut *tx`). For the test kit's assertions
//! (`crate::testing`); workers never list events.

use sqlx::types::Json;
use sqlx::{PgExecutor, Row};
use uuid::Uuid;

use super::sql;
use crate::error::Result;

/// One row of an outbox table as stored (payload not decoded into any event type).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// Row id (enqueue order).
    pub id: i64,
    /// Stable event id.
    pub event_id: Uuid,
    /// The operation key it was enqueued under.
    pub operation_key: String,
    /// Event name.
    pub event_type: String,
    /// Stored payload version.
    pub event_version: i32,
    /// Aggregate type, if any.
    pub aggregate_type: Option<String>,
    /// Aggregate id, if any.
    pub aggregate_id: Option<String>,
    /// Aggregate version, if any.
    pub aggregate_version: Option<i64>,
    /// JSON payload.
    pub payload: serde_json::Value,
    /// JSON headers (an object).
    pub headers: serde_json::Value,
    /// `pending`, `processing`, `delivered` or `exhausted`.
    pub status: String,
    /// Attempts charged so far; `None` once delivered. A delivered event keeps no delivery
    /// state: the completion deletes its queue row, and with it the attempts, the limit and the
    /// last error.
    pub attempts: Option<i32>,
    /// Attempts allowed; `None` once delivered (see `attempts`).
    pub max_attempts: Option<i32>,
    /// The last failure recorded while the event is not delivered; `None` when it never failed,
    /// and once delivered (see `attempts`).
    pub last_error: Option<String>,
}

/// Up to `limit` events of `table` in id order, whatever their status, read through `executor`.
/// Inside an open transaction this includes the transaction's own uncommitted events.
pub async fn list_events<'e>(
    executor: impl PgExecutor<'e>,
    table: &str,
    limit: i64,
) -> Result<Vec<StoredEvent>> {
    let statements = sql::statements(table)?;
    let rows = sqlx::query(statements.list_events)
        .bind(limit)
        .fetch_all(executor)
        .await?;
    rows.iter()
        .map(|row| {
            Ok(StoredEvent {
                id: row.try_get("id")?,
                event_id: row.try_get("event_id")?,
                operation_key: row.try_get("operation_key")?,
                event_type: row.try_get("event_type")?,
                event_version: row.try_get("event_version")?,
                aggregate_type: row.try_get("aggregate_type")?,
                aggregate_id: row.try_get("aggregate_id")?,
                aggregate_version: row.try_get("aggregate_version")?,
                payload: row.try_get::<Json<serde_json::Value>, _>("payload")?.0,
                headers: row.try_get::<Json<serde_json::Value>, _>("headers")?.0,
                status: row.try_get("status")?,
                attempts: row.try_get("attempts")?,
                max_attempts: row.try_get("max_attempts")?,
                last_error: row.try_get("last_error")?,
            })
        })
        .collect()
}

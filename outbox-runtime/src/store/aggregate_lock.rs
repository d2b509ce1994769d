//! The per-aggregate producer lock of the typed enqueue (`sql/lock_aggregate.sql`).
//!
//! Ordered delivery orders an aggregate's events by row id, and a row's id is drawn at INSERT
//! but becomes visible at COMMIT. Taking this transaction-scoped lock before the INSERT makes
//! the producers of one aggregate draw their ids one transaction after another, so an
//! aggregate's id order is its commit order. See `docs/ordering.md`.

use sqlx::PgConnection;

use crate::error::Result;
use crate::store::sql;

/// Wait for, then hold until the end of the caller's transaction, the lock on the aggregate
/// `(aggregate_type, aggregate_id)` of `table`; does nothing for an event without an aggregate
/// id (such events are not ordered). Must run in the transaction that inserts the event, before
/// the INSERT.
pub(crate) async fn lock_aggregate_producers(
    conn: &mut PgConnection,
    table: &str,
    aggregate_type: Option<&str>,
    aggregate_id: Option<&str>,
) -> Result<()> {
    let (Some(aggregate_type), Some(aggregate_id)) = (aggregate_type, aggregate_id) else {
        return Ok(());
    };
    sqlx::query(sql::statements(table)?.lock_aggregate)
        .bind(table)
        .bind(aggregate_type)
        .bind(aggregate_id)
        .execute(conn)
        .await?;
    Ok(())
}

//! The raw-SQL ceiling: the minimal `SKIP LOCKED` outbox of the same design, written by hand,
//! with no library in between. Per event one `INSERT`; per batch one claim statement and one
//! completion statement. Every other figure is printed as a ratio of what this does in the same
//! run on the same server.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use sqlx::{PgPool, Postgres, Row, Transaction};

use crate::BenchResult;

/// The ceiling's table: an id, the payload, a lease and a delivery mark, and the one partial
/// index its claim needs.
const CREATE_TABLE: &str = "CREATE TABLE ceiling_outbox (id bigserial PRIMARY KEY, \
    payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), \
    locked_until timestamptz, processed_at timestamptz)";
const CREATE_INDEX: &str =
    "CREATE INDEX ceiling_outbox_pending ON ceiling_outbox (id) WHERE processed_at IS NULL";
const TRUNCATE: &str = "TRUNCATE ceiling_outbox RESTART IDENTITY";
/// One event in the business transaction.
const INSERT: &str = "INSERT INTO ceiling_outbox (payload) VALUES ($1)";
/// The drain's pre-insert (untimed): `{"order_id": i}` for i in 1..=$1.
const PREFILL: &str = "INSERT INTO ceiling_outbox (payload) \
    SELECT jsonb_build_object('order_id', g) FROM generate_series(1, $1::bigint) g";
/// Claim up to $1 events in one statement, leased for 30 s by the database clock.
const CLAIM: &str = "WITH c AS (SELECT id FROM ceiling_outbox \
      WHERE processed_at IS NULL AND (locked_until IS NULL OR locked_until < now()) \
      ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) \
    UPDATE ceiling_outbox o SET locked_until = now() + interval '30 seconds' \
    FROM c WHERE o.id = c.id RETURNING o.id, o.payload";
/// Complete a batch by deleting it.
const COMPLETE_DELETE: &str = "DELETE FROM ceiling_outbox WHERE id = ANY($1)";
/// Complete a batch by marking it delivered (the outbox's own choice: rows stay until purged).
const COMPLETE_UPDATE: &str =
    "UPDATE ceiling_outbox SET processed_at = now(), locked_until = NULL WHERE id = ANY($1)";
const UNFINISHED: &str = "SELECT count(*) FROM ceiling_outbox WHERE processed_at IS NULL";

/// What the ceiling's completion does with a delivered row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// `DELETE` (the harness's `ceiling` row).
    Delete,
    /// `UPDATE ... SET processed_at` (the harness's `ceiling-upd` row).
    Update,
}

impl Completion {
    fn statement(self) -> &'static str {
        match self {
            Completion::Delete => COMPLETE_DELETE,
            Completion::Update => COMPLETE_UPDATE,
        }
    }

    /// Short name for the table.
    pub fn label(self) -> &'static str {
        match self {
            Completion::Delete => "delete on completion",
            Completion::Update => "update on completion",
        }
    }
}

/// Create the ceiling's table (once per database).
pub async fn create_table(pool: &PgPool) -> BenchResult<()> {
    sqlx::query(CREATE_TABLE).execute(pool).await?;
    sqlx::query(CREATE_INDEX).execute(pool).await?;
    Ok(())
}

/// Empty the ceiling's table.
pub async fn truncate(pool: &PgPool) -> BenchResult<()> {
    sqlx::query(TRUNCATE).execute(pool).await?;
    Ok(())
}

/// The hand-written minimal insert of one event, inside the caller's transaction.
pub async fn insert(
    tx: &mut Transaction<'_, Postgres>,
    payload: &serde_json::Value,
) -> BenchResult<()> {
    sqlx::query(INSERT).bind(payload).execute(&mut **tx).await?;
    Ok(())
}

/// Pre-insert `n` events (untimed part of the drain).
pub async fn prefill(pool: &PgPool, n: i64) -> BenchResult<()> {
    sqlx::query(PREFILL).bind(n).execute(pool).await?;
    Ok(())
}

/// Drain the table with `tasks` tasks of one connection each, claiming `batch` at a time;
/// returns (seconds, events handled). The timer covers the loops until every task found the
/// table empty.
pub async fn drain(
    pool: &PgPool,
    tasks: usize,
    batch: i64,
    completion: Completion,
) -> BenchResult<(f64, i64)> {
    let handled = Arc::new(AtomicI64::new(0));
    let started = Instant::now();
    let mut joins = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        let pool = pool.clone();
        let handled = Arc::clone(&handled);
        joins.push(tokio::spawn(async move {
            drain_task(pool, batch, completion, handled).await
        }));
    }
    for join in joins {
        join.await??;
    }
    let secs = started.elapsed().as_secs_f64();
    let left: i64 = sqlx::query_scalar(UNFINISHED).fetch_one(pool).await?;
    if left != 0 {
        return Err(format!("the ceiling drain left {left} events undelivered").into());
    }
    Ok((secs, handled.load(Ordering::Relaxed)))
}

async fn drain_task(
    pool: PgPool,
    batch: i64,
    completion: Completion,
    handled: Arc<AtomicI64>,
) -> BenchResult<()> {
    let mut conn = pool.acquire().await?;
    let mut ids = Vec::with_capacity(usize::try_from(batch).unwrap_or(100));
    loop {
        let rows = sqlx::query(CLAIM).bind(batch).fetch_all(&mut *conn).await?;
        if rows.is_empty() {
            return Ok(());
        }
        ids.clear();
        for row in &rows {
            ids.push(row.try_get::<i64, _>(0)?);
            // The no-op handler still decodes the payload, as every peer's does.
            let _payload: serde_json::Value = row.try_get(1)?;
        }
        sqlx::query(completion.statement())
            .bind(&ids)
            .execute(&mut *conn)
            .await?;
        handled.fetch_add(rows.len() as i64, Ordering::Relaxed);
    }
}

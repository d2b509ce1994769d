//! Shared helpers of the `store_*` tests: the event types they write (`#[derive(Event)]`) and
//! direct reads of the outbox rows, so every test asserts database state.
#![allow(dead_code)] // each test file uses a different subset

use outbox_runtime::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Row};

/// An event with an aggregate (`order`, keyed by `order_id`), written to the default table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "order_placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    #[outbox(aggregate_id)]
    pub order_id: String,
    pub total_cents: i64,
}

/// An event without aggregate, with a payload of any size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "note", version = 1)]
pub struct Note {
    pub text: String,
}

/// An event written to a second outbox table, `audit_outbox`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "audit_entry", version = 1, table = "audit_outbox")]
pub struct AuditEntry {
    pub what: String,
}

/// Write `n` notes through the real enqueue path, in transactions of up to 1,000.
pub async fn enqueue_notes(pool: &PgPool, prefix: &str, n: usize) -> Vec<uuid::Uuid> {
    let mut ids = Vec::with_capacity(n);
    let options = outbox_runtime::store::EnqueueOptions {
        notify: false,
        ..Default::default()
    };
    for chunk_start in (0..n).step_by(1000) {
        let mut tx = pool.begin().await.unwrap();
        for i in chunk_start..(chunk_start + 1000).min(n) {
            let note = Note {
                text: format!("{prefix} {i}"),
            };
            ids.push(
                note.enqueue_with(&mut tx, &format!("{prefix}-{i}"), &options)
                    .await
                    .unwrap(),
            );
        }
        tx.commit().await.unwrap();
    }
    ids
}

/// Seed many rows of `status` directly with one INSERT (scaffolding for plan tests, where
/// hundreds of thousands of rows are needed fast; the enqueue path has its own tests).
pub async fn bulk_insert(pool: &PgPool, prefix: &str, n: i64, status: &str) {
    sqlx::query(
        "INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload,
                             status, delivered_at, exhausted_at, available_at)
         SELECT gen_random_uuid(), $1 || '-' || g, '\\x00', 'note', 1, jsonb_build_object('n', g),
                $3, CASE WHEN $3 = 'delivered' THEN now() END, CASE WHEN $3 = 'exhausted' THEN now() END,
                now() - interval '1 second'
         FROM generate_series(1, $2) AS g",
    )
    .bind(prefix)
    .bind(n)
    .bind(status)
    .execute(pool)
    .await
    .unwrap();
}

/// One outbox row as the database records it.
#[derive(Debug, Clone, PartialEq)]
pub struct RowState {
    pub id: i64,
    pub status: String,
    pub claim_version: i64,
    pub claimed_by: Option<String>,
    pub attempts: i32,
    pub lease_expiries: i32,
    pub handler_failures: i32,
    pub last_error: Option<String>,
    pub lease_live: Option<bool>,
}

/// The state of row `id` in `table`.
pub async fn row_state(pool: &PgPool, id: i64) -> RowState {
    all_rows(pool)
        .await
        .into_iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("no outbox row {id}"))
}

/// Every row of the default table, by id.
pub async fn all_rows(pool: &PgPool) -> Vec<RowState> {
    sqlx::query(
        "SELECT id, status, claim_version, claimed_by, attempts, lease_expiries, handler_failures, last_error,
                lease_until > now() AS lease_live
         FROM outbox ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .iter()
    .map(|r| RowState {
        id: r.get("id"),
        status: r.get("status"),
        claim_version: r.get("claim_version"),
        claimed_by: r.get("claimed_by"),
        attempts: r.get("attempts"),
        lease_expiries: r.get("lease_expiries"),
        handler_failures: r.get("handler_failures"),
        last_error: r.get("last_error"),
        lease_live: r.get("lease_live"),
    })
    .collect()
}

/// Rows per status in the default table.
pub async fn count_status(pool: &PgPool, status: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox WHERE status = $1")
        .bind(status)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Rows in the default table.
pub async fn count_rows(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Until backend `waiter` waits on a lock held by another backend (`holder` when given).
/// PostgreSQL raises no event when a session starts waiting, so the lock table is read until
/// then; bounded, failing with what it waited for.
pub async fn wait_until_blocked(pool: &PgPool, waiter: i32, holder: Option<i32>) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let blocked: bool = sqlx::query_scalar(
            "SELECT CASE WHEN $2::int IS NULL THEN cardinality(pg_blocking_pids($1)) > 0
                         ELSE $2 = ANY (pg_blocking_pids($1)) END",
        )
        .bind(waiter)
        .bind(holder)
        .fetch_one(pool)
        .await
        .unwrap();
        if blocked {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "backend {waiter} never waited on a lock held by {}",
            holder.map_or("another transaction".to_owned(), |h| format!("backend {h}"))
        );
        tokio::task::yield_now().await;
    }
}

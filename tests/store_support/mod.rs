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

/// Seed many events of `status` directly, each with its queue row unless `status` is
/// `delivered` (an event without a queue row: its queue row is deleted after the insert), in one statement (scaffolding for plan tests,
/// where hundreds of thousands of rows are needed fast; the enqueue path has its own tests).
pub async fn bulk_insert(pool: &PgPool, prefix: &str, n: i64, status: &str) {
    sqlx::query(
        "WITH e AS (
             INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload)
             SELECT gen_random_uuid(), $1 || '-' || g, '\\x00', 'note', 1, jsonb_build_object('n', g)
             FROM generate_series(1, $2) AS g
             RETURNING id
         )
         INSERT INTO outbox_queue (id, status, exhausted_at, available_at)
         SELECT id, $3, CASE WHEN $3 = 'exhausted' THEN now() END, now() - interval '1 second'
         FROM e
         WHERE $3 <> 'delivered'",
    )
    .bind(prefix)
    .bind(n)
    .bind(status)
    .execute(pool)
    .await
    .unwrap();
    if status == "delivered" {
        // The insert gave each event its queue row (the table's trigger); delivered is an
        // event without one, as the completion leaves it.
        sqlx::query(
            "DELETE FROM outbox_queue WHERE id IN (
                 SELECT id FROM outbox WHERE operation_key LIKE $1 || '-%')",
        )
        .bind(prefix)
        .execute(pool)
        .await
        .unwrap();
    }
}

/// One event as the database records it: its status (`delivered` when it has no queue row)
/// and its queue row's state, `None` for a delivered event (which keeps no delivery state).
#[derive(Debug, Clone, PartialEq)]
pub struct RowState {
    pub id: i64,
    pub status: String,
    pub claim_version: Option<i64>,
    pub claimed_by: Option<String>,
    pub attempts: Option<i32>,
    pub lease_expiries: Option<i32>,
    pub handler_failures: Option<i32>,
    pub last_error: Option<String>,
    pub lease_live: Option<bool>,
}

/// The state of event `id` of the default table.
pub async fn row_state(pool: &PgPool, id: i64) -> RowState {
    all_rows(pool)
        .await
        .into_iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("no outbox event {id}"))
}

/// Every event of the default table with its queue row's state, by id. Fails when a queue row
/// has no event: the enqueue inserts both or neither, and only the event's purge (after the
/// queue row is gone) or the retention-zero completion (both at once) delete an event.
pub async fn all_rows(pool: &PgPool) -> Vec<RowState> {
    assert_eq!(
        orphan_queue_rows(pool).await,
        Vec::<i64>::new(),
        "queue rows without their event"
    );
    sqlx::query(
        "SELECT e.id, coalesce(q.status, 'delivered') AS status, q.claim_version, q.claimed_by,
                q.attempts, q.lease_expiries, q.handler_failures, q.last_error,
                q.lease_until > now() AS lease_live
         FROM outbox e LEFT JOIN outbox_queue q ON q.id = e.id ORDER BY e.id",
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

/// Events per status in the default table (`delivered`: events without a queue row).
pub async fn count_status(pool: &PgPool, status: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM outbox e LEFT JOIN outbox_queue q ON q.id = e.id
         WHERE coalesce(q.status, 'delivered') = $1",
    )
    .bind(status)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Events in the default table (delivered or not).
pub async fn count_rows(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Queue rows in the default table's queue (the events not delivered).
pub async fn count_queue_rows(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_queue")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The ids of queue rows whose event is gone: there must never be one.
pub async fn orphan_queue_rows(pool: &PgPool) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT q.id FROM outbox_queue q
         WHERE NOT EXISTS (SELECT 1 FROM outbox e WHERE e.id = q.id) ORDER BY q.id",
    )
    .fetch_all(pool)
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

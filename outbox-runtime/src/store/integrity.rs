//! The doctor's checks of one outbox table: whether the invariants the database keeps
//! (`sql/create_queue_invariants.sql`) are in place and on, and which rows break them anyway.
//!
//! Delivered means "an event with no queue row", so two kinds of row lie: an event another
//! writer inserted without its queue row (before the table had the invariants, or while a
//! superuser had them off), which reads as delivered although no worker ever claimed it; and a
//! queue row whose event was deleted, which workers claim and charge until it is exhausted.
//! The first kind is told from a delivered event by its event id: every library path (the typed
//! enqueue, `outbox_enqueue()`) derives it from the table and the operation key
//! ([`event_id_for`]), other writers do not. `outbox doctor` prints the report; its `--repair`
//! and `--requeue` act on it.
//!
//! Operators' reads, never on the delivery path: each statement reads the whole table it checks.

use futures::TryStreamExt;
use serde::Serialize;
use sqlx::Row;
use uuid::Uuid;

use super::Store;
use super::enqueue::event_id_for;
use super::sql::{integrity, render};
use crate::error::Result;

/// Where one of the table's two rules stands. Serialized as `{"state": "on" | "missing" |
/// "off", "why": ...}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "why", rename_all = "snake_case")]
pub enum RuleState {
    /// In place and enforced for every writer but a superuser's replication session.
    On,
    /// Absent: the table was created by a version before the invariants and not upgraded.
    Missing,
    /// Present but not enforced now; the text says how (disabled, replica-only, not valid).
    Off(String),
}

impl RuleState {
    /// Whether the rule is enforced.
    pub fn is_on(&self) -> bool {
        *self == RuleState::On
    }
}

/// A queue row whose event no longer exists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrphanQueueRow {
    /// The id it carries (its event's, gone).
    pub id: i64,
    /// Its status.
    pub status: String,
    /// Attempts charged to it.
    pub attempts: i32,
    /// Its last error, if any.
    pub last_error: Option<String>,
}

/// An event that reads as delivered but was not written by the library, so no worker ever saw
/// its queue row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnqueuedEvent {
    /// Row id.
    pub id: i64,
    /// Its stored event id (not the one its key derives).
    pub event_id: Uuid,
    /// Its operation key.
    pub operation_key: String,
    /// Event name.
    pub event_type: String,
    /// Stored payload version.
    pub event_version: i32,
    /// When it was inserted (the database's clock).
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// What `outbox doctor` found in one table (its JSON is `outbox doctor --json`'s and the
/// dashboard's `api/integrity`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IntegrityReport {
    /// The outbox table.
    pub table: String,
    /// Every inserted event gets its queue row (the statement trigger).
    pub queue_row_trigger: RuleState,
    /// A queue row cannot outlive its event (the foreign key).
    #[serde(rename = "queue_row_foreign_key")]
    pub queue_row_key: RuleState,
    /// How many queue rows have no event.
    pub orphan_queue_rows: i64,
    /// The first of them, in id order.
    #[serde(rename = "orphan_queue_row_sample")]
    pub orphan_sample: Vec<OrphanQueueRow>,
    /// How many events read as delivered without ever having had a queue row.
    #[serde(rename = "never_claimed_events")]
    pub unqueued_events: i64,
    /// The first of them, in id order.
    #[serde(rename = "never_claimed_event_sample")]
    pub unqueued_sample: Vec<UnqueuedEvent>,
}

impl IntegrityReport {
    /// The report as JSON, with `healthy` ([`IntegrityReport::is_healthy`]): what
    /// `outbox doctor --json` prints per table and the dashboard's `api/integrity` answers.
    pub fn to_json(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        value["healthy"] = serde_json::Value::Bool(self.is_healthy());
        value
    }

    /// Whether the table holds every invariant: both rules on and no row breaking them.
    pub fn is_healthy(&self) -> bool {
        self.queue_row_trigger.is_on()
            && self.queue_row_key.is_on()
            && self.orphan_queue_rows == 0
            && self.unqueued_events == 0
    }
}

impl Store {
    /// Check the table's invariants and list up to `limit` rows of each kind that breaks them
    /// (module docs). Reads the whole event table once: for an operator, not a loop.
    pub async fn check_integrity(&self, limit: i64) -> Result<IntegrityReport> {
        let rules = sqlx::query(self.integrity_sql(integrity::RULES))
            .fetch_one(&self.pool)
            .await?;
        let trigger: String = rules.try_get("trigger")?;
        let foreign_key: String = rules.try_get("foreign_key")?;
        let key_disabled: bool = rules.try_get("key_disabled")?;
        let queue_row_trigger = match trigger.as_str() {
            "missing" => RuleState::Missing,
            "O" | "A" => RuleState::On,
            "R" => RuleState::Off(
                "it fires only in sessions with session_replication_role = replica (ALTER TABLE ... ENABLE REPLICA TRIGGER)"
                    .to_owned(),
            ),
            _ => RuleState::Off("it is disabled (ALTER TABLE ... DISABLE TRIGGER)".to_owned()),
        };
        let queue_row_key = match (foreign_key.as_str(), key_disabled) {
            ("missing", _) => RuleState::Missing,
            (_, true) => RuleState::Off(
                "its checks are disabled (ALTER TABLE ... DISABLE TRIGGER ALL)".to_owned(),
            ),
            ("not valid", false) => RuleState::Off(
                "it checks new rows but is not validated: rows from before it may break it"
                    .to_owned(),
            ),
            _ => RuleState::On,
        };

        let orphans = sqlx::query(self.integrity_sql(integrity::ORPHAN_QUEUE_ROWS))
            .bind(limit.max(1))
            .fetch_all(&self.pool)
            .await?;
        let orphan_queue_rows = match orphans.first() {
            Some(row) => row.try_get("total")?,
            None => 0,
        };
        let mut orphan_sample = Vec::new();
        for row in orphans.iter().take(usize::try_from(limit).unwrap_or(0)) {
            orphan_sample.push(OrphanQueueRow {
                id: row.try_get("id")?,
                status: row.try_get("status")?,
                attempts: row.try_get("attempts")?,
                last_error: row.try_get("last_error")?,
            });
        }

        let mut unqueued_events = 0;
        let mut unqueued_sample = Vec::new();
        self.for_each_unqueued_event(|event| {
            unqueued_events += 1;
            if (unqueued_sample.len() as i64) < limit {
                unqueued_sample.push(event);
            }
        })
        .await?;

        Ok(IntegrityReport {
            table: self.table.clone(),
            queue_row_trigger,
            queue_row_key,
            orphan_queue_rows,
            orphan_sample,
            unqueued_events,
            unqueued_sample,
        })
    }

    /// Delete the queue rows whose event is gone, then validate the foreign key when it was
    /// added NOT VALID. Returns the ids deleted.
    pub async fn delete_orphan_queue_rows(&self) -> Result<Vec<i64>> {
        let deleted: Vec<i64> = sqlx::query_scalar(self.integrity_sql(integrity::DELETE_ORPHANS))
            .fetch_all(&self.pool)
            .await?;
        let rules = sqlx::query(self.integrity_sql(integrity::RULES))
            .fetch_one(&self.pool)
            .await?;
        let foreign_key: String = rules.try_get("foreign_key")?;
        if foreign_key == "not valid" {
            sqlx::query(self.integrity_sql(integrity::VALIDATE_KEY))
                .execute(&self.pool)
                .await?;
        }
        Ok(deleted)
    }

    /// Give every event [`Store::check_integrity`] counts as never claimed its queue row
    /// (pending now, the queue table's default attempts), so the workers deliver it. Returns
    /// the ids queued.
    pub async fn requeue_unqueued_events(&self) -> Result<Vec<i64>> {
        let mut ids = Vec::new();
        self.for_each_unqueued_event(|event| ids.push(event.id))
            .await?;
        let mut queued = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(1_000) {
            let done: Vec<i64> = sqlx::query_scalar(self.integrity_sql(integrity::REQUEUE_EVENTS))
                .bind(chunk)
                .fetch_all(&self.pool)
                .await?;
            queued.extend(done);
        }
        Ok(queued)
    }

    /// Every event without a queue row whose event id is not the one its key derives, in id
    /// order. Streamed: every delivered event within retention passes through here once.
    async fn for_each_unqueued_event(&self, mut each: impl FnMut(UnqueuedEvent)) -> Result<()> {
        let sql = self.integrity_sql(integrity::UNQUEUED_EVENTS);
        let mut rows = sqlx::query(sql).fetch(&self.pool);
        while let Some(row) = rows.try_next().await? {
            let event_id: Uuid = row.try_get("event_id")?;
            let operation_key: String = row.try_get("operation_key")?;
            if event_id == event_id_for(&self.table, &operation_key) {
                continue;
            }
            each(UnqueuedEvent {
                id: row.try_get("id")?,
                event_id,
                operation_key,
                event_type: row.try_get("event_type")?,
                event_version: row.try_get("event_version")?,
                created_at: row.try_get("created_at")?,
            });
        }
        Ok(())
    }

    /// A doctor statement rendered for this table (rare statements: rendered per call, not
    /// cached like the delivery path's).
    fn integrity_sql(&self, template: &str) -> sqlx::AssertSqlSafe<String> {
        sqlx::AssertSqlSafe(render(template, &self.table))
    }
}

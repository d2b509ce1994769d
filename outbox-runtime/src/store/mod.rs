//! Every SQL statement against an outbox table, each in one place (`store/sql/*.sql`).
//!
//! State changes of a claimed event are fenced: they only apply while the row is `processing`,
//! still carries the caller's `claim_version`, and its lease is live. They return
//! [`Ownership`], never a bare row count.
//!
//! Every statement names its table through a visible placeholder (`/* TEMPLATE: table */outbox`)
//! that is replaced once per table name; see [`sql`] for the texts and `sql/*.sql` for the files.
//! Durations are passed to PostgreSQL as microseconds and added to `now()` there: the database
//! is the only clock, and no statement takes a client timestamp.

mod aggregate_lock;
pub mod enqueue;
pub mod sql;

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgPool, Row};
use uuid::Uuid;

pub use enqueue::EnqueueOptions;
pub use sql::validate_table_name;

use crate::error::Result;
use sql::Statements;

/// The DDL of an outbox table named `table` (table and indexes, `IF NOT EXISTS`), rendered from
/// `store/sql/create_table.sql`. `migrations/0001_outbox.sql` is this for `outbox`.
///
/// Fails when `table` is not a valid identifier, or is longer than 49 characters (its index
/// names must fit PostgreSQL's 63-character limit).
pub fn create_table_sql(table: &str) -> Result<String> {
    sql::render_create_table(table)
}

/// The LISTEN/NOTIFY channel that enqueue wakes workers of `table` on: the table name itself.
pub fn notify_channel(table: &str) -> String {
    table.to_owned()
}

/// The default outbox table.
pub const DEFAULT_TABLE: &str = "outbox";

/// A claimed event, as returned by [`Store::claim_batch`].
#[derive(Debug, Clone)]
pub struct ClaimedEvent {
    /// Row id (bigint identity).
    pub id: i64,
    /// Stable event id.
    pub event_id: Uuid,
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
    /// The fencing token of this claim.
    pub claim_version: i64,
    /// Attempts charged so far, this one included.
    pub attempts: i32,
    /// Attempts allowed before the event is exhausted.
    pub max_attempts: i32,
    /// When the lease ends, by the database clock.
    pub lease_until: DateTime<Utc>,
}

impl ClaimedEvent {
    /// The fencing token that every later state change of this claim must present.
    pub fn claim(&self) -> Claim {
        Claim {
            id: self.id,
            claim_version: self.claim_version,
        }
    }
}

/// The fencing token of one claim: row id plus the claim_version the claim set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Claim {
    /// Row id.
    pub id: i64,
    /// claim_version set by the claim.
    pub claim_version: i64,
}

/// Whether a fenced statement found the row still owned by the caller's claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// The row was still ours and the change was applied.
    Owned,
    /// Another claim, recovery or an expired lease took the row: nothing was changed, and the
    /// caller must not assume it owns the event.
    Lost,
}

/// What [`Store::fail_if_owned`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOutcome {
    /// Back to pending, available again after the backoff.
    Rescheduled,
    /// Attempts used up, or a permanent failure: now exhausted.
    Exhausted,
    /// The claim was no longer ours; nothing changed.
    Lost,
}

/// Counts returned by [`Store::recover_expired`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecoveryCounts {
    /// Expired leases returned to pending.
    pub requeued: u64,
    /// Expired leases whose attempts were used up, now exhausted.
    pub exhausted: u64,
}

/// Queue statistics, computed by the database.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Rows waiting to be claimed (including those scheduled for later).
    pub pending: i64,
    /// Rows claimed by a worker.
    pub processing: i64,
    /// Rows delivered and not yet purged.
    pub delivered: i64,
    /// Rows that used up their attempts or failed permanently.
    pub exhausted: i64,
    /// How long the oldest pending event has been ready to claim (now() minus its
    /// available_at, by the database clock; zero when every pending event is scheduled for
    /// later, `None` when nothing is pending). A growing age means delivery is stuck.
    pub oldest_pending_age: Option<Duration>,
}

/// The queue gauges the maintenance leader publishes: [`Stats`] without the delivered count,
/// which would scan the retained history on every maintenance interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueGauges {
    /// Rows waiting to be claimed (including those scheduled for later).
    pub pending: i64,
    /// Rows claimed by a worker.
    pub processing: i64,
    /// Rows that used up their attempts or failed permanently.
    pub exhausted: i64,
    /// As [`Stats::oldest_pending_age`].
    pub oldest_pending_age: Option<Duration>,
}

/// One exhausted event, as listed by [`Store::exhausted_events`] for an operator.
#[derive(Debug, Clone, PartialEq)]
pub struct ExhaustedEvent {
    /// Stable event id (what `retry` takes).
    pub event_id: Uuid,
    /// Event name.
    pub event_type: String,
    /// Stored payload version.
    pub event_version: i32,
    /// Attempts charged.
    pub attempts: i32,
    /// The last error: a handler's message, or which worker's lease expired.
    pub last_error: Option<String>,
    /// How many claims ended with an expired lease (a worker crashed or stalled).
    pub lease_expiries: i32,
    /// How many attempts a handler reported as failed (the receiver refused).
    pub handler_failures: i32,
    /// When the row last changed (here: when it became exhausted), by the database clock.
    pub updated_at: DateTime<Utc>,
}

/// A duration as whole microseconds for the statements' `$n * interval '1 microsecond'`.
/// Saturates instead of wrapping; PostgreSQL rejects an interval that is out of range.
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// The claims of `claims` whose id is not in `kept`.
fn lost_claims(claims: &[Claim], kept: &HashSet<i64>) -> Vec<Claim> {
    claims
        .iter()
        .filter(|c| !kept.contains(&c.id))
        .copied()
        .collect()
}

fn ownership(rows_affected: u64) -> Ownership {
    if rows_affected == 0 {
        Ownership::Lost
    } else {
        Ownership::Owned
    }
}

/// The pairs of a batch as two arrays, sorted by id: every batched statement then locks its
/// rows in the same order, so a renewal and a completion of overlapping batches cannot deadlock.
fn split_claims(claims: &[Claim]) -> (Vec<i64>, Vec<i64>) {
    let mut sorted = claims.to_vec();
    sorted.sort_unstable_by_key(|c| (c.id, c.claim_version));
    sorted.iter().map(|c| (c.id, c.claim_version)).unzip()
}

fn claimed_event(row: &sqlx::postgres::PgRow) -> Result<ClaimedEvent> {
    Ok(ClaimedEvent {
        id: row.try_get("id")?,
        event_id: row.try_get("event_id")?,
        event_type: row.try_get("event_type")?,
        event_version: row.try_get("event_version")?,
        aggregate_type: row.try_get("aggregate_type")?,
        aggregate_id: row.try_get("aggregate_id")?,
        aggregate_version: row.try_get("aggregate_version")?,
        payload: row.try_get::<Json<serde_json::Value>, _>("payload")?.0,
        headers: row.try_get::<Json<serde_json::Value>, _>("headers")?.0,
        claim_version: row.try_get("claim_version")?,
        attempts: row.try_get("attempts")?,
        max_attempts: row.try_get("max_attempts")?,
        lease_until: row.try_get("lease_until")?,
    })
}

/// Handle on one outbox table. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
    table: String,
    sql: &'static Statements,
}

impl Store {
    /// A store over the default table `outbox`.
    pub fn new(pool: PgPool) -> Self {
        let sql =
            sql::statements(DEFAULT_TABLE).expect("the default table name is a valid identifier");
        Store {
            pool,
            table: DEFAULT_TABLE.to_owned(),
            sql,
        }
    }

    /// A store over another outbox table (validated as a safe identifier).
    pub fn for_table(pool: PgPool, table: &str) -> Result<Self> {
        let sql = sql::statements(table)?;
        Ok(Store {
            pool,
            table: table.to_owned(),
            sql,
        })
    }

    /// The pool this store uses.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The table this store reads and writes.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The channel enqueue notifies on for this table (see [`notify_channel`]).
    pub fn notify_channel(&self) -> String {
        notify_channel(&self.table)
    }

    /// Claim up to `limit` events in one statement and commit the claim before returning.
    /// With `ordered`, an event is only claimable when no earlier event of its aggregate is
    /// pending or processing.
    ///
    /// The lease runs until the database's `now() + lease`. Events come back in id order.
    pub async fn claim_batch(
        &self,
        worker: &str,
        limit: i64,
        lease: Duration,
        ordered: bool,
    ) -> Result<Vec<ClaimedEvent>> {
        let statement = if ordered {
            self.sql.claim_batch_ordered
        } else {
            self.sql.claim_batch
        };
        let rows = sqlx::query(statement)
            .bind(limit)
            .bind(micros(lease))
            .bind(worker)
            .fetch_all(&self.pool)
            .await?;
        let mut claimed = rows.iter().map(claimed_event).collect::<Result<Vec<_>>>()?;
        claimed.sort_by_key(|e| e.id);
        Ok(claimed)
    }

    /// Mark one claimed event delivered, if the claim is still ours.
    pub async fn complete_if_owned(&self, claim: Claim) -> Result<Ownership> {
        let done = sqlx::query(self.sql.complete)
            .bind(claim.id)
            .bind(claim.claim_version)
            .execute(&self.pool)
            .await?;
        Ok(ownership(done.rows_affected()))
    }

    /// Mark many claimed events delivered in one statement; returns the claims that were
    /// lost (every other claim was completed).
    pub async fn complete_many_if_owned(&self, claims: &[Claim]) -> Result<Vec<Claim>> {
        self.fenced_batch(self.sql.complete_many, claims, None)
            .await
    }

    /// Complete many claimed events by deleting their rows, in one statement; returns the
    /// claims that were lost (their rows are left as they are). The cheapest completion: no
    /// delivered history is kept, and the operation keys are free again at once. A worker with
    /// a retention of zero completes this way.
    pub async fn complete_many_by_deleting_if_owned(&self, claims: &[Claim]) -> Result<Vec<Claim>> {
        self.fenced_batch(self.sql.complete_many_delete, claims, None)
            .await
    }

    /// Run a fenced batch statement taking `($1 ids, $2 claim_versions[, $3 lease])` and
    /// returning the ids it changed; returns the claims it did not change (lost).
    async fn fenced_batch(
        &self,
        statement: &'static str,
        claims: &[Claim],
        lease: Option<Duration>,
    ) -> Result<Vec<Claim>> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let (ids, versions) = split_claims(claims);
        let query = sqlx::query_scalar(statement).bind(ids).bind(versions);
        let query = match lease {
            Some(lease) => query.bind(micros(lease)),
            None => query,
        };
        let changed: HashSet<i64> = query.fetch_all(&self.pool).await?.into_iter().collect();
        Ok(lost_claims(claims, &changed))
    }

    /// Extend the lease of a claim to `now() + lease`, if it is still ours.
    pub async fn renew_if_owned(&self, claim: Claim, lease: Duration) -> Result<Ownership> {
        let done = sqlx::query(self.sql.renew)
            .bind(claim.id)
            .bind(claim.claim_version)
            .bind(micros(lease))
            .execute(&self.pool)
            .await?;
        Ok(ownership(done.rows_affected()))
    }

    /// Extend the leases of many claims in one statement; returns the claims that were lost.
    pub async fn renew_many_if_owned(
        &self,
        claims: &[Claim],
        lease: Duration,
    ) -> Result<Vec<Claim>> {
        self.fenced_batch(self.sql.renew_many, claims, Some(lease))
            .await
    }

    /// Record a failed attempt: back to pending after `retry_after`, or exhausted when
    /// `permanent` or the attempts are used up. Fenced like completion.
    pub async fn fail_if_owned(
        &self,
        claim: Claim,
        error: &str,
        retry_after: Duration,
        permanent: bool,
    ) -> Result<FailOutcome> {
        let status: Option<String> = sqlx::query_scalar(self.sql.fail)
            .bind(claim.id)
            .bind(claim.claim_version)
            .bind(error)
            .bind(micros(retry_after))
            .bind(permanent)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match status.as_deref() {
            None => FailOutcome::Lost,
            Some("exhausted") => FailOutcome::Exhausted,
            Some(_) => FailOutcome::Rescheduled,
        })
    }

    /// Hand a claimed but unstarted event back without charging the attempt.
    pub async fn release_if_owned(&self, claim: Claim) -> Result<Ownership> {
        let done = sqlx::query(self.sql.release)
            .bind(claim.id)
            .bind(claim.claim_version)
            .execute(&self.pool)
            .await?;
        Ok(ownership(done.rows_affected()))
    }

    /// Return up to `limit` expired leases to pending, or to exhausted when their attempts
    /// are used up.
    pub async fn recover_expired(&self, limit: i64) -> Result<RecoveryCounts> {
        let statuses: Vec<String> = sqlx::query_scalar(self.sql.recover_expired)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        let mut counts = RecoveryCounts::default();
        for status in statuses {
            if status == "exhausted" {
                counts.exhausted += 1;
            } else {
                counts.requeued += 1;
            }
        }
        Ok(counts)
    }

    /// Counts per status and the age of the oldest pending event: [`Store::gauges`] plus the
    /// delivered count, which may scan the retained history (operators, not timers).
    pub async fn stats(&self) -> Result<Stats> {
        let gauges = self.gauges().await?;
        let delivered: i64 = sqlx::query_scalar(self.sql.count_delivered)
            .fetch_one(&self.pool)
            .await?;
        Ok(Stats {
            pending: gauges.pending,
            processing: gauges.processing,
            delivered,
            exhausted: gauges.exhausted,
            oldest_pending_age: gauges.oldest_pending_age,
        })
    }

    /// The queue gauges: like [`Store::stats`] without counting delivered rows (cheap enough
    /// to run every few seconds on a table holding a long retention period).
    pub async fn gauges(&self) -> Result<QueueGauges> {
        let row = sqlx::query(self.sql.gauges).fetch_one(&self.pool).await?;
        let age: Option<f64> = row.try_get("oldest_pending_age_seconds")?;
        Ok(QueueGauges {
            pending: row.try_get("pending")?,
            processing: row.try_get("processing")?,
            exhausted: row.try_get("exhausted")?,
            oldest_pending_age: age.map(|s| Duration::from_secs_f64(s.max(0.0))),
        })
    }

    /// Operator action: put one exhausted event back to pending with fresh attempts.
    /// Returns false when no exhausted event has that id.
    pub async fn retry_exhausted(&self, event_id: Uuid) -> Result<bool> {
        let done = sqlx::query(self.sql.retry_exhausted)
            .bind(event_id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Operator action: put every exhausted event of `event_type` back to pending with fresh
    /// attempts; returns how many.
    pub async fn retry_exhausted_of_type(&self, event_type: &str) -> Result<u64> {
        let done = sqlx::query(self.sql.retry_exhausted_of_type)
            .bind(event_type)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// Operator listing: up to `limit` exhausted events, most recently exhausted first.
    pub async fn exhausted_events(&self, limit: i64) -> Result<Vec<ExhaustedEvent>> {
        let rows = sqlx::query(self.sql.exhausted_events)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(ExhaustedEvent {
                    event_id: row.try_get("event_id")?,
                    event_type: row.try_get("event_type")?,
                    event_version: row.try_get("event_version")?,
                    attempts: row.try_get("attempts")?,
                    last_error: row.try_get("last_error")?,
                    lease_expiries: row.try_get("lease_expiries")?,
                    handler_failures: row.try_get("handler_failures")?,
                    updated_at: row.try_get("updated_at")?,
                })
            })
            .collect()
    }

    /// Operator action: delete up to `limit` delivered events older than `older_than`.
    pub async fn purge_delivered(&self, older_than: Duration, limit: i64) -> Result<u64> {
        let done = sqlx::query(self.sql.purge_delivered)
            .bind(micros(older_than))
            .bind(limit)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}

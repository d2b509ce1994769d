//! Every SQL statement against an outbox table, each in one place (`store/sql/*.sql`).
//!
//! State changes of a claimed event are fenced: they only apply while the row is `processing`,
//! still carries the caller's `claim_version`, and its lease is live. They return
//! [`Ownership`], never a bare row count.
//!
//! OWNER: issue 2 (runtime core). The signatures below are the contract other modules use.

pub mod enqueue;

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

pub use enqueue::EnqueueOptions;

use crate::error::Result;

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
        Claim { id: self.id, claim_version: self.claim_version }
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
    /// Age of the oldest pending event, by the database clock.
    pub oldest_pending_age: Option<Duration>,
}

/// Handle on one outbox table. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
    table: String,
}

impl Store {
    /// A store over the default table `outbox`.
    pub fn new(pool: PgPool) -> Self {
        Store { pool, table: DEFAULT_TABLE.to_owned() }
    }

    /// A store over another outbox table (validated as a safe identifier).
    pub fn for_table(pool: PgPool, table: &str) -> Result<Self> {
        let _ = (pool, table);
        todo!("issue 2")
    }

    /// The pool this store uses.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The table this store reads and writes.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Claim up to `limit` events in one statement and commit the claim before returning.
    /// With `ordered`, an event is only claimable when no earlier event of its aggregate is
    /// pending or processing.
    pub async fn claim_batch(
        &self,
        worker: &str,
        limit: i64,
        lease: Duration,
        ordered: bool,
    ) -> Result<Vec<ClaimedEvent>> {
        let _ = (worker, limit, lease, ordered);
        todo!("issue 2")
    }

    /// Mark one claimed event delivered, if the claim is still ours.
    pub async fn complete_if_owned(&self, claim: Claim) -> Result<Ownership> {
        let _ = claim;
        todo!("issue 2")
    }

    /// Mark many claimed events delivered in one statement; returns the claims that were
    /// lost (every other claim was completed).
    pub async fn complete_many_if_owned(&self, claims: &[Claim]) -> Result<Vec<Claim>> {
        let _ = claims;
        todo!("issue 2")
    }

    /// Extend the lease of a claim to `now() + lease`, if it is still ours.
    pub async fn renew_if_owned(&self, claim: Claim, lease: Duration) -> Result<Ownership> {
        let _ = (claim, lease);
        todo!("issue 2")
    }

    /// Extend the leases of many claims in one statement; returns the claims that were lost.
    pub async fn renew_many_if_owned(&self, claims: &[Claim], lease: Duration) -> Result<Vec<Claim>> {
        let _ = (claims, lease);
        todo!("issue 2")
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
        let _ = (claim, error, retry_after, permanent);
        todo!("issue 2")
    }

    /// Hand a claimed but unstarted event back without charging the attempt.
    pub async fn release_if_owned(&self, claim: Claim) -> Result<Ownership> {
        let _ = claim;
        todo!("issue 2")
    }

    /// Return up to `limit` expired leases to pending, or to exhausted when their attempts
    /// are used up.
    pub async fn recover_expired(&self, limit: i64) -> Result<RecoveryCounts> {
        let _ = limit;
        todo!("issue 2")
    }

    /// Counts per status and the age of the oldest pending event.
    pub async fn stats(&self) -> Result<Stats> {
        todo!("issue 2")
    }

    /// Operator action: put one exhausted event back to pending with fresh attempts.
    pub async fn retry_exhausted(&self, event_id: Uuid) -> Result<bool> {
        let _ = event_id;
        todo!("issue 2")
    }

    /// Operator action: delete up to `limit` delivered events older than `older_than`.
    pub async fn purge_delivered(&self, older_than: Duration, limit: i64) -> Result<u64> {
        let _ = (older_than, limit);
        todo!("issue 2")
    }
}

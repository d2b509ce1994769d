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
mod contract_check;
pub mod enqueue;
pub mod integrity;
pub mod listing;
pub mod relay_server;
pub mod sql;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

pub use contract_check::RECHECK_UNREGISTERED;
pub use enqueue::EnqueueOptions;
pub use listing::{StoredEvent, list_events};
pub use sql::validate_table_name;

use crate::error::{PayloadPart, Result};
use crate::payload_limits;
use sql::Statements;

/// The DDL of an outbox table named `table`: the event table `table`, its queue table
/// `{table}_queue`, their indexes and the invariants between them (every inserted event gets its
/// queue row; a queue row cannot outlive its event), `IF NOT EXISTS`, rendered from
/// `store/sql/create_table.sql`, `create_queue_table.sql` and `create_queue_invariants.sql`.
/// The base schema's `migrations/0001_outbox.sql` followed by `0004_split_layout.sql` and
/// `0005_queue_invariants.sql` reach the same tables for `outbox`.
///
/// Fails when `table` is not a valid identifier, ends in `_queue`, or is longer than 43
/// characters (its index names must fit PostgreSQL's 63-character limit).
pub fn create_table_sql(table: &str) -> Result<String> {
    sql::render_create_table(table)
}

/// The upgrade of an outbox table named `table` from the one-table layout of earlier versions
/// to the split layout of [`create_table_sql`]: creates
/// `{table}_queue`, moves the state of every event not delivered into it, and drops the state
/// columns from `table`. For a migration's transaction; it locks `table` first.
/// `migrations/0004_split_layout.sql` is this for `outbox`. Fails like [`create_table_sql`].
pub fn upgrade_split_layout_sql(table: &str) -> Result<String> {
    sql::render_upgrade_split_layout(table)
}

/// The invariants the database keeps for an outbox table named `table` created before they
/// existed: a statement-level trigger that gives every event inserted by any SQL its queue row,
/// and a foreign key (ON DELETE CASCADE) from a queue row to its event, added NOT VALID and
/// validated when no queue row lacks its event (`store/sql/create_queue_invariants.sql`).
/// Idempotent. `migrations/0005_queue_invariants.sql` is this for `outbox`; the migration
/// generator writes it for the tables earlier generated migrations created. Fails like
/// [`create_table_sql`].
pub fn upgrade_queue_invariants_sql(table: &str) -> Result<String> {
    sql::render_queue_invariants(table)
}

/// The queue table of the outbox table `table`: `{table}_queue`, the delivery state of its
/// events that are not delivered.
pub fn queue_table(table: &str) -> String {
    format!("{table}{}", sql::QUEUE_SUFFIX)
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
    /// How long the event had been claimable when this claim took it (since its enqueue, or
    /// since the end of its delay or retry backoff), by the database clock.
    pub waited: Duration,
    /// How long before this claim the event was enqueued (its `created_at`), by the database
    /// clock.
    pub since_enqueue: Duration,
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

/// What [`Store::renew_many_if_owned_skipping_held`] did with a batch of claims.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Renewal {
    /// Claims that are not the caller's any more (another claim, recovery, an expired lease, or
    /// the row is gone): nothing was renewed for them.
    pub lost: Vec<Claim>,
    /// Claims whose rows another transaction held: neither renewed nor known lost. Their leases
    /// keep running down; ask again at the next renewal.
    pub held: Vec<Claim>,
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

/// What [`Store::claim_batch_outcome`] claimed: the events to deliver, and the claimed rows that
/// could not be decoded (already exhausted, each with its own reason).
#[derive(Debug, Clone, Default)]
pub struct ClaimedBatch {
    /// Decoded events, in id order, ready for delivery.
    pub events: Vec<ClaimedEvent>,
    /// Claimed rows whose payload or headers no worker can decode.
    pub undecodable: Vec<UndecodableEvent>,
}

/// A claimed row whose payload or headers cannot be decoded (too deep, see
/// [`crate::payload_limits`], or not readable by `serde_json`): written by raw SQL, since
/// enqueue refuses such payloads. It is never delivered; the claim that found it exhausts it
/// with `reason`, and it never affects the other rows of its batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndecodableEvent {
    /// The claim that found the row.
    pub claim: Claim,
    /// Stable event id (what an operator's `retry` takes once the row is fixed).
    pub event_id: Uuid,
    /// Event name.
    pub event_type: String,
    /// Why it cannot be decoded, as stored in `last_error`.
    pub reason: String,
    /// Whether the row was exhausted with that reason.
    pub outcome: UndecodableOutcome,
}

/// What became of an [`UndecodableEvent`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UndecodableOutcome {
    /// Now exhausted, with the reason in `last_error`.
    Exhausted,
    /// The claim was lost before it could be exhausted (its lease ran out in between); the row
    /// was left as it was.
    Lost,
    /// The exhausting statement failed (the database error is kept here); the row stays
    /// claimed until its lease expires, and the next claim of it tries again.
    NotRecorded(String),
}

/// The backoff [`Store::recover_expired`] applies to an expired lease before its event is
/// claimable again: for the attempt that expired (1-based), `min(base * 2^(attempt-1), max)`,
/// with the exponent capped at 31, and with the upper half random when `jitter` is set. The
/// same formula as a worker's retry policy (`worker::RetryPolicy`), whose values a worker's
/// maintenance passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryBackoff {
    /// Delay after the first expired attempt.
    pub base: Duration,
    /// Largest delay.
    pub max: Duration,
    /// Randomise the upper half of each delay.
    pub jitter: bool,
}

impl RecoveryBackoff {
    /// No backoff: a requeued event is claimable at once (tests that step through recovery).
    pub const NONE: RecoveryBackoff = RecoveryBackoff {
        base: Duration::ZERO,
        max: Duration::ZERO,
        jitter: false,
    };
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
    /// Events delivered and not yet purged.
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

/// Where an event stands, as told by [`Store::event_status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventStatus {
    /// Waiting to be claimed (perhaps scheduled for later: a delay, a retry's backoff).
    Pending,
    /// Claimed by a worker, being delivered.
    Processing,
    /// Delivered: kept as history until the purge.
    Delivered,
    /// Attempts used up or failed permanently; waits for an operator's retry.
    Exhausted,
}

impl EventStatus {
    fn from_stored(status: &str) -> Result<EventStatus> {
        Ok(match status {
            "pending" => EventStatus::Pending,
            "processing" => EventStatus::Processing,
            "delivered" => EventStatus::Delivered,
            "exhausted" => EventStatus::Exhausted,
            other => {
                return Err(crate::error::Error::Config(format!(
                    "the outbox table holds an unknown status `{other}`; this version knows pending, \
                     processing, delivered and exhausted: is a newer version writing to the table?"
                )));
            }
        })
    }
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

/// A non-negative number of seconds the database computed, as a duration (zero for anything
/// that is not a finite, non-negative number).
fn seconds(value: f64) -> Duration {
    Duration::try_from_secs_f64(value).unwrap_or(Duration::ZERO)
}

/// The claims of `claims` that are not in `kept`. Decided by the whole claim (row id and
/// claim_version), never by the row id alone: a batch may hold a stale claim of a row next to
/// this worker's fresh claim of the same row, and only the fresh one was kept.
fn lost_claims(claims: &[Claim], kept: &HashSet<Claim>) -> Vec<Claim> {
    claims
        .iter()
        .filter(|c| !kept.contains(c))
        .copied()
        .collect()
}

/// Run a fenced batch statement taking `($1 ids, $2 claim_versions[, $3 lease])` and returning
/// the `(id, claim_version)` pairs it changed; returns the claims it did not change (lost).
async fn fenced_batch_on<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    statement: &'static str,
    claims: &[Claim],
    lease: Option<Duration>,
) -> Result<Vec<Claim>> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let (ids, versions) = split_claims(claims);
    let query = sqlx::query_as::<_, (i64, i64)>(statement)
        .bind(ids)
        .bind(versions);
    let query = match lease {
        Some(lease) => query.bind(micros(lease)),
        None => query,
    };
    let changed: HashSet<Claim> = query
        .fetch_all(executor)
        .await?
        .into_iter()
        .map(|(id, claim_version)| Claim { id, claim_version })
        .collect();
    Ok(lost_claims(claims, &changed))
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

/// One claimed row, decoded on its own: nothing about one row can fail another.
enum DecodedRow {
    Event(ClaimedEvent),
    Undecodable {
        claim: Claim,
        event_id: Uuid,
        event_type: String,
        reason: String,
    },
}

/// Decode a claimed row. Only columns every row has by the table's definition (ids and
/// counters, `NOT NULL`) fail the whole batch; the JSON columns are read undecoded and decoded
/// with the same check enqueue applies ([`payload_limits`]), so a row that fails is reported on
/// its own.
fn decode_claimed(row: &sqlx::postgres::PgRow) -> Result<DecodedRow> {
    let id: i64 = row.try_get("id")?;
    let claim_version: i64 = row.try_get("claim_version")?;
    let event_id: Uuid = row.try_get("event_id")?;
    let event_type: String = row.try_get("event_type")?;
    let json =
        |part: PayloadPart, column: &str| -> std::result::Result<serde_json::Value, String> {
            // Read as a raw JSON text first: `RawValue` only checks the syntax, iteratively, so
            // neither depth nor numbers can fail it where a `Value` decode would. Borrowed from
            // the row: the text is parsed once more right below, so a copy would be thrown away.
            let raw = row
                .try_get::<Json<&RawValue>, _>(column)
                .map_err(|e| format!("undecodable {part}: {e}"))?;
            payload_limits::decode_stored(part, raw.0.get())
        };
    let decoded = json(PayloadPart::Payload, "payload")
        .and_then(|payload| Ok((payload, json(PayloadPart::Headers, "headers")?)));
    match decoded {
        Ok((payload, headers)) => Ok(DecodedRow::Event(ClaimedEvent {
            id,
            event_id,
            event_type,
            event_version: row.try_get("event_version")?,
            aggregate_type: row.try_get("aggregate_type")?,
            aggregate_id: row.try_get("aggregate_id")?,
            aggregate_version: row.try_get("aggregate_version")?,
            payload,
            headers,
            claim_version,
            attempts: row.try_get("attempts")?,
            max_attempts: row.try_get("max_attempts")?,
            lease_until: row.try_get("lease_until")?,
            waited: seconds(row.try_get("waited_seconds")?),
            since_enqueue: seconds(row.try_get("age_seconds")?),
        })),
        Err(reason) => Ok(DecodedRow::Undecodable {
            claim: Claim { id, claim_version },
            event_id,
            event_type,
            reason: format!(
                "{reason}; no worker can deliver this row, so it was exhausted without delivery: \
                 correct the stored row and retry the event"
            ),
        }),
    }
}

/// Events of one type and version that no live worker of the table claims
/// ([`Store::unhandled_events`]): a missing deploy, not a failure.
#[derive(Debug, Clone, PartialEq)]
pub struct UnhandledEvents {
    /// Stored event name.
    pub event_type: String,
    /// Stored event version.
    pub event_version: i32,
    /// How many of them wait (among the oldest ready pending events looked at).
    pub waiting: i64,
    /// Since when the oldest of them could have been claimed (database clock).
    pub since: DateTime<Utc>,
    /// How long ago `since` was, by the database clock.
    pub age: Duration,
    /// The live workers of the table (0: none advertises itself, see `docs/rolling-deploys.md`).
    pub live_workers: i64,
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
    /// Each row is decoded on its own: a claimed row whose payload or headers cannot be decoded
    /// is exhausted with its own reason and left out, and the others come back (see
    /// [`Store::claim_batch_outcome`], which also reports those rows).
    pub async fn claim_batch(
        &self,
        worker: &str,
        limit: i64,
        lease: Duration,
        ordered: bool,
    ) -> Result<Vec<ClaimedEvent>> {
        Ok(self
            .claim_batch_outcome(worker, limit, lease, ordered)
            .await?
            .events)
    }

    /// [`Store::claim_batch`], also reporting the claimed rows that could not be decoded.
    ///
    /// Such a row is exhausted right after the claim, fenced by the claim's `claim_version`,
    /// with its own reason in `last_error` (its attempt stays charged). An error here is a
    /// failure of the claim statement itself: once the claim committed, its decodable rows are
    /// always returned.
    pub async fn claim_batch_outcome(
        &self,
        worker: &str,
        limit: i64,
        lease: Duration,
        ordered: bool,
    ) -> Result<ClaimedBatch> {
        let mut session = self.pool.acquire().await?;
        self.claim_batch_on(&mut session, worker, limit, lease, ordered, None)
            .await
    }

    /// [`Store::claim_batch_outcome`] limited to the events whose stored (name, version) is
    /// one of `handled`: every other event stays pending, with no attempt charged, for a
    /// worker that handles it. An empty `handled` claims nothing.
    pub async fn claim_batch_handled(
        &self,
        worker: &str,
        limit: i64,
        lease: Duration,
        ordered: bool,
        handled: &[(String, u32)],
    ) -> Result<ClaimedBatch> {
        let mut session = self.pool.acquire().await?;
        self.claim_batch_on(&mut session, worker, limit, lease, ordered, Some(handled))
            .await
    }

    /// [`Store::claim_batch_outcome`] on a session the caller holds (the worker's claimer keeps
    /// one for its whole run): no pool checkout, so none of the liveness round trips the pool
    /// adds to each checkout and return. `handled`, when given, limits the claim to those
    /// stored (name, version) pairs ([`Store::claim_batch_handled`]).
    pub(crate) async fn claim_batch_on(
        &self,
        session: &mut PgConnection,
        worker: &str,
        limit: i64,
        lease: Duration,
        ordered: bool,
        handled: Option<&[(String, u32)]>,
    ) -> Result<ClaimedBatch> {
        let statement = match (ordered, handled.is_some()) {
            (false, false) => self.sql.claim_batch,
            (true, false) => self.sql.claim_batch_ordered,
            (false, true) => self.sql.claim_batch_handled,
            (true, true) => self.sql.claim_batch_ordered_handled,
        };
        let mut query = sqlx::query(statement)
            .bind(limit)
            .bind(micros(lease))
            .bind(worker);
        if let Some(handled) = handled {
            // Two arrays of one length, paired by position (unnest in the statement).
            let (names, versions): (Vec<&str>, Vec<i32>) = handled
                .iter()
                .map(|(name, version)| (name.as_str(), i32::try_from(*version).unwrap_or(i32::MAX)))
                .unzip();
            query = query.bind(names).bind(versions);
        }
        let rows = query.fetch_all(&mut *session).await?;
        let mut batch = ClaimedBatch::default();
        for row in &rows {
            match decode_claimed(row)? {
                DecodedRow::Event(event) => batch.events.push(event),
                DecodedRow::Undecodable {
                    claim,
                    event_id,
                    event_type,
                    reason,
                } => {
                    let outcome = self.exhaust_undecodable(session, claim, &reason).await;
                    batch.undecodable.push(UndecodableEvent {
                        claim,
                        event_id,
                        event_type,
                        reason,
                        outcome,
                    });
                }
            }
        }
        batch.events.sort_by_key(|e| e.id);
        Ok(batch)
    }

    /// End a just-claimed undecodable row as exhausted with `reason`, if the claim is still ours.
    async fn exhaust_undecodable(
        &self,
        session: &mut PgConnection,
        claim: Claim,
        reason: &str,
    ) -> UndecodableOutcome {
        let done = sqlx::query(self.sql.exhaust_undecodable)
            .bind(claim.id)
            .bind(claim.claim_version)
            .bind(reason)
            .execute(&mut *session)
            .await;
        match done.map(|d| ownership(d.rows_affected())) {
            Ok(Ownership::Owned) => UndecodableOutcome::Exhausted,
            Ok(Ownership::Lost) => UndecodableOutcome::Lost,
            Err(e) => UndecodableOutcome::NotRecorded(e.to_string()),
        }
    }

    /// Advertise `worker` in `outbox_workers` as a live worker of this table that claims
    /// `handles` (`None`: every event) for `ttl` from now, and drop the table's workers whose
    /// time ran out. Called at start and every maintenance interval by each worker.
    pub async fn heartbeat(
        &self,
        worker: &str,
        handles: Option<&[(String, u32)]>,
        ttl: Duration,
    ) -> Result<()> {
        let handles = handles.map(|pairs| {
            serde_json::Value::Array(
                pairs
                    .iter()
                    .map(|(name, version)| serde_json::json!({"name": name, "version": version}))
                    .collect(),
            )
        });
        sqlx::query(sql::WORKER_HEARTBEAT)
            .bind(&self.table)
            .bind(worker)
            .bind(handles)
            .bind(micros(ttl))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Remove `worker` from this table's live workers (it stopped claiming).
    pub async fn leave(&self, worker: &str) -> Result<()> {
        sqlx::query(sql::WORKER_LEAVE)
            .bind(&self.table)
            .bind(worker)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The ready pending events that no live worker of this table claims, per stored type and
    /// version, oldest first, among the `limit` oldest ready pending events (an event nobody
    /// claims stays at the head of the queue). Empty when every waiting event has a worker.
    pub async fn unhandled_events(&self, limit: i64) -> Result<Vec<UnhandledEvents>> {
        let rows = sqlx::query(self.sql.unhandled_events)
            .bind(&self.table)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(UnhandledEvents {
                    event_type: row.try_get("event_type")?,
                    event_version: row.try_get("event_version")?,
                    waiting: row.try_get("waiting")?,
                    since: row.try_get("since")?,
                    age: seconds(row.try_get("age_seconds")?),
                    live_workers: row.try_get("live_workers")?,
                })
            })
            .collect()
    }

    /// Mark one claimed event delivered (its queue row is deleted; the event stays until the
    /// purge), if the claim is still ours.
    pub async fn complete_if_owned(&self, claim: Claim) -> Result<Ownership> {
        let done = sqlx::query(self.sql.complete)
            .bind(claim.id)
            .bind(claim.claim_version)
            .execute(&self.pool)
            .await?;
        Ok(ownership(done.rows_affected()))
    }

    /// Mark many claimed events delivered in one statement (their queue rows are deleted; the
    /// events stay until the purge); returns the claims that were lost (every other claim was
    /// completed).
    pub async fn complete_many_if_owned(&self, claims: &[Claim]) -> Result<Vec<Claim>> {
        self.fenced_batch(self.sql.complete_many, claims, None)
            .await
    }

    /// Complete many claimed events and delete the events too, in one statement; returns the
    /// claims that were lost (their rows are left as they are). No delivered history is kept,
    /// and the operation keys are free again at once. A worker with a retention of zero
    /// completes this way.
    pub async fn complete_many_by_deleting_if_owned(&self, claims: &[Claim]) -> Result<Vec<Claim>> {
        self.fenced_batch(self.sql.complete_many_delete, claims, None)
            .await
    }

    /// [`Store::complete_many_if_owned`], or with `forget_events`
    /// [`Store::complete_many_by_deleting_if_owned`], on a session the caller holds (the
    /// worker's completer keeps one; see [`Store::claim_batch_on`]).
    pub(crate) async fn complete_many_on(
        &self,
        session: &mut PgConnection,
        claims: &[Claim],
        forget_events: bool,
    ) -> Result<Vec<Claim>> {
        let statement = if forget_events {
            self.sql.complete_many_delete
        } else {
            self.sql.complete_many
        };
        fenced_batch_on(&mut *session, statement, claims, None).await
    }

    /// [`fenced_batch_on`] this store's pool.
    async fn fenced_batch(
        &self,
        statement: &'static str,
        claims: &[Claim],
        lease: Option<Duration>,
    ) -> Result<Vec<Claim>> {
        fenced_batch_on(&self.pool, statement, claims, lease).await
    }

    /// Of `claims`, the ones whose events an earlier completion already settled: their queue
    /// rows are gone, so the events are delivered.
    ///
    /// For a completion whose outcome is unknown (the connection died after the statement was
    /// sent, so it may have committed) and whose retry reported these claims lost. A queue row
    /// is only ever deleted by a fenced completion, so a claim whose row is gone was completed,
    /// by this claim's own completion or, when this claim's lease had run out first, by another
    /// worker's: which one cannot be told any more, and either way the event is delivered and
    /// nothing was overwritten. A claim whose queue row is still there was not settled.
    pub async fn completed_earlier(&self, claims: &[Claim]) -> Result<Vec<Claim>> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let (ids, versions) = split_claims(claims);
        let settled: Vec<(i64, i64)> = sqlx::query_as(self.sql.completed_earlier)
            .bind(ids)
            .bind(versions)
            .fetch_all(&self.pool)
            .await?;
        let settled: HashSet<Claim> = settled
            .into_iter()
            .map(|(id, claim_version)| Claim { id, claim_version })
            .collect();
        Ok(claims
            .iter()
            .filter(|c| settled.contains(c))
            .copied()
            .collect())
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

    /// [`Store::renew_many_if_owned`] for the rows no other transaction holds: the held ones
    /// are skipped, neither renewed nor counted lost, instead of being waited for.
    ///
    /// For a renewer that must not stall behind one row: a completion being written holds its
    /// rows until it commits, and so does an operator's `SELECT ... FOR UPDATE` or a migration,
    /// for as long as they take. A renewal that waited for such a row would let every other
    /// lease of the batch run down meanwhile; this one renews the others and leaves the held
    /// row's claim to be asked about again next time (its lease keeps running down, so a row held
    /// past its lease is lost by that claim alone). Four round trips (begin, the locks, the
    /// renewal, commit) where [`Store::renew_many_if_owned`] takes one: for a renewer, which runs
    /// once a renew interval, not for a hot path.
    pub async fn renew_many_if_owned_skipping_held(
        &self,
        claims: &[Claim],
        lease: Duration,
    ) -> Result<Renewal> {
        if claims.is_empty() {
            return Ok(Renewal::default());
        }
        let (ids, _) = split_claims(claims);
        let mut tx = self.pool.begin().await?;
        let rows: HashMap<i64, bool> = sqlx::query_as::<_, (i64, bool)>(self.sql.lock_free_rows)
            .bind(ids)
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .collect();
        let (mut free, mut held, mut gone) = (Vec::new(), Vec::new(), Vec::new());
        for &claim in claims {
            match rows.get(&claim.id) {
                Some(true) => free.push(claim),
                Some(false) => held.push(claim),
                // No row any more (a completion that deletes it, the purge): not ours.
                None => gone.push(claim),
            }
        }
        let mut lost = fenced_batch_on(&mut *tx, self.sql.renew_many, &free, Some(lease)).await?;
        tx.commit().await?;
        lost.extend(gone);
        Ok(Renewal { lost, held })
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
    ///
    /// A requeued event becomes claimable again only after `backoff` for the attempt whose lease
    /// expired (computed per row by the database, see [`RecoveryBackoff`]), so a payload that
    /// crashes or stalls every worker that takes it waits longer each time instead of being
    /// claimed again at once; `last_error` says whose lease expired.
    pub async fn recover_expired(
        &self,
        limit: i64,
        backoff: RecoveryBackoff,
    ) -> Result<RecoveryCounts> {
        let statuses: Vec<String> = sqlx::query_scalar(self.sql.recover_expired)
            .bind(limit)
            .bind(micros(backoff.base))
            .bind(micros(backoff.max))
            .bind(backoff.jitter)
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

    /// Where the event `event_id` stands; `None` when the table holds no such event (never
    /// enqueued here, or purged after its retention).
    pub async fn event_status(&self, event_id: Uuid) -> Result<Option<EventStatus>> {
        let status: Option<String> = sqlx::query_scalar(self.sql.event_status)
            .bind(event_id)
            .fetch_optional(&self.pool)
            .await?;
        status.as_deref().map(EventStatus::from_stored).transpose()
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

    /// Make every pending event that is scheduled for later (an enqueue delay, a retry's
    /// backoff) claimable now; returns how many. Only the schedule changes. For tests that
    /// deliver such events without waiting (the test kit's `Drain::include_delayed`).
    pub async fn make_delayed_due(&self) -> Result<u64> {
        let done = sqlx::query(self.sql.make_delayed_due)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// Operator action: delete up to `limit` delivered events enqueued more than `older_than`
    /// ago (the retention counts from the enqueue: the event table keeps no delivery time).
    pub async fn purge_delivered(&self, older_than: Duration, limit: i64) -> Result<u64> {
        let done = sqlx::query(self.sql.purge_delivered)
            .bind(micros(older_than))
            .bind(limit)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}

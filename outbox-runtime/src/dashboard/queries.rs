//! The dashboard's reads: one function per view, each running the store's statement files
//! (`store/sql/dashboard/`, rendered for the table) and returning what its JSON endpoint sends.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgPool, Row};
use uuid::Uuid;

use crate::error::Result;
use crate::generate::{CompiledEvent, compare_registry, registry_rows};
use crate::store::Store;
use crate::store::sql::dashboard as sql;
use crate::store::sql::render;

/// Delivered events are counted exactly up to this many; beyond it the overview shows the
/// planner's estimate, so the page costs the same on a table of a thousand events or a billion.
pub const DELIVERED_EXACT_UP_TO: i64 = 10_000;

fn statement(template: &str, table: &str) -> sqlx::AssertSqlSafe<String> {
    // `table` was validated when the dashboard was configured (`DashboardConfig::table`).
    sqlx::AssertSqlSafe(render(template, table))
}

/// The delivered events still kept: exact when few, else an estimate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeliveredCount {
    /// The count, or the estimate (`None`: more than [`DELIVERED_EXACT_UP_TO`] and the table was
    /// never analysed, so there is no estimate).
    pub count: Option<i64>,
    /// True when `count` is a count, false when it is the planner's estimate.
    pub exact: bool,
    /// At least this many (the exact cap when it was reached).
    pub at_least: i64,
}

/// One minute of the last hour: the events enqueued in it, and where they stand now.
///
/// Not a delivery rate: a delivered event keeps no delivery time (the completion deletes its
/// queue row, the only state it had), so deliveries per minute and the enqueue-to-delivery
/// latency are the workers' metrics (`outbox_delivered_total`,
/// `outbox_delivery_latency_seconds`). What the table still tells is whether each minute's
/// events got through: `enqueued - delivered - exhausted` of them are still open.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Minute {
    /// The minute's start.
    pub minute: DateTime<Utc>,
    /// Events enqueued in it (and not purged since).
    pub enqueued: i64,
    /// Of those, the events delivered by now.
    pub delivered: i64,
    /// Of those, the events exhausted by now.
    pub exhausted: i64,
}

/// One table's line of the overview.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TableOverview {
    /// The outbox table.
    pub table: String,
    /// Events waiting to be claimed (including those scheduled for later).
    pub pending: i64,
    /// Events claimed by a worker now.
    pub processing: i64,
    /// Delivered events not yet purged.
    pub delivered: DeliveredCount,
    /// Events that used up their attempts.
    pub exhausted: i64,
    /// How long the oldest pending event has been ready to claim, in seconds.
    pub oldest_pending_age_seconds: Option<f64>,
    /// Events that wait because no live worker handles their type and version (a missing
    /// deploy, not a failure), oldest first; empty when every waiting event has a worker or the
    /// base schema has no `outbox_workers` yet.
    pub unhandled: Vec<UnhandledRow>,
    /// The last hour's enqueues, minute by minute, oldest first.
    pub last_hour: Vec<Minute>,
    /// The [`LATEST_FAILURES`] most recently changed failing or exhausted events: the "why"
    /// next to the numbers.
    pub latest_failures: Vec<FailureRow>,
}

/// Events of one type and version that no live worker handles ([`Store::unhandled_events`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UnhandledRow {
    /// Stored event name.
    pub event_type: String,
    /// Stored event version.
    pub event_version: i32,
    /// How many wait (among the oldest ready pending events looked at).
    pub waiting: i64,
    /// Since when the oldest of them could have been claimed.
    pub since: DateTime<Utc>,
}

/// The oldest ready pending events the overview looks at for events no worker handles.
pub const UNHANDLED_LOOKED_AT: i64 = 10_000;

/// How many failing or exhausted events the overview lists per table.
pub const LATEST_FAILURES: i64 = 5;

/// The overview of one table.
pub async fn overview(pool: &PgPool, table: &str) -> Result<TableOverview> {
    let store = Store::for_table(pool.clone(), table)?;
    let gauges = store.gauges().await?;
    let row = sqlx::query(statement(sql::DELIVERED_COUNT, table))
        .bind(DELIVERED_EXACT_UP_TO)
        .bind(table)
        .fetch_one(pool)
        .await?;
    let capped: i64 = row.try_get("delivered_capped")?;
    let reltuples: Option<f64> = row.try_get("table_rows_estimate")?;
    let delivered = if capped < DELIVERED_EXACT_UP_TO {
        DeliveredCount {
            count: Some(capped),
            exact: true,
            at_least: capped,
        }
    } else {
        // reltuples counts every event; the open and exhausted ones (one queue row each) were
        // just counted exactly.
        let estimate = reltuples.filter(|r| *r >= 0.0).map(|r| {
            (r as i64 - gauges.pending - gauges.processing - gauges.exhausted).max(capped)
        });
        DeliveredCount {
            count: estimate,
            exact: false,
            at_least: capped,
        }
    };
    let last_hour = sqlx::query(statement(sql::THROUGHPUT, table))
        .fetch_all(pool)
        .await?
        .iter()
        .map(|row| {
            Ok(Minute {
                minute: row.try_get("minute")?,
                enqueued: row.try_get("enqueued")?,
                delivered: row.try_get("delivered")?,
                exhausted: row.try_get("exhausted")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let latest = FailureFilter {
        limit: Some(LATEST_FAILURES),
        ..FailureFilter::default()
    };
    let latest_failures = failures(pool, table, &latest).await?;
    let unhandled = store
        .unhandled_events(UNHANDLED_LOOKED_AT)
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|u| UnhandledRow {
            event_type: u.event_type,
            event_version: u.event_version,
            waiting: u.waiting,
            since: u.since,
        })
        .collect();
    Ok(TableOverview {
        unhandled,
        table: table.to_owned(),
        pending: gauges.pending,
        processing: gauges.processing,
        delivered,
        exhausted: gauges.exhausted,
        oldest_pending_age_seconds: gauges.oldest_pending_age.map(|d| d.as_secs_f64()),
        last_hour,
        latest_failures,
    })
}

/// One event type and version.
///
/// No failure rate: the attempts that failed before a delivery succeeded are not kept (a
/// delivered event keeps no delivery state), so the table cannot tell failed attempts from all
/// attempts. The workers' metrics can (`outbox_retried_total` and `outbox_exhausted_total`
/// against `outbox_delivered_total`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventTypeRow {
    /// Event name.
    pub event_type: String,
    /// Payload version.
    pub event_version: i32,
    /// Pending events.
    pub pending: i64,
    /// Events being delivered.
    pub processing: i64,
    /// Exhausted events.
    pub exhausted: i64,
    /// Failed attempts the events not delivered record (lease expiries plus handler failures).
    pub failures: i64,
    /// Events enqueued in the last hour.
    pub enqueued_last_hour: i64,
    /// Of those, the events delivered by now.
    pub delivered_of_last_hour: i64,
    /// The most recent error of an event of this type not delivered.
    pub last_error: Option<String>,
    /// When that event's state last changed.
    pub last_failure_at: Option<DateTime<Utc>>,
}

/// Counts per event type and version.
pub async fn event_types(pool: &PgPool, table: &str) -> Result<Vec<EventTypeRow>> {
    let rows = sqlx::query(statement(sql::EVENT_TYPES, table))
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|row| {
            Ok(EventTypeRow {
                event_type: row.try_get("event_type")?,
                event_version: row.try_get("event_version")?,
                pending: row.try_get("pending")?,
                processing: row.try_get("processing")?,
                exhausted: row.try_get("exhausted")?,
                failures: row.try_get("failures")?,
                enqueued_last_hour: row.try_get("enqueued_last_hour")?,
                delivered_of_last_hour: row.try_get("delivered_of_last_hour")?,
                last_error: row.try_get("last_error")?,
                last_failure_at: row.try_get("last_failure_at")?,
            })
        })
        .collect()
}

/// The filters of the failures view (every one optional).
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
pub struct FailureFilter {
    /// `failing` (open events that failed at least once), `exhausted`, or both when absent.
    pub state: Option<String>,
    /// Exactly this event type.
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// Exactly this aggregate id.
    pub aggregate: Option<String>,
    /// Changed at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Changed within this long before the database's `now()`.
    pub within: Option<std::time::Duration>,
    /// Case-insensitive text the last error contains.
    pub error: Option<String>,
    /// At most this many events (default 100, at most 1,000).
    pub limit: Option<i64>,
}

/// A failing or exhausted event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailureRow {
    /// Stable event id.
    pub event_id: Uuid,
    /// Event name.
    pub event_type: String,
    /// Payload version.
    pub event_version: i32,
    /// `pending`, `processing` or `exhausted`.
    pub status: String,
    /// Aggregate type, if any.
    pub aggregate_type: Option<String>,
    /// Aggregate id, if any.
    pub aggregate_id: Option<String>,
    /// Attempts charged since the last operator retry.
    pub attempts: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// Claims that ended with an expired lease (a worker crashed or stalled).
    pub lease_expiries: i32,
    /// Attempts a handler reported as failed (the receiver refused).
    pub handler_failures: i32,
    /// The last error.
    pub last_error: Option<String>,
    /// The worker that held the last claim.
    pub claimed_by: Option<String>,
    /// When the event was written.
    pub created_at: DateTime<Utc>,
    /// When its delivery state last changed.
    pub updated_at: DateTime<Utc>,
    /// When it may be claimed next (pending events).
    pub available_at: DateTime<Utc>,
}

/// Failing and exhausted events, newest change first.
pub async fn failures(
    pool: &PgPool,
    table: &str,
    filter: &FailureFilter,
) -> Result<Vec<FailureRow>> {
    let blank = |s: &Option<String>| {
        s.as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let state = blank(&filter.state);
    if let Some(state) = &state {
        if state != "failing" && state != "exhausted" {
            return Err(crate::Error::Config(format!(
                "state must be `failing` or `exhausted`, not `{}`",
                crate::contract::shown(state)
            )));
        }
    }
    let limit = filter.limit.unwrap_or(100).clamp(1, 1000);
    let rows = sqlx::query(statement(sql::FAILURES, table))
        .bind(state)
        .bind(blank(&filter.event_type))
        .bind(blank(&filter.aggregate))
        .bind(filter.since)
        .bind(blank(&filter.error))
        .bind(limit)
        .bind(
            filter
                .within
                .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX)),
        )
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|row| {
            Ok(FailureRow {
                event_id: row.try_get("event_id")?,
                event_type: row.try_get("event_type")?,
                event_version: row.try_get("event_version")?,
                status: row.try_get("status")?,
                aggregate_type: row.try_get("aggregate_type")?,
                aggregate_id: row.try_get("aggregate_id")?,
                attempts: row.try_get("attempts")?,
                max_attempts: row.try_get("max_attempts")?,
                lease_expiries: row.try_get("lease_expiries")?,
                handler_failures: row.try_get("handler_failures")?,
                last_error: row.try_get("last_error")?,
                claimed_by: row.try_get("claimed_by")?,
                created_at: row.try_get("created_at")?,
                updated_at: row.try_get("updated_at")?,
                available_at: row.try_get("available_at")?,
            })
        })
        .collect()
}

/// One step of an event's history, as far as its rows tell it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistoryStep {
    /// When, if the rows record it.
    pub at: Option<DateTime<Utc>>,
    /// What happened.
    pub what: String,
}

/// The delivery state of an event that is not delivered: its queue row. A delivered event has
/// none (the completion deletes it), so it keeps no attempts, error, claims or times but its
/// enqueue's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueState {
    /// When it may be claimed next.
    pub available_at: DateTime<Utc>,
    /// The lease of the current claim (processing events).
    pub lease_until: Option<DateTime<Utc>>,
    /// The worker that held the last claim.
    pub claimed_by: Option<String>,
    /// Claims so far (the fencing token).
    pub claim_version: i64,
    /// Attempts charged since the last operator retry.
    pub attempts: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// Claims that ended with an expired lease.
    pub lease_expiries: i32,
    /// Attempts a handler reported as failed.
    pub handler_failures: i32,
    /// The last error.
    pub last_error: Option<String>,
    /// When the state last changed.
    pub updated_at: DateTime<Utc>,
    /// When it was exhausted.
    pub exhausted_at: Option<DateTime<Utc>>,
}

/// One event, in full (the payload only when the dashboard shows payloads).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventDetail {
    /// Stable event id.
    pub event_id: Uuid,
    /// The operation key it was written under.
    pub operation_key: String,
    /// Event name.
    pub event_type: String,
    /// Payload version.
    pub event_version: i32,
    /// Aggregate type, if any.
    pub aggregate_type: Option<String>,
    /// Aggregate id, if any.
    pub aggregate_id: Option<String>,
    /// Aggregate version, if any.
    pub aggregate_version: Option<i64>,
    /// The stored headers.
    pub headers: serde_json::Value,
    /// The payload, or `None` when hidden.
    pub payload: Option<serde_json::Value>,
    /// Whether this dashboard shows payloads.
    pub payload_shown: bool,
    /// When it was written.
    pub created_at: DateTime<Utc>,
    /// `pending`, `processing`, `exhausted` or `delivered`.
    pub status: String,
    /// Its delivery state while it is not delivered; `None` once delivered.
    pub queue: Option<QueueState>,
    /// The history the rows' columns tell.
    pub history: Vec<HistoryStep>,
}

/// One event by id, or `None`.
pub async fn event(
    pool: &PgPool,
    table: &str,
    event_id: Uuid,
    show_payload: bool,
) -> Result<Option<EventDetail>> {
    let Some(row) = sqlx::query(statement(sql::EVENT, table))
        .bind(event_id)
        .bind(show_payload)
        .fetch_optional(pool)
        .await?
    else {
        return Ok(None);
    };
    let queued: bool = row.try_get("queued")?;
    let queue = if queued {
        Some(QueueState {
            available_at: row.try_get("available_at")?,
            lease_until: row.try_get("lease_until")?,
            claimed_by: row.try_get("claimed_by")?,
            claim_version: row.try_get("claim_version")?,
            attempts: row.try_get("attempts")?,
            max_attempts: row.try_get("max_attempts")?,
            lease_expiries: row.try_get("lease_expiries")?,
            handler_failures: row.try_get("handler_failures")?,
            last_error: row.try_get("last_error")?,
            updated_at: row.try_get("updated_at")?,
            exhausted_at: row.try_get("exhausted_at")?,
        })
    } else {
        None
    };
    let mut detail = EventDetail {
        event_id: row.try_get("event_id")?,
        operation_key: row.try_get("operation_key")?,
        event_type: row.try_get("event_type")?,
        event_version: row.try_get("event_version")?,
        aggregate_type: row.try_get("aggregate_type")?,
        aggregate_id: row.try_get("aggregate_id")?,
        aggregate_version: row.try_get("aggregate_version")?,
        headers: row.try_get("headers")?,
        payload: row.try_get("payload")?,
        payload_shown: show_payload,
        created_at: row.try_get("created_at")?,
        status: row.try_get("status")?,
        queue,
        history: Vec::new(),
    };
    let read_at: DateTime<Utc> = row.try_get("read_at")?;
    detail.history = history(&detail, read_at);
    Ok(Some(detail))
}

/// What the event's rows say happened, in order. The queue row keeps counters and the latest
/// times, not a log: each claim, failure and expiry is a count, and only the last change has a
/// time. A delivered event has no queue row left, so its history is its enqueue and its
/// delivery, without a time.
fn history(e: &EventDetail, read_at: DateTime<Utc>) -> Vec<HistoryStep> {
    let mut steps = vec![HistoryStep {
        at: Some(e.created_at),
        what: "written (pending)".to_owned(),
    }];
    let Some(q) = &e.queue else {
        steps.push(HistoryStep {
            at: None,
            what: "delivered (a delivered event keeps no delivery time, attempts or errors)"
                .to_owned(),
        });
        return steps;
    };
    if q.claim_version > 0 {
        let mut what = format!("claimed {} time(s)", q.claim_version);
        if let Some(worker) = &q.claimed_by {
            what.push_str(&format!(", last by {worker}"));
        }
        steps.push(HistoryStep { at: None, what });
    }
    if q.handler_failures > 0 {
        steps.push(HistoryStep {
            at: None,
            what: format!("a handler reported failure {} time(s)", q.handler_failures),
        });
    }
    if q.lease_expiries > 0 {
        steps.push(HistoryStep {
            at: None,
            what: format!(
                "a lease expired {} time(s) (worker crashed or stalled)",
                q.lease_expiries
            ),
        });
    }
    let now = match e.status.as_str() {
        "exhausted" => HistoryStep {
            at: q.exhausted_at,
            what: format!(
                "exhausted after {} of {} attempts",
                q.attempts, q.max_attempts
            ),
        },
        "processing" => HistoryStep {
            at: Some(q.updated_at),
            what: match q.lease_until {
                Some(lease) if lease > read_at => format!(
                    "being delivered (attempt {} of {}), lease ends in {}s",
                    q.attempts,
                    q.max_attempts,
                    (lease - read_at).num_seconds()
                ),
                _ => {
                    "being delivered, lease expired: recovery will return it to pending".to_owned()
                }
            },
        },
        _ if q.available_at > read_at => HistoryStep {
            at: Some(q.updated_at),
            what: format!(
                "pending, waiting to retry (attempt {} of {} used), claimable in {}s",
                q.attempts,
                q.max_attempts,
                (q.available_at - read_at).num_seconds()
            ),
        },
        _ => HistoryStep {
            at: Some(q.updated_at),
            what: format!(
                "pending, claimable now ({} of {} attempts used)",
                q.attempts, q.max_attempts
            ),
        },
    };
    steps.push(now);
    steps
}

/// A claim held now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClaimRow {
    /// Stable event id.
    pub event_id: Uuid,
    /// Event name.
    pub event_type: String,
    /// Payload version.
    pub event_version: i32,
    /// The worker holding it.
    pub claimed_by: Option<String>,
    /// Attempts charged (this one included).
    pub attempts: i32,
    /// The claim's fencing token.
    pub claim_version: i64,
    /// Seconds until the lease runs out (negative: expired, waiting for recovery).
    pub lease_remaining_seconds: Option<f64>,
}

/// The claims held now, soonest expiry first (at most `limit`).
pub async fn claims(pool: &PgPool, table: &str, limit: i64) -> Result<Vec<ClaimRow>> {
    let rows = sqlx::query(statement(sql::CLAIMS, table))
        .bind(limit)
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|row| {
            Ok(ClaimRow {
                event_id: row.try_get("event_id")?,
                event_type: row.try_get("event_type")?,
                event_version: row.try_get("event_version")?,
                claimed_by: row.try_get("claimed_by")?,
                attempts: row.try_get("attempts")?,
                claim_version: row.try_get("claim_version")?,
                lease_remaining_seconds: row.try_get("lease_remaining_seconds")?,
            })
        })
        .collect()
}

/// A contract the registry holds or this binary compiles.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContractRow {
    /// Event name.
    pub event_type: String,
    /// Event version.
    pub event_version: i64,
    /// The registered fingerprint (`None`: compiled here, not registered).
    pub registered_fingerprint: Option<String>,
    /// The fingerprint this binary compiles (`None`: not compiled here).
    pub compiled_fingerprint: Option<String>,
    /// `ok` (registered and compiled alike), `mismatch` (both, with different shapes),
    /// `not_compiled` (registered, this binary cannot decode it) or `unregistered`.
    pub state: &'static str,
}

/// The contract registry beside the contracts this binary compiles.
pub async fn contracts(pool: &PgPool, compiled: &[CompiledEvent]) -> Result<Vec<ContractRow>> {
    let rows = registry_rows(pool).await?;
    let contracts: Vec<_> = compiled.iter().map(|e| e.contract.clone()).collect();
    let comparison = compare_registry(&contracts, &rows);
    let mut out: Vec<ContractRow> = rows
        .iter()
        .map(|row| {
            let compiled = contracts.iter().find(|c| {
                c.name == row.event_type && i64::from(c.version) == i64::from(row.event_version)
            });
            let compiled_fingerprint = compiled.map(crate::contract::Contract::fingerprint);
            let state = match &compiled_fingerprint {
                None => "not_compiled",
                Some(f) if *f == row.fingerprint => "ok",
                Some(_) => "mismatch",
            };
            ContractRow {
                event_type: row.event_type.clone(),
                event_version: i64::from(row.event_version),
                registered_fingerprint: Some(row.fingerprint.clone()),
                compiled_fingerprint,
                state,
            }
        })
        .collect();
    for (name, version) in &comparison.unregistered {
        let fingerprint = contracts
            .iter()
            .find(|c| c.name == name.as_str() && c.version == *version)
            .map(crate::contract::Contract::fingerprint);
        out.push(ContractRow {
            event_type: name.clone(),
            event_version: i64::from(*version),
            registered_fingerprint: None,
            compiled_fingerprint: fingerprint,
            state: "unregistered",
        });
    }
    out.sort_by(|a, b| (&a.event_type, a.event_version).cmp(&(&b.event_type, b.event_version)));
    Ok(out)
}

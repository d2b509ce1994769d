//! Deliver what is ready, now, in the calling task: no worker, no background task, no timer.
//!
//! [`drain()`] claims ready events with the store's own claim statement, hands each to the sink
//! through the worker's own call (panics caught the same way), and writes the outcome with the
//! store's fenced complete and fail statements, until nothing is ready. Retries are due at once
//! by default, so an event that fails twice and then succeeds is delivered three times within one
//! `drain`. The order is deterministic: claim order (`available_at`, then id), each batch in id
//! order, unless a [`Faults`](crate::testing::Faults) plan reorders it.
//!
//! Every delivery is listed in the [`DrainReport`] with its attempt, the faults injected into it
//! and its outcome.

use std::fmt;
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::faults::{DeliveryPlan, Faulty, Injected};
use crate::delivery::{Aggregate, Delivery, HandlerError};
use crate::error::{Error, Result};
use crate::sink::Sink;
use crate::store::{
    ClaimedEvent, DEFAULT_TABLE, FailOutcome, Ownership, RecoveryBackoff, RecoveryCounts, Store,
};
use crate::worker::RetryPolicy;
use crate::worker::executor::{SinkOutcome, call_sink, panic_failure, retry_plan};

/// How many expired leases one recovery pass returns (a test table holds far fewer).
const RECOVERY_BATCH: i64 = 10_000;

/// The worker name the drain claims under (kept in `claimed_by`, shown in `last_error`).
pub const DRAIN_WORKER: &str = "outbox-testing-drain";

/// What [`drain()`] and [`deliver_one`] deliver to: any [`Sink`] (a [`crate::Dispatcher`], a
/// publisher, a fan-out, an `Arc<dyn Sink>`), or a [`Faulty`] sink whose plan the drain
/// applies.
pub trait DrainTarget {
    /// The sink events are handed to.
    fn target_sink(&self) -> &dyn Sink;
    /// The fault plan, if any.
    fn target_faults(&self) -> Option<&Faulty> {
        None
    }
}

impl<S: Sink> DrainTarget for S {
    fn target_sink(&self) -> &dyn Sink {
        self
    }
}

impl DrainTarget for Faulty {
    fn target_sink(&self) -> &dyn Sink {
        self.sink()
    }

    fn target_faults(&self) -> Option<&Faulty> {
        Some(self)
    }
}

/// Options of a drain. [`drain()`] and [`deliver_one`] use the defaults.
#[derive(Debug, Clone)]
pub struct Drain {
    table: String,
    include_delayed: bool,
    stop_after: usize,
    ordered: bool,
    batch: i64,
    lease: Duration,
    retry: RetryPolicy,
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            table: DEFAULT_TABLE.to_owned(),
            include_delayed: false,
            stop_after: 10_000,
            ordered: false,
            batch: 10,
            lease: Duration::from_secs(300),
            retry: RetryPolicy {
                base: Duration::ZERO,
                max: Duration::ZERO,
                jitter: false,
            },
        }
    }
}

impl Drain {
    /// The defaults: table `outbox`, ready events only, unordered claims of 10, a lease of
    /// 5 minutes, retries due at once, and a stop after 10,000 deliveries (a sink that never
    /// settles shows up in the report instead of hanging the test).
    pub fn new() -> Drain {
        Drain::default()
    }

    /// Drain this outbox table instead of `outbox`.
    pub fn table(mut self, table: &str) -> Drain {
        table.clone_into(&mut self.table);
        self
    }

    /// Also deliver events scheduled for later (an enqueue delay, a handler's `retry_after`, a
    /// retry policy's backoff): each round makes them due first.
    pub fn include_delayed(mut self) -> Drain {
        self.include_delayed = true;
        self
    }

    /// Stop after `deliveries` deliveries (the report says when it stopped for this).
    pub fn stop_after(mut self, deliveries: usize) -> Drain {
        self.stop_after = deliveries;
        self
    }

    /// Claim as an ordered worker does: an event waits for the earlier events of its aggregate.
    pub fn ordered(mut self, ordered: bool) -> Drain {
        self.ordered = ordered;
        self
    }

    /// Claim at most `events` per round (at least 1; default 10).
    pub fn batch(mut self, events: i64) -> Drain {
        self.batch = events.max(1);
        self
    }

    /// The lease of each claim (default 5 minutes; renewed before each delivery).
    pub fn lease(mut self, lease: Duration) -> Drain {
        self.lease = lease;
        self
    }

    /// The backoff of retried events (default: due at once). With a real backoff, retried events
    /// wait, and only [`Drain::include_delayed`] delivers them in the same drain.
    pub fn retry(mut self, retry: RetryPolicy) -> Drain {
        self.retry = retry;
        self
    }

    /// Deliver until nothing is ready (or [`Drain::stop_after`]).
    ///
    /// Fails on a zero lease (every claim would expire before its delivery), a table name that
    /// is not a valid identifier, or a database error.
    pub async fn run(&self, pool: &PgPool, target: &impl DrainTarget) -> Result<DrainReport> {
        if self.lease.is_zero() {
            return Err(Error::Config(
                "Drain::lease must be longer than zero: a claim with no lease expires before it is delivered; the default is 5 minutes".into(),
            ));
        }
        let store = Store::for_table(pool.clone(), &self.table)?;
        let faults = target.target_faults();
        let mut report = DrainReport {
            records: Vec::new(),
            seed: faults.map(|f| f.plan().seed()),
            stopped_at_limit: false,
        };
        loop {
            let remaining = self.stop_after.saturating_sub(report.records.len());
            if remaining == 0 {
                report.stopped_at_limit = true;
                break;
            }
            let claimed = self.claim(&store, faults, remaining).await?;
            if claimed.is_empty() {
                break;
            }
            for item in claimed {
                let record = match item {
                    Claimed::Event(event, reordered) => {
                        self.deliver(&store, target, event, reordered).await?
                    }
                    Claimed::Undecodable(record) => record,
                };
                report.records.push(record);
            }
        }
        Ok(report)
    }

    /// Deliver the next ready event, if there is one.
    pub async fn run_one(
        &self,
        pool: &PgPool,
        target: &impl DrainTarget,
    ) -> Result<Option<DeliveryRecord>> {
        let report = self.clone().stop_after(1).run(pool, target).await?;
        Ok(report.records.into_iter().next())
    }

    /// One round's claim, in delivery order. Like a worker's maintenance, expired leases are
    /// recovered first.
    async fn claim(
        &self,
        store: &Store,
        faults: Option<&Faulty>,
        remaining: usize,
    ) -> Result<Vec<Claimed>> {
        if self.include_delayed {
            store.make_delayed_due().await?;
        }
        store
            .recover_expired(RECOVERY_BATCH, RecoveryBackoff::NONE)
            .await?;
        let limit = self.batch.min(i64::try_from(remaining).unwrap_or(i64::MAX));
        let batch = store
            .claim_batch_outcome(DRAIN_WORKER, limit, self.lease, self.ordered)
            .await?;
        let mut claimed: Vec<Claimed> = batch
            .undecodable
            .into_iter()
            .map(|u| {
                Claimed::Undecodable(DeliveryRecord {
                    event_id: u.event_id,
                    event_type: u.event_type,
                    stored_version: 0,
                    aggregate: None,
                    attempt: 0,
                    injected: Vec::new(),
                    outcome: Outcome::Undecodable { reason: u.reason },
                })
            })
            .collect();
        // `claim_batch_outcome` returns id order; a plan may reorder it.
        let ordered = match faults {
            Some(f) => f.order(batch.events),
            None => batch.events.into_iter().map(|e| (e, None)).collect(),
        };
        claimed.extend(ordered.into_iter().map(|(e, r)| Claimed::Event(e, r)));
        Ok(claimed)
    }

    /// Deliver one claimed event with the faults its plan decides, and write its outcome.
    async fn deliver(
        &self,
        store: &Store,
        target: &impl DrainTarget,
        event: ClaimedEvent,
        reordered: Option<Injected>,
    ) -> Result<DeliveryRecord> {
        // Renewed first, as the renewer keeps a claim alive while it waits in a batch: a slow
        // earlier delivery must not expire the later claims of the batch.
        if store.renew_if_owned(event.claim(), self.lease).await? == Ownership::Lost {
            return Ok(record(&event, Vec::new(), Outcome::ExpiredBeforeDelivery));
        }
        let faults = target.target_faults();
        let plan = faults.map(|f| f.plan_delivery(&event)).unwrap_or_default();
        let mut injected: Vec<Injected> = reordered.into_iter().collect();
        let outcome =
            deliver_with_plan(store, target.target_sink(), &event, &plan, &mut injected).await?;
        let (twice, response_lost) = (
            injected.contains(&Injected::DeliveredTwice),
            injected.contains(&Injected::ResponseLost),
        );
        if let Some(f) = faults {
            f.applied(event.event_id, twice, response_lost);
        }
        let outcome = match outcome {
            Settle::Write(sink_outcome) => {
                settle(store, &event, &sink_outcome, &self.retry).await?
            }
            Settle::Done(outcome) => outcome,
        };
        Ok(record(&event, injected, outcome))
    }
}

enum Claimed {
    Event(ClaimedEvent, Option<Injected>),
    Undecodable(DeliveryRecord),
}

/// How a delivery's outcome is to be written.
enum Settle {
    /// Write this sink outcome with the fenced statements.
    Write(SinkOutcome),
    /// Already settled (a lost response was recovered).
    Done(Outcome),
}

/// Run one delivery under `plan`: the sink-side faults around the call, the lease lost in its
/// middle, the second call, the lost response. Returns how the outcome is to be written.
async fn deliver_with_plan(
    store: &Store,
    sink: &dyn Sink,
    event: &ClaimedEvent,
    plan: &DeliveryPlan,
    injected: &mut Vec<Injected>,
) -> Result<Settle> {
    if let Some(by) = plan.delay {
        injected.push(Injected::Delay(by));
        // An injected fault, not a wait for a condition: the call is held back on purpose.
        tokio::time::sleep(by).await;
    }
    let token = CancellationToken::new();
    let delivery = Delivery::new(event, token.clone());
    if plan.panic {
        injected.push(Injected::Panic);
        return Ok(Settle::Write(
            call_sink(&InjectedPanic, event, &delivery).await,
        ));
    }
    if let Some(failure) = &plan.fail {
        injected.push(failure.clone());
        let error = match failure {
            Injected::Failure {
                failure: super::faults::Failure::Permanent,
                number,
                of,
            } => HandlerError::permanent(format!("injected permanent failure {number} of {of}")),
            Injected::Failure { number, of, .. } => {
                HandlerError::retry(format!("injected failure {number} of {of}"))
            }
            _ => HandlerError::retry("injected failure"),
        };
        return Ok(Settle::Write(SinkOutcome::Failed(error)));
    }
    let (outcome, _lost) = call(
        store,
        sink,
        event,
        &delivery,
        plan.lose_lease.then_some(&token),
    )
    .await?;
    if plan.lose_lease {
        injected.push(Injected::LeaseLost);
    }
    let outcome = match outcome {
        SinkOutcome::Delivered if plan.deliver_twice => {
            injected.push(Injected::DeliveredTwice);
            call_sink(sink, event, &delivery).await
        }
        other => other,
    };
    if plan.lose_response && matches!(outcome, SinkOutcome::Delivered) {
        injected.push(Injected::ResponseLost);
        let recovered = end_lease(store, event).await?;
        return Ok(Settle::Done(Outcome::ResponseLost {
            requeued: recovered.requeued > 0,
        }));
    }
    Ok(Settle::Write(outcome))
}

/// Stands in for the sink on a delivery the plan makes panic.
struct InjectedPanic;

impl Sink for InjectedPanic {
    fn deliver<'a>(
        &'a self,
        _event: &'a ClaimedEvent,
        _delivery: &'a Delivery,
    ) -> BoxFuture<'a, std::result::Result<(), HandlerError>> {
        Box::pin(async { panic!("injected panic (outbox_runtime::testing::Faults)") })
    }
}

/// Call the sink once. With `lose_lease`, the lease is lost in the middle of the call: once the
/// sink has started (its first poll), the lease is ended and recovered, then the token is
/// cancelled, while the sink keeps running.
pub(crate) async fn call(
    store: &Store,
    sink: &dyn Sink,
    event: &ClaimedEvent,
    delivery: &Delivery,
    lose_lease: Option<&CancellationToken>,
) -> Result<(SinkOutcome, Option<RecoveryCounts>)> {
    let Some(token) = lose_lease else {
        return Ok((call_sink(sink, event, delivery).await, None));
    };
    let lose = async {
        // Lets the sink's call run up to its first await before the lease goes.
        tokio::task::yield_now().await;
        let recovered = end_lease(store, event).await;
        token.cancel();
        recovered
    };
    let (outcome, recovered) = tokio::join!(call_sink(sink, event, delivery), lose);
    Ok((outcome, Some(recovered?)))
}

/// End the claim's lease now and run the maintenance's recovery statement, as if the lease had
/// run out: the fenced renewal with a lease of zero, then `recover_expired` (no backoff), which
/// returns the row to pending (or exhausts it when its attempts are used up) and counts a
/// lease expiry.
pub(crate) async fn end_lease(store: &Store, event: &ClaimedEvent) -> Result<RecoveryCounts> {
    store.renew_if_owned(event.claim(), Duration::ZERO).await?;
    store
        .recover_expired(RECOVERY_BATCH, RecoveryBackoff::NONE)
        .await
}

/// Write a sink's outcome with the store's fenced statements, as the worker does.
pub(crate) async fn settle(
    store: &Store,
    event: &ClaimedEvent,
    outcome: &SinkOutcome,
    retry: &RetryPolicy,
) -> Result<Outcome> {
    let claim = event.claim();
    let error = match outcome {
        SinkOutcome::Delivered => {
            return Ok(match store.complete_if_owned(claim).await? {
                Ownership::Owned => Outcome::Completed,
                Ownership::Lost => Outcome::ClaimLost {
                    sink_result: Ok(()),
                },
            });
        }
        SinkOutcome::Failed(error) => error.clone(),
        SinkOutcome::Panicked(message) => panic_failure(message),
    };
    let (after, permanent) = retry_plan(&error, retry, event.attempts);
    let reason = error.stored_reason();
    Ok(
        match store
            .fail_if_owned(claim, &reason, after, permanent)
            .await?
        {
            FailOutcome::Rescheduled => Outcome::Retrying {
                error: reason,
                after,
            },
            FailOutcome::Exhausted => Outcome::Exhausted { error: reason },
            FailOutcome::Lost => Outcome::ClaimLost {
                sink_result: Err(reason),
            },
        },
    )
}

fn record(event: &ClaimedEvent, injected: Vec<Injected>, outcome: Outcome) -> DeliveryRecord {
    DeliveryRecord {
        event_id: event.event_id,
        event_type: event.event_type.clone(),
        stored_version: event.event_version,
        aggregate: match (&event.aggregate_type, &event.aggregate_id) {
            (Some(t), Some(id)) => Some(Aggregate {
                aggregate_type: t.clone(),
                id: id.clone(),
                version: event.aggregate_version,
            }),
            _ => None,
        },
        attempt: event.attempts,
        injected,
        outcome,
    }
}

/// [`Drain::run`] with the defaults: deliver every ready event of table `outbox` to `target`
/// until nothing is ready.
pub async fn drain(pool: &PgPool, target: &impl DrainTarget) -> Result<DrainReport> {
    Drain::new().run(pool, target).await
}

/// [`Drain::run_one`] with the defaults: deliver the next ready event of table `outbox`, if any.
pub async fn deliver_one(
    pool: &PgPool,
    target: &impl DrainTarget,
) -> Result<Option<DeliveryRecord>> {
    Drain::new().run_one(pool, target).await
}

/// How one delivery ended, as written to the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The sink accepted it and the completion was written: delivered.
    Completed,
    /// The sink failed it (or an injected failure did); back to pending after `after`.
    Retrying {
        /// The reason stored in `last_error`.
        error: String,
        /// When it is due again.
        after: Duration,
    },
    /// Failed for good (a permanent failure, a panic, or its last attempt): exhausted.
    Exhausted {
        /// The reason stored in `last_error`.
        error: String,
    },
    /// The lease was lost during the delivery; the fence refused to record what the sink
    /// returned (`Ok`, or the failure's reason), and the event is delivered again.
    ClaimLost {
        /// What the sink returned.
        sink_result: std::result::Result<(), String>,
    },
    /// The sink accepted it but its completion was never written; recovery returned it to
    /// pending (`requeued`), or exhausted it when its attempts were used up.
    ResponseLost {
        /// Whether it went back to pending.
        requeued: bool,
    },
    /// The claimed row cannot be decoded; the claim exhausted it without a delivery.
    Undecodable {
        /// Why, as stored.
        reason: String,
    },
    /// The claim's lease had run out before its turn in the batch; it was not delivered, and
    /// recovery hands it back on the next round.
    ExpiredBeforeDelivery,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Completed => write!(f, "completed"),
            Outcome::Retrying { error, after } => {
                write!(f, "retrying after {after:?}: {error}")
            }
            Outcome::Exhausted { error } => write!(f, "exhausted: {error}"),
            Outcome::ClaimLost { sink_result } => match sink_result {
                Ok(()) => write!(
                    f,
                    "sink accepted, completion refused by the fence (lease lost)"
                ),
                Err(e) => write!(
                    f,
                    "sink failed ({e}), failure refused by the fence (lease lost)"
                ),
            },
            Outcome::ResponseLost { requeued: true } => write!(
                f,
                "sink accepted, completion not written; lease recovered, pending again"
            ),
            Outcome::ResponseLost { requeued: false } => write!(
                f,
                "sink accepted, completion not written; lease recovered, exhausted (no attempts left)"
            ),
            Outcome::Undecodable { reason } => write!(f, "undecodable, exhausted: {reason}"),
            Outcome::ExpiredBeforeDelivery => {
                write!(f, "lease expired before its turn; not delivered")
            }
        }
    }
}

/// One delivery made by a drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRecord {
    /// Stable event id.
    pub event_id: Uuid,
    /// Event name.
    pub event_type: String,
    /// The version the payload was stored with.
    pub stored_version: i32,
    /// The aggregate, if the event has one.
    pub aggregate: Option<Aggregate>,
    /// The attempt this delivery was (1-based, charged at the claim).
    pub attempt: i32,
    /// The faults injected into it, in the order they happened.
    pub injected: Vec<Injected>,
    /// How it ended.
    pub outcome: Outcome,
}

impl fmt::Display for DeliveryRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` v{} {} attempt {}",
            self.event_type, self.stored_version, self.event_id, self.attempt
        )?;
        if let Some(a) = &self.aggregate {
            write!(f, " ({} {})", a.aggregate_type, a.id)?;
        }
        if !self.injected.is_empty() {
            let injected: Vec<String> = self.injected.iter().map(ToString::to_string).collect();
            write!(f, " [{}]", injected.join(", "))?;
        }
        write!(f, ": {}", self.outcome)
    }
}

/// Everything a drain delivered, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainReport {
    /// Each delivery, in the order it was made.
    pub records: Vec<DeliveryRecord>,
    /// The fault plan's seed, when there was a plan (replay with `Faults::seeded(seed)`).
    pub seed: Option<u64>,
    /// Whether the drain stopped at its delivery limit rather than because nothing was ready.
    pub stopped_at_limit: bool,
}

impl DrainReport {
    /// How many deliveries were completed.
    pub fn completed(&self) -> usize {
        self.records
            .iter()
            .filter(|r| r.outcome == Outcome::Completed)
            .count()
    }

    /// The deliveries of one event, in order.
    pub fn of(&self, event_id: Uuid) -> Vec<&DeliveryRecord> {
        self.records
            .iter()
            .filter(|r| r.event_id == event_id)
            .collect()
    }

    /// The ids of the events in the order they were completed.
    pub fn completed_order(&self) -> Vec<Uuid> {
        self.records
            .iter()
            .filter(|r| r.outcome == Outcome::Completed)
            .map(|r| r.event_id)
            .collect()
    }
}

impl fmt::Display for DrainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "drain: {} deliveries, {} completed",
            self.records.len(),
            self.completed()
        )?;
        if let Some(seed) = self.seed {
            write!(f, "; faults seeded {seed} (replay: Faults::seeded({seed}))")?;
        }
        if self.stopped_at_limit {
            write!(f, "; stopped at its delivery limit")?;
        }
        for (i, record) in self.records.iter().enumerate() {
            write!(f, "\n  {:>3}. {record}", i + 1)?;
        }
        Ok(())
    }
}

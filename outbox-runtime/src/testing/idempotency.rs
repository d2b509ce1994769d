//! Does a handler survive at-least-once delivery? [`check_idempotent`] enqueues each event,
//! delivers it once cleanly, then delivers it again the ways production does, and compares the
//! service's observed state after every delivery with the state after the first.
//!
//! Each event goes through three claims and four calls of the sink, with the store's own
//! statements throughout:
//!
//! 1. attempt 1, a clean delivery; the state observed after it is the baseline. Its response is
//!    then lost: no completion is written, the lease is ended, and the recovery statement hands
//!    the event back;
//! 2. attempt 2, the redelivery after the lost response, with its lease lost in the middle
//!    (ended and recovered while the sink runs, `Delivery::lease_lost` cancelled); the fence
//!    refuses whatever the sink returns;
//! 3. attempt 3, the redelivery after the lost lease, accepted;
//! 4. the same delivery handed to the sink a second time (a duplicate), accepted and completed.
//!
//! After each of the calls 2 to 4 the state must equal the baseline. The first event whose
//! redelivery changed it fails the check, naming the event, the fault, and both states.

use std::fmt;

use futures::future::BoxFuture;
use sqlx::{PgPool, Postgres, Transaction};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::drain::{call, end_lease, settle};
use crate::contract::shown;
use crate::delivery::Delivery;
use crate::event::CurrentEvent;
use crate::sink::Sink;
use crate::store::{ClaimedEvent, Ownership, Store};
use crate::worker::RetryPolicy;
use crate::worker::executor::{SinkOutcome, call_sink};

/// The most ready events one claim of the check takes (its own, plus any the sink enqueued,
/// which are handed back at once).
const CLAIM_LIMIT: i64 = 1_000;

/// The lease of the check's claims; they are ended on purpose long before.
const LEASE: std::time::Duration = std::time::Duration::from_secs(300);

/// The worker name the check claims under.
const CHECK_WORKER: &str = "outbox-testing-idempotency";

/// One event for [`check_idempotent`]: a payload and its operation key, enqueued through the
/// event's own typed enqueue when its turn comes.
pub struct TestEvent {
    table: &'static str,
    name: &'static str,
    version: u32,
    operation_key: String,
    write: Box<dyn WriteEvent>,
}

impl fmt::Debug for TestEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestEvent")
            .field("table", &self.table)
            .field("name", &self.name)
            .field("version", &self.version)
            .field("operation_key", &self.operation_key)
            .finish_non_exhaustive()
    }
}

impl TestEvent {
    /// `event` (a current version), to be enqueued under `operation_key`.
    pub fn new<E: CurrentEvent>(event: E, operation_key: impl Into<String>) -> TestEvent {
        TestEvent {
            table: E::TABLE,
            name: E::NAME,
            version: E::VERSION,
            operation_key: operation_key.into(),
            write: Box::new(event),
        }
    }
}

/// A typed enqueue with the event type erased.
trait WriteEvent: Send + Sync {
    fn write<'a, 't>(
        &'a self,
        tx: &'a mut Transaction<'t, Postgres>,
        operation_key: &'a str,
    ) -> BoxFuture<'a, crate::error::Result<Uuid>>;
}

impl<E: CurrentEvent> WriteEvent for E {
    fn write<'a, 't>(
        &'a self,
        tx: &'a mut Transaction<'t, Postgres>,
        operation_key: &'a str,
    ) -> BoxFuture<'a, crate::error::Result<Uuid>> {
        Box::pin(self.enqueue(tx, operation_key))
    }
}

/// What a passed check did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdempotencyReport {
    /// Events checked.
    pub events: usize,
    /// Calls of the sink (four an event).
    pub sink_calls: usize,
    /// Observations of the state compared with their baseline (three an event).
    pub comparisons: usize,
}

impl fmt::Display for IdempotencyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "idempotent: {} events, {} sink calls, {} redeliveries left the observed state unchanged",
            self.events, self.sink_calls, self.comparisons
        )
    }
}

/// Why a check failed.
///
/// `Debug` shows the same text as `Display`, so `check_idempotent(..).await.unwrap()` fails a
/// test with the readable message.
pub enum IdempotencyError {
    /// A redelivery changed the observed state.
    NotIdempotent {
        /// Which event (1-based) of how many.
        index: usize,
        /// How many events the check was given.
        of: usize,
        /// The event: name, version, id, key.
        event: String,
        /// The redelivery that changed the state.
        fault: String,
        /// The state after the first delivery (`{:?}`).
        baseline: String,
        /// The state after the redelivery (`{:?}`).
        observed: String,
    },
    /// The sink refused a delivery that has to succeed for the check to go on: the first one,
    /// or a redelivery after the lease loss (a receiver that already applied an event must
    /// accept it again, not fail it).
    DeliveryFailed {
        /// The event.
        event: String,
        /// Which delivery.
        delivery: String,
        /// What the sink returned.
        error: String,
    },
    /// The check could not be run as asked (the outbox held other open events, an event could
    /// not be enqueued, the database failed).
    Setup(String),
}

impl fmt::Display for IdempotencyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdempotencyError::NotIdempotent {
                index,
                of,
                event,
                fault,
                baseline,
                observed,
            } => write!(
                f,
                "not idempotent: event {index} of {of} changed the observed state when it was delivered again\n\
                 \x20 event:    {event}\n\
                 \x20 delivery: {fault}\n\
                 \x20 after the first delivery: {baseline}\n\
                 \x20 after this delivery:      {observed}\n\
                 A handler must leave the state as one delivery does, however often the event arrives: \
                 deduplicate on `Delivery::idempotency_key()` (for example with `outbox_runtime::inbox::apply_once` \
                 in the handler's transaction)."
            ),
            IdempotencyError::DeliveryFailed {
                event,
                delivery,
                error,
            } => write!(
                f,
                "the sink refused {delivery} of {event}: {error}\n\
                 The check needs this delivery accepted: a receiver that already applied an event must accept it \
                 again (answer success, or the publisher's `delivered_statuses` such as 409), not fail it."
            ),
            IdempotencyError::Setup(why) => write!(f, "check_idempotent could not run: {why}"),
        }
    }
}

impl fmt::Debug for IdempotencyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for IdempotencyError {}

impl From<crate::error::Error> for IdempotencyError {
    fn from(e: crate::error::Error) -> Self {
        IdempotencyError::Setup(format!("database: {e}"))
    }
}

/// Check that redelivering each of `events` to `sink` leaves the state `observe` reports as one
/// delivery leaves it (see the module documentation for the deliveries made).
///
/// The events are enqueued one at a time, in order, each through its type's own enqueue in a
/// transaction of its own, and checked before the next is enqueued. `observe` is the service's
/// view of its business state (for example the rows a handler writes); it is called after
/// every call of the sink. The outbox tables of the events must hold no pending or processing
/// events when the check starts; events the sink enqueues are left pending.
///
/// # Errors
///
/// [`IdempotencyError::NotIdempotent`] for the first event whose redelivery changed the
/// observed state; [`IdempotencyError::DeliveryFailed`] when the sink refused a delivery it
/// must accept; [`IdempotencyError::Setup`] when the check could not run.
pub async fn check_idempotent<T, Observe>(
    pool: &PgPool,
    sink: &impl Sink,
    events: impl IntoIterator<Item = TestEvent>,
    mut observe: Observe,
) -> Result<IdempotencyReport, IdempotencyError>
where
    T: PartialEq + fmt::Debug,
    Observe: AsyncFnMut() -> T,
{
    let events: Vec<TestEvent> = events.into_iter().collect();
    let mut report = IdempotencyReport {
        events: 0,
        sink_calls: 0,
        comparisons: 0,
    };
    let of = events.len();
    for (i, test_event) in events.iter().enumerate() {
        let store = Store::for_table(pool.clone(), test_event.table)?;
        let gauges = store.gauges().await?;
        if gauges.pending + gauges.processing > 0 {
            return Err(IdempotencyError::Setup(format!(
                "outbox table `{}` holds {} pending and {} processing events before event {} of {of}; \
                 the check delivers only its own events: drain the table first (`testing::drain`)",
                test_event.table,
                gauges.pending,
                gauges.processing,
                i + 1
            )));
        }
        let mut tx = pool.begin().await.map_err(crate::error::Error::from)?;
        let event_id = test_event
            .write
            .write(&mut tx, &test_event.operation_key)
            .await
            .map_err(|e| {
                IdempotencyError::Setup(format!(
                    "enqueueing event {} of {of} (`{}`, key `{}`): {e}",
                    i + 1,
                    test_event.name,
                    shown(&test_event.operation_key)
                ))
            })?;
        tx.commit().await.map_err(crate::error::Error::from)?;
        let described = format!(
            "`{}` v{} {event_id} (key `{}`)",
            test_event.name,
            test_event.version,
            shown(&test_event.operation_key)
        );
        let mut check = Check {
            store: &store,
            sink,
            event_id,
            described: &described,
            index: i + 1,
            of,
        };
        check.run(&mut observe, &mut report).await?;
        report.events += 1;
    }
    Ok(report)
}

/// The deliveries of one event.
struct Check<'a, S> {
    store: &'a Store,
    sink: &'a S,
    event_id: Uuid,
    described: &'a str,
    index: usize,
    of: usize,
}

impl<S: Sink> Check<'_, S> {
    async fn run<T, Observe>(
        &mut self,
        observe: &mut Observe,
        report: &mut IdempotencyReport,
    ) -> Result<(), IdempotencyError>
    where
        T: PartialEq + fmt::Debug,
        Observe: AsyncFnMut() -> T,
    {
        // 1. A clean delivery: the baseline. Then its response is lost.
        let event = self.claim().await?;
        let delivery = Delivery::new(&event, CancellationToken::new());
        let first = call_sink(self.sink, &event, &delivery).await;
        report.sink_calls += 1;
        self.accepted(&first, "attempt 1 (the first delivery)")?;
        let baseline = observe().await;
        end_lease(self.store, &event).await?;

        // 2. Redelivered after the lost response, and its lease lost in the middle.
        let event = self.claim().await?;
        let token = CancellationToken::new();
        let delivery = Delivery::new(&event, token.clone());
        let (outcome, _) = call(self.store, self.sink, &event, &delivery, Some(&token)).await?;
        report.sink_calls += 1;
        if let SinkOutcome::Panicked(message) = &outcome {
            return Err(self.refused(
                "attempt 2 (delivered again after the response to attempt 1 was lost)",
                format!("panicked: {message}"),
            ));
        }
        self.compare(
            &baseline,
            observe().await,
            format!(
                "attempt {}, delivered again after the response to attempt {} was lost \
                 (the sink had accepted it; no completion was written; the lease ran out and recovery handed the event back), \
                 and its own lease was lost while the sink ran",
                event.attempts,
                event.attempts - 1
            ),
        )?;
        report.comparisons += 1;
        // Whatever the sink said, the fence refuses it: the lease is gone.
        settle(self.store, &event, &outcome, &RetryPolicy::default()).await?;

        // 3. Redelivered after the lost lease.
        let event = self.claim().await?;
        let delivery = Delivery::new(&event, CancellationToken::new());
        let third = call_sink(self.sink, &event, &delivery).await;
        report.sink_calls += 1;
        let label = format!(
            "attempt {}, delivered again after the lease of attempt {} was lost",
            event.attempts,
            event.attempts - 1
        );
        self.accepted(&third, &label)?;
        self.compare(&baseline, observe().await, label)?;
        report.comparisons += 1;

        // 4. The same delivery once more (a duplicate), then completed.
        let fourth = call_sink(self.sink, &event, &delivery).await;
        report.sink_calls += 1;
        let label = format!(
            "attempt {}, handed to the sink a second time (a duplicate of the same delivery)",
            event.attempts
        );
        self.accepted(&fourth, &label)?;
        self.compare(&baseline, observe().await, label)?;
        report.comparisons += 1;
        if self.store.complete_if_owned(event.claim()).await? != Ownership::Owned {
            return Err(IdempotencyError::Setup(format!(
                "the completion of {} was refused: its claim was lost during the check (was another worker running on this database?)",
                self.described
            )));
        }
        Ok(())
    }

    /// Claim this check's event; any other ready event (one the sink enqueued) is handed back
    /// without charging its attempt.
    async fn claim(&self) -> Result<ClaimedEvent, IdempotencyError> {
        let claimed = self
            .store
            .claim_batch(CHECK_WORKER, CLAIM_LIMIT, LEASE, false)
            .await?;
        let mut ours = None;
        for event in claimed {
            if event.event_id == self.event_id {
                ours = Some(event);
            } else {
                self.store.release_if_owned(event.claim()).await?;
            }
        }
        ours.ok_or_else(|| {
            IdempotencyError::Setup(format!(
                "{} was not claimable (exhausted, or claimed by another worker running on this database?)",
                self.described
            ))
        })
    }

    fn accepted(&self, outcome: &SinkOutcome, delivery: &str) -> Result<(), IdempotencyError> {
        match outcome {
            SinkOutcome::Delivered => Ok(()),
            SinkOutcome::Failed(e) => Err(self.refused(delivery, e.stored_reason())),
            SinkOutcome::Panicked(message) => {
                Err(self.refused(delivery, format!("panicked: {message}")))
            }
        }
    }

    fn refused(&self, delivery: &str, error: String) -> IdempotencyError {
        IdempotencyError::DeliveryFailed {
            event: format!("event {} of {}, {}", self.index, self.of, self.described),
            delivery: delivery.to_owned(),
            error,
        }
    }

    fn compare<T: PartialEq + fmt::Debug>(
        &self,
        baseline: &T,
        observed: T,
        fault: String,
    ) -> Result<(), IdempotencyError> {
        if *baseline == observed {
            return Ok(());
        }
        Err(IdempotencyError::NotIdempotent {
            index: self.index,
            of: self.of,
            event: self.described.to_owned(),
            fault,
            baseline: format!("{baseline:?}"),
            observed: format!("{observed:?}"),
        })
    }
}

//! Wake-ups sent after commit, for services that enqueue at high rates.
//!
//! By default [`Event::enqueue`](crate::Event::enqueue) queues a `NOTIFY` inside the business
//! transaction, which is simple and always right, but has a cost: PostgreSQL makes a committing
//! transaction that notifies hold a database-wide lock until its commit is flushed, so notifying
//! transactions commit one at a time (about a fifth fewer business transactions per second with
//! 4 clients, measured with pgbench; see the README's benchmark section).
//!
//! A [`Waker`] moves the notification out of the business transaction. The service enqueues
//! with [`EnqueueOptions::without_notify`](crate::store::EnqueueOptions::without_notify),
//! commits, and then calls [`Waker::wake`], which only sets a flag. A background task sends one
//! notification at a time on a session of its own (opened at the first wake-up with the
//! service pool's settings, named `outbox-waker <table>` in `pg_stat_activity`, and kept), so a
//! wake-up never waits for a connection of the service's pool, and is one round trip; every
//! `wake` that arrives while one is being sent is folded into the next. While the runtime runs,
//! no wake-up is lost: a `wake` called after a commit is followed by a notification sent after
//! that call, so after the commit is visible. A transaction that
//! commits and never calls `wake` is still delivered, by the workers' polling. Once the pool is
//! closed (the service is shutting down) the wake-ups asked for are dropped quietly and counted
//! ([`Waker::notifications_dropped`]).
//!
//! The notification is sent by a task, so it needs the runtime to go on running after `wake`:
//! a process that exits right after its last commit (the end of `main`, a command-line tool, a
//! batch job) ends the task before it has sent anything, and the workers find that commit only
//! at their next poll. [`Waker::flush`] waits until every wake-up asked for before it has been
//! answered; [`crate::Producer::close`] does that for every table. A wake-up still unanswered
//! when the task ends is counted as abandoned.
//!
//! Every wake-up asked for and never sent is counted in the counter [`WAKE_UPS_UNSENT_TOTAL`]
//! (labels `table` and `reason`: [`REASON_FAILED`], [`REASON_POOL_CLOSED`],
//! [`REASON_ABANDONED`]), through the `metrics` facade; see `docs/observability.md`.
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_runtime::store::EnqueueOptions;
//! use outbox_runtime::waker::Waker;
//!
//! let waker = Waker::new(pool.clone(), "outbox")?; // once, at start-up; clone it freely
//! let mut tx = pool.begin().await?;
//! // ... the business change, then the events, with EnqueueOptions::without_notify() ...
//! tx.commit().await?;
//! waker.wake();
//! // ... before the process ends:
//! waker.flush(std::time::Duration::from_secs(5)).await;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{Notify, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::error::Result;
use crate::held_session::{HeldSession, derived_pool};
use crate::store::{notify_channel, sql};

/// Pause after a failed notification, so a broken connection is not hammered. The workers'
/// polling covers the events meanwhile.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// The default least time between two notifications (see [`Waker::with_min_gap`]).
pub const DEFAULT_MIN_GAP: Duration = Duration::from_millis(2);

/// Counter: wake-ups asked for with [`Waker::wake`] (or by a [`crate::Producer`]'s commit) and
/// never sent. Labels `table` and `reason` (one of [`REASON_FAILED`], [`REASON_POOL_CLOSED`],
/// [`REASON_ABANDONED`]). The events are not lost: the workers' polling delivers them, later.
/// Registered at zero for each reason when a waker starts.
pub const WAKE_UPS_UNSENT_TOTAL: &str = "outbox_wake_ups_unsent_total";
/// `reason` of [`WAKE_UPS_UNSENT_TOTAL`]: the notification statement failed.
pub const REASON_FAILED: &str = "failed";
/// `reason` of [`WAKE_UPS_UNSENT_TOTAL`]: the service's pool had been closed.
pub const REASON_POOL_CLOSED: &str = "pool_closed";
/// `reason` of [`WAKE_UPS_UNSENT_TOTAL`]: the waker's task ended (its runtime shut down, as at
/// the end of a process) before it answered the wake-up; [`crate::Producer::close`] or
/// [`Waker::flush`] before the end prevents it.
pub const REASON_ABANDONED: &str = "abandoned";

/// Sends coalesced wake-up notifications for one outbox table after commits. Cheap to clone;
/// the background task stops when the last clone is dropped (after sending a wake-up that was
/// asked for and not yet sent).
#[derive(Clone)]
pub struct Waker {
    signal: Arc<Signal>,
    _stop: Arc<DropGuard>,
}

/// What the handles and the task share.
struct Signal {
    /// Holds at most one stored wake-up: the coalescing.
    requested: Notify,
    /// `wake` calls so far; each is answered by the first round that starts after it.
    asked: AtomicU64,
    /// The value of `asked` read at the start of the last round that ended (sent, failed or
    /// dropped): every `wake` up to that count has been answered. [`Waker::flush`] waits on it.
    answered: watch::Sender<u64>,
    sent: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
    abandoned: AtomicU64,
}

impl Signal {
    fn new() -> Signal {
        Signal {
            requested: Notify::new(),
            asked: AtomicU64::new(0),
            answered: watch::Sender::new(0),
            sent: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
        }
    }
}

impl Waker {
    /// A waker for the workers of `table`, sending at most one notification per
    /// [`DEFAULT_MIN_GAP`]. Spawns its task on the current tokio runtime.
    ///
    /// Fails when `table` is not a valid outbox table name.
    pub fn new(pool: PgPool, table: &str) -> Result<Waker> {
        Waker::with_min_gap(pool, table, DEFAULT_MIN_GAP)
    }

    /// A waker that waits at least `min_gap` after each notification before it sends the next.
    /// A wake-up after a quiet spell goes out at once; under a steady stream of commits, where
    /// the workers are busy anyway, notifications are spaced out (each one takes the
    /// database-wide notification lock and flushes a commit, so sending them back to back costs
    /// the business transactions throughput). Zero sends them back to back.
    pub fn with_min_gap(pool: PgPool, table: &str, min_gap: Duration) -> Result<Waker> {
        let statement = sql::statements(table)?.wake;
        let channel = notify_channel(table);
        for reason in [REASON_FAILED, REASON_POOL_CLOSED, REASON_ABANDONED] {
            unsent(table, reason, 0);
        }
        let signal = Arc::new(Signal::new());
        let stop = CancellationToken::new();
        tokio::spawn(send_wake_ups(
            pool,
            table.to_owned(),
            statement,
            channel,
            min_gap,
            Arc::clone(&signal),
            stop.clone(),
        ));
        Ok(Waker {
            signal,
            _stop: Arc::new(stop.drop_guard()),
        })
    }

    /// Ask for a wake-up of the workers. Call it after the transaction that enqueued has
    /// committed. Never blocks and never fails; many calls in quick succession send few
    /// notifications.
    pub fn wake(&self) {
        // Counted before the permit is stored: the round the permit starts reads this count.
        self.signal.asked.fetch_add(1, Ordering::SeqCst);
        self.signal.requested.notify_one();
    }

    /// Wait until every wake-up asked for before this call has been answered: sent, or given
    /// up (failed, or dropped because the pool was closed; each counted). Returns at once when
    /// none is outstanding. Waits at most `timeout`, and returns whether everything was
    /// answered in time; what is still unanswered stays asked for, and is sent if the runtime
    /// lives on.
    ///
    /// Call it before a process ends right after a commit (see the module documentation);
    /// [`crate::Producer::close`] calls it for every table of the producer.
    pub async fn flush(&self, timeout: Duration) -> bool {
        let target = self.signal.asked.load(Ordering::SeqCst);
        let mut answered = self.signal.answered.subscribe();
        // The sender lives in `signal`, which this handle holds: `wait_for` cannot see it close.
        let waited = tokio::time::timeout(timeout, answered.wait_for(|n| *n >= target)).await;
        matches!(waited, Ok(Ok(_)))
    }

    /// Notifications sent so far.
    pub fn notifications_sent(&self) -> u64 {
        self.signal.sent.load(Ordering::Relaxed)
    }

    /// Notifications that failed (the workers' polling delivered those events later).
    pub fn notifications_failed(&self) -> u64 {
        self.signal.failed.load(Ordering::Relaxed)
    }

    /// Wake-ups not sent because the pool had been closed: the service is shutting down, and
    /// the workers' polling covers whatever it committed last. Neither a failure nor a warning.
    pub fn notifications_dropped(&self) -> u64 {
        self.signal.dropped.load(Ordering::Relaxed)
    }

    /// Wake-ups asked for and still unanswered when the task ended: its runtime shut down
    /// before it sent them (a process that exited without [`Waker::flush`] or
    /// [`crate::Producer::close`]). Read from a handle that outlived its runtime.
    pub fn notifications_abandoned(&self) -> u64 {
        self.signal.abandoned.load(Ordering::Relaxed)
    }
}

/// Add `n` to [`WAKE_UPS_UNSENT_TOTAL`] of `table` for `reason` (zero registers the series).
fn unsent(table: &str, reason: &'static str, n: u64) {
    metrics::counter!(WAKE_UPS_UNSENT_TOTAL, "table" => table.to_owned(), "reason" => reason)
        .increment(n);
}

/// Owned by the task: when the task ends, however it ends (its last handle dropped, or its
/// runtime shutting down and dropping it mid-round), a wake-up asked for and not answered is
/// counted as abandoned. Dropping is the only place that sees a runtime's shutdown.
struct AbandonedOnDrop {
    signal: Arc<Signal>,
    table: String,
}

impl Drop for AbandonedOnDrop {
    fn drop(&mut self) {
        let asked = self.signal.asked.load(Ordering::SeqCst);
        if asked > *self.signal.answered.borrow() {
            // Coalesced like the notifications: any number of unanswered calls is one
            // notification not sent.
            self.signal.abandoned.fetch_add(1, Ordering::Relaxed);
            unsent(&self.table, REASON_ABANDONED, 1);
        }
    }
}

impl std::fmt::Debug for Waker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waker")
            .field("notifications_sent", &self.notifications_sent())
            .field("notifications_failed", &self.notifications_failed())
            .field("notifications_dropped", &self.notifications_dropped())
            .field("notifications_abandoned", &self.notifications_abandoned())
            .finish()
    }
}

/// The task: one notification per round, each round started after the wake-ups it answers.
async fn send_wake_ups(
    pool: PgPool,
    table: String,
    statement: &'static str,
    channel: String,
    min_gap: Duration,
    signal: Arc<Signal>,
    stop: CancellationToken,
) {
    let _abandoned = AbandonedOnDrop {
        signal: Arc::clone(&signal),
        table: table.clone(),
    };
    // Named after its table, which is at most 43 bytes: the name fits PostgreSQL's 63.
    let own = derived_pool(&pool, &format!("outbox-waker {table}"), 1);
    let mut session = HeldSession::new(own.clone(), true);
    loop {
        tokio::select! {
            // A wake-up asked for before the last handle went is still sent.
            biased;
            () = signal.requested.notified() => {}
            () = stop.cancelled() => break,
        }
        // Every `wake` counted by now is answered by this round, whatever its outcome.
        let round = signal.asked.load(Ordering::SeqCst);
        // A service that shuts down closes its pool, often right after its last commit asked
        // for a wake-up: the end of the service, not a failed notification.
        if pool.is_closed() {
            signal.dropped.fetch_add(1, Ordering::Relaxed);
            unsent(&table, REASON_POOL_CLOSED, 1);
            answer(&signal, round);
            own.close().await;
            continue;
        }
        match notify(&mut session, statement, &channel).await {
            Ok(()) => {
                signal.sent.fetch_add(1, Ordering::Relaxed);
                answer(&signal, round);
                // Wake-ups asked for meanwhile are stored (one permit) and answered next round.
                if !min_gap.is_zero() {
                    tokio::time::sleep(min_gap).await;
                }
            }
            Err(_) if pool.is_closed() => {
                signal.dropped.fetch_add(1, Ordering::Relaxed);
                unsent(&table, REASON_POOL_CLOSED, 1);
                answer(&signal, round);
            }
            Err(error) => {
                signal.failed.fetch_add(1, Ordering::Relaxed);
                unsent(&table, REASON_FAILED, 1);
                answer(&signal, round);
                tracing::warn!(%error, channel, "sending a wake-up failed; the workers' polling picks the events up");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
    drop(session);
    own.close().await;
}

/// Record that every `wake` up to `round` has been answered (rounds end in order, so the count
/// only grows).
fn answer(signal: &Signal, round: u64) {
    signal.answered.send_if_modified(|answered| {
        let grew = round > *answered;
        *answered = (*answered).max(round);
        grew
    });
}

/// Send one notification on the waker's session; a failure on a session kept from an earlier
/// wake-up (it may have died while idle) is retried once at once on a fresh one.
async fn notify(
    session: &mut HeldSession,
    statement: &'static str,
    channel: &str,
) -> sqlx::Result<()> {
    loop {
        let mut checkout = session.checkout().await?;
        let sent = sqlx::query(statement)
            .bind(channel)
            .execute(&mut *checkout.session)
            .await;
        if !session.check_in(checkout, &sent) {
            return sent.map(|_| ());
        }
    }
}

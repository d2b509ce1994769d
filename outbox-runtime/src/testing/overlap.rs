//! Two deliveries of one event inside the receiver at once, the way a stale worker and the
//! redelivery that replaced it overlap: the first started earlier and is held inside the
//! receiver, the second runs to completion, then the first resumes.
//!
//! The kit drives both calls' futures itself, one step at a time (a step is one poll, then a
//! wait for the future's wake-up). Where to hold the first is read from the database: the
//! first is advanced until a session of the test database that was not in a transaction before
//! is idle inside one that has written or locked something (`pg_stat_activity`: idle in
//! transaction, with a transaction id). The handler has then done its work in the transaction
//! and not committed: the kit holds it there. A check-then-act receiver (read "not applied
//! yet", work, write, without a unique constraint) has read "not applied" and written; the
//! second, run to completion meanwhile, reads "not applied" too (the first has not committed)
//! and writes: the event is applied twice once the first commits.
//!
//! A receiver that serialises on the event (a unique key, a row lock) makes the second wait
//! for the first: when the second is not woken for a while and a session of the database waits
//! on a lock, the first is released, and both finish, so the two never wait on each other
//! forever. A first call that never keeps a transaction open in the database (a handler that
//! writes without one, a handler of another database, a publisher's request to a remote
//! service) is held at its first wait that outlasts [`FIRST_HELD_AFTER`], or not at all if it
//! finishes before: then the second is a redelivery after a complete one, and the check
//! compares the state after it with the state after the first. A remote service runs a request
//! it was sent whatever the kit does with the future.
//!
//! Reading `pg_stat_activity` needs the pool's role to see the handler's sessions (the same
//! role, a superuser, or `pg_read_all_stats`); otherwise the first is held only by the time
//! rule above.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::Result;

/// The sessions of this database inside a transaction, this one aside.
const IN_TRANSACTION: &str = "SELECT pid FROM pg_stat_activity \
     WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL";

/// A session of this database, not among `$1`, idle inside a transaction that has written or
/// locked something (it has a transaction id: an `INSERT`, an `UPDATE`, a
/// `SELECT ... FOR UPDATE`) and not committed.
const INSIDE_A_TRANSACTION: &str = "SELECT pid FROM pg_stat_activity \
     WHERE datname = current_database() AND pid <> pg_backend_pid() AND NOT (pid = ANY($1)) \
     AND state = 'idle in transaction' AND backend_xid IS NOT NULL LIMIT 1";

/// Whether a session of this database waits on a lock that session `$1` holds (any lock, when
/// `$1` is null: the first was held by the time rule, its session unknown).
const WAITING_ON_THE_HOLDER: &str = "SELECT EXISTS (SELECT FROM pg_stat_activity \
     WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event_type = 'Lock' \
     AND ($1::int IS NULL OR $1::int = ANY(pg_blocking_pids(pid))))";

/// How long a step waits for the call's wake-up before the kit looks at the database again.
const STEP_WAIT: Duration = Duration::from_millis(20);

/// A first call not woken for this long (and seen in no transaction) is held where it waits.
pub(crate) const FIRST_HELD_AFTER: Duration = Duration::from_secs(2);

/// How long both calls may take in all before the kit gives up on them.
pub(crate) const OVERLAP_DEADLINE: Duration = Duration::from_secs(60);

/// Leave `connections` connections idle in `pool` (at most its size), so that neither call
/// waits for one to be opened while the other runs ahead.
pub(crate) async fn warm(pool: &PgPool, connections: u32) -> Result<()> {
    let connections = connections.min(pool.options().get_max_connections());
    let mut held = Vec::new();
    for _ in 0..connections {
        held.push(pool.acquire().await?);
    }
    Ok(())
}

/// Whether the first call was still held inside the receiver when the second completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// The second completed while the first was held, not finished.
    WhileSecondCompleted,
    /// The first finished before the second could (it was never held, or the second waited on
    /// it: the receiver serialised the two).
    FirstFinishedFirst,
}

/// Run `first` and `second` overlapping (see the [module docs](self)), reading sessions of
/// `pool`'s database. `one_done` is called once, as soon as one of the two has completed (the
/// second, with the first still held, unless the first finished first): the state then is
/// one delivery's. Returns both outputs, or `None` when they did not finish within
/// [`OVERLAP_DEADLINE`].
pub(crate) async fn overlapped<A: Future, B: Future>(
    pool: &PgPool,
    first: A,
    second: B,
    mut one_done: impl AsyncFnMut(),
) -> Result<Option<(A::Output, B::Output, Held)>> {
    let deadline = Instant::now() + OVERLAP_DEADLINE;
    let before: Vec<i32> = sqlx::query_scalar(IN_TRANSACTION).fetch_all(pool).await?;
    let mut first = Stepper::new(first);
    let mut second = Stepper::new(second);

    // The first goes inside the receiver: until it has written in a transaction it keeps
    // open, or waits on something for a while.
    let mut holder: Option<i32> = None;
    let mut last_wake = Instant::now();
    while first.output.is_none() && last_wake.elapsed() < FIRST_HELD_AFTER {
        if Instant::now() >= deadline {
            return Ok(None);
        }
        if first.step().await {
            last_wake = Instant::now();
        }
        holder = sqlx::query_scalar(INSIDE_A_TRANSACTION)
            .bind(&before)
            .fetch_optional(pool)
            .await?;
        if holder.is_some() {
            break;
        }
    }
    let mut reported = false;
    if first.output.is_some() {
        one_done().await;
        reported = true;
    }

    // The second runs to completion while the first is held, unless it waits on the first.
    let mut release_first = false;
    while second.output.is_none() {
        if Instant::now() >= deadline {
            return Ok(None);
        }
        let woken = second.step().await;
        if release_first {
            first.step().await;
            if first.output.is_some() && !reported {
                one_done().await;
                reported = true;
            }
        } else if !woken && second.output.is_none() {
            release_first = sqlx::query_scalar(WAITING_ON_THE_HOLDER)
                .bind(holder)
                .fetch_one(pool)
                .await?;
        }
    }
    let held = if first.output.is_none() {
        Held::WhileSecondCompleted
    } else {
        Held::FirstFinishedFirst
    };
    if !reported {
        one_done().await;
    }
    while first.output.is_none() {
        if Instant::now() >= deadline {
            return Ok(None);
        }
        first.step().await;
    }
    Ok(first.output.zip(second.output).map(|(a, b)| (a, b, held)))
}

/// A future polled by hand, one step at a time.
struct Stepper<F: Future> {
    future: Pin<Box<F>>,
    signal: Arc<Signal>,
    waker: Waker,
    output: Option<F::Output>,
}

impl<F: Future> Stepper<F> {
    fn new(future: F) -> Stepper<F> {
        let signal = Arc::new(Signal {
            woken: AtomicBool::new(true),
            notify: Notify::new(),
        });
        Stepper {
            future: Box::pin(future),
            waker: Waker::from(Arc::clone(&signal)),
            signal,
            output: None,
        }
    }

    /// Poll once if woken since the last poll, then wait at most [`STEP_WAIT`] for the next
    /// wake-up; whether it came (or the future finished).
    async fn step(&mut self) -> bool {
        if self.output.is_some() {
            return true;
        }
        if self.signal.woken.swap(false, Ordering::SeqCst) {
            let mut cx = Context::from_waker(&self.waker);
            if let Poll::Ready(output) = self.future.as_mut().poll(&mut cx) {
                self.output = Some(output);
                return true;
            }
        }
        tokio::time::timeout(STEP_WAIT, self.woken()).await.is_ok()
    }

    /// Until this future is woken (at once if it already was).
    async fn woken(&self) {
        loop {
            let notified = self.signal.notify.notified();
            if self.signal.woken.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }
}

/// The waker of a [`Stepper`]: records the wake-up and notifies a waiting step.
struct Signal {
    woken: AtomicBool,
    notify: Notify,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }
}

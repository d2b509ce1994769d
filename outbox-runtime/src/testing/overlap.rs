//! Two deliveries of one event inside the receiver at once, the way a stale worker and the
//! redelivery that replaced it overlap: the first started earlier and is held inside the
//! receiver, the second runs to completion, then the first resumes.
//!
//! The kit drives both calls' futures itself, one step at a time: a step is one poll, then a
//! wait for the future's wake-up (the I/O it started finished, for example a statement the
//! database executed). The first gets one step; then the second always stays two steps ahead
//! of it, so the first has read whatever it reads before the second writes, and is held before
//! its last step (typically its commit) while the second completes. A check-then-act receiver
//! (read "not applied yet", work, write, without a unique constraint) then applies the event
//! twice. A receiver that serialises on the event (a unique key the second's write waits on,
//! a row lock) makes one wait for the other: a step of the first whose wake-up does not come
//! within [`FIRST_BLOCKED_AFTER`] (of the second: [`SECOND_BLOCKED_AFTER`], longer, since a
//! second that is merely slow, opening a connection say, must not let the first run ahead)
//! counts as blocked, and the other goes on, so the two never wait on each other forever.
//!
//! Only work done inside the sink's future can be held this way: an in-process handler (a
//! [`crate::dispatcher::Dispatcher`]). A publisher's request to a remote receiver is sent when
//! it is sent, and the receiver runs it whatever the kit does with the future: the two requests
//! overlap, but the kit cannot hold the first inside the remote service.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How long a step of the first call may wait for its wake-up before the kit counts it as
/// blocked (waiting on the second, for example for a lock the second holds) and lets the
/// second go on.
pub(crate) const FIRST_BLOCKED_AFTER: Duration = Duration::from_millis(250);

/// The same for the second call: longer, because the first goes on when the second is blocked,
/// and a second that is only slow (a new database connection on a busy machine) must not let
/// the first run ahead and finish first.
pub(crate) const SECOND_BLOCKED_AFTER: Duration = Duration::from_secs(5);

/// How long both calls may take in all before the kit gives up on them.
pub(crate) const OVERLAP_DEADLINE: Duration = Duration::from_secs(60);

/// Leave `connections` connections idle in `pool` (at most its size): steps are what keeps
/// the second call ahead of the first, and a call that has to open a connection first spends
/// steps on that, which would let the first catch up before it read anything.
pub(crate) async fn warm(pool: &PgPool, connections: u32) -> crate::error::Result<()> {
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
    /// The first finished before the second could (the second waited on it: the receiver
    /// serialised the two).
    FirstFinishedFirst,
}

/// Run `first` and `second` overlapping (see the [module docs](self)); `second_done` is
/// called once the second completed, while the first is still held if it can be. Returns both
/// outputs, or `None` when they did not finish within [`OVERLAP_DEADLINE`].
pub(crate) async fn overlapped<A: Future, B: Future>(
    first: A,
    second: B,
    mut second_done: impl AsyncFnMut(),
) -> Option<(A::Output, B::Output, Held)> {
    let deadline = Instant::now() + OVERLAP_DEADLINE;
    let mut first = Stepper::new(first);
    let mut second = Stepper::new(second);
    first.step(deadline, FIRST_BLOCKED_AFTER).await?;
    while second.output.is_none() {
        // The second goes first unless it is two steps ahead (or waits on the first).
        let second_turn = first.output.is_some()
            || (second.steps < first.steps + 2 && !second.blocked)
            || first.blocked;
        if second_turn {
            second.step(deadline, SECOND_BLOCKED_AFTER).await?;
        } else {
            first.step(deadline, FIRST_BLOCKED_AFTER).await?;
        }
        if first.blocked && second.blocked {
            // Both wait: wait for whichever wakes first.
            tokio::time::timeout_at(deadline, async {
                tokio::select! {
                    () = first.woken() => {}
                    () = second.woken() => {}
                }
            })
            .await
            .ok()?;
            first.refresh();
            second.refresh();
        }
    }
    let held = if first.output.is_none() {
        Held::WhileSecondCompleted
    } else {
        Held::FirstFinishedFirst
    };
    second_done().await;
    while first.output.is_none() {
        first.step(deadline, FIRST_BLOCKED_AFTER).await?;
        if first.blocked {
            tokio::time::timeout_at(deadline, first.woken())
                .await
                .ok()?;
            first.refresh();
        }
    }
    Some((first.output?, second.output?, held))
}

/// A future polled by hand, one step at a time.
struct Stepper<F: Future> {
    future: Pin<Box<F>>,
    signal: Arc<Signal>,
    waker: Waker,
    output: Option<F::Output>,
    steps: u32,
    /// The last step's wake-up did not come within [`BLOCKED_AFTER`].
    blocked: bool,
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
            steps: 0,
            blocked: false,
        }
    }

    /// Poll once (if woken since the last poll), then wait at most `blocked_after` for the
    /// next wake-up. `None` past `deadline`.
    async fn step(&mut self, deadline: Instant, blocked_after: Duration) -> Option<()> {
        if Instant::now() >= deadline {
            return None;
        }
        if self.output.is_some() {
            return Some(());
        }
        if self.signal.woken.swap(false, Ordering::SeqCst) {
            self.steps += 1;
            let mut cx = Context::from_waker(&self.waker);
            if let Poll::Ready(output) = self.future.as_mut().poll(&mut cx) {
                self.output = Some(output);
                self.blocked = false;
                return Some(());
            }
        }
        let wait = blocked_after.min(deadline.saturating_duration_since(Instant::now()));
        self.blocked = tokio::time::timeout(wait, self.woken()).await.is_err();
        Some(())
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

    fn refresh(&mut self) {
        self.blocked = !self.signal.woken.load(Ordering::SeqCst);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A check-then-act receiver over a shared "table": read, yield (a statement's round
    /// trip), write. Overlapped, both read before either writes.
    async fn check_then_act(table: &Mutex<Vec<u32>>, id: u32) {
        let seen = table.lock().unwrap().contains(&id);
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        if !seen {
            table.lock().unwrap().push(id);
        }
        tokio::task::yield_now().await;
    }

    #[tokio::test]
    async fn the_first_is_held_while_the_second_completes_and_both_act() {
        let table = Mutex::new(Vec::new());
        let mut while_held = None;
        let (_, _, held) = overlapped(
            check_then_act(&table, 7),
            check_then_act(&table, 7),
            async || while_held = Some(table.lock().unwrap().clone()),
        )
        .await
        .unwrap();
        assert_eq!(held, Held::WhileSecondCompleted);
        assert_eq!(
            while_held,
            Some(vec![7]),
            "the second's effect, the first held"
        );
        assert_eq!(*table.lock().unwrap(), vec![7, 7], "the first acted too");
    }

    #[tokio::test]
    async fn a_second_that_waits_on_the_first_is_not_a_deadlock() {
        let lock = tokio::sync::Mutex::new(0);
        let take = async || {
            let mut guard = lock.lock().await;
            tokio::task::yield_now().await;
            *guard += 1;
        };
        let (_, _, held) = overlapped(take(), take(), async || {}).await.unwrap();
        assert_eq!(held, Held::FirstFinishedFirst);
        assert_eq!(*lock.lock().await, 2);
    }
}

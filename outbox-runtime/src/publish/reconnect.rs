//! Reaching a broker (or receiver) that went away without hammering it: capped exponential
//! backoff with jitter, shared by every delivery of one publisher.
//!
//! Without it, every delivery that finds the connection gone opens a new one: at a worker
//! concurrency of 16 with a short retry policy, a 20 s RabbitMQ outage cost thousands of
//! connection attempts, each one a TCP handshake (and an AMQP one) the broker has to refuse
//! when it comes back under load. With it, a publisher makes one attempt at a time while the
//! broker fails, and after `n` failed attempts in a row waits [`ReconnectBackoff::delay_for`]
//! `(n)` before the next: deliveries that arrive meanwhile fail at once as retries (the
//! worker's own backoff then schedules the event, so an outage never charges an event more
//! attempts than its retry policy allows), and nothing is sent, so nothing is lost.
//!
//! The first attempt after a healthy connection broke is made at once: one broken connection
//! costs no delay.

use std::sync::Mutex;
use std::time::Duration;

use std::time::Instant;

use rand::Rng;

use crate::error::{Error, Result};

/// How a publisher spaces its attempts to reach a broker that does not answer.
///
/// After `n` failed attempts in a row, the next one waits `min(first * 2^(n-1), max)`, of which
/// the upper half is random ("equal jitter"), so that publishers of several processes that
/// lost the broker together do not all come back at the same instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconnectBackoff {
    /// The wait after the first failed attempt (default 100 ms).
    pub first: Duration,
    /// The longest wait between two attempts (default 5 s): how long, at most, a broker that
    /// came back waits for this publisher to notice.
    pub max: Duration,
}

impl Default for ReconnectBackoff {
    fn default() -> Self {
        ReconnectBackoff {
            first: Duration::from_millis(100),
            max: Duration::from_secs(5),
        }
    }
}

impl ReconnectBackoff {
    /// The wait before the next attempt after `failures` failed attempts in a row (none for
    /// 0: the first attempt after a healthy connection broke is made at once).
    pub fn delay_for(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let exponent = (failures - 1).min(31);
        let capped = self.first.saturating_mul(1u32 << exponent).min(self.max);
        let half = capped / 2;
        let spread = u64::try_from(half.as_micros()).unwrap_or(u64::MAX);
        half + Duration::from_micros(rand::rng().random_range(0..=spread))
    }

    /// Reject a backoff that would hammer the broker or never retry; `what` names the setting
    /// in the message (`AmqpConfig::reconnect`).
    pub(crate) fn validate(&self, what: &str) -> Result<()> {
        if self.first.is_zero() {
            return Err(Error::Config(format!(
                "{what}.first must be greater than zero (the default is 100 ms): a zero wait \
                 reconnects in a tight loop while the broker is away"
            )));
        }
        if self.max < self.first {
            return Err(Error::Config(format!(
                "{what}.max ({:?}) is smaller than {what}.first ({:?}); raise max or lower first",
                self.max, self.first
            )));
        }
        Ok(())
    }
}

/// Why no attempt may be made now; see [`Reconnect::begin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Waiting {
    /// Failed attempts in a row so far.
    pub failures: u32,
    /// How long until the next attempt may be made (zero while one is under way).
    pub left: Duration,
    /// Whether another delivery's attempt is under way right now.
    pub in_flight: bool,
    /// What the last failed attempt said (already redacted by the publisher).
    pub last_error: String,
}

impl Waiting {
    /// `<last error> (<n> attempts in a row failed; the next in <left>)`, for a failure reason.
    pub fn describe(&self) -> String {
        let next = if self.in_flight {
            "another attempt is under way".to_owned()
        } else {
            format!("the next in {} ms", self.left.as_millis())
        };
        format!(
            "{} ({} attempt{} in a row failed; {next})",
            self.last_error,
            self.failures,
            if self.failures == 1 { "" } else { "s" }
        )
    }
}

/// An attempt [`Reconnect::begin`] allowed; end it with [`Attempt::failed`] or
/// [`Attempt::succeeded`]. Dropped without either (its delivery was abandoned at a lost lease,
/// the future cancelled), it says nothing about the broker and lets the next attempt probe.
#[derive(Debug)]
#[must_use]
pub(crate) struct Attempt<'a> {
    reconnect: &'a Reconnect,
    /// The failure count when the attempt began: failures of attempts that began before the
    /// last recorded failure are that same outage, and are counted once.
    round: u32,
    /// Whether this attempt is the one probe allowed while the broker fails (and holds
    /// `in_flight` until it ends).
    probe: bool,
}

impl Attempt<'_> {
    /// The attempt could not reach the broker: `error` says why (redacted). Starts or
    /// lengthens the backoff, once per round of attempts.
    pub(crate) fn failed(self, error: &str) {
        self.failed_at(error, Instant::now());
    }

    fn failed_at(mut self, error: &str, now: Instant) {
        let reconnect = self.reconnect;
        let mut state = reconnect.lock();
        if std::mem::take(&mut self.probe) {
            state.in_flight = false;
        }
        if self.round != state.failures {
            // Began before the failure that started this wait: the same outage, seen later.
            return;
        }
        state.failures = state.failures.saturating_add(1);
        state.not_before = Some(now + reconnect.backoff.delay_for(state.failures));
        error.clone_into(&mut state.last_error);
        tracing::debug!(
            failures = state.failures,
            error,
            "cannot reach the broker; backing off"
        );
    }

    /// The attempt reached the broker: the next failure starts from the first wait again.
    pub(crate) fn succeeded(mut self) {
        let mut state = self.reconnect.lock();
        if std::mem::take(&mut self.probe) {
            state.in_flight = false;
        }
        if state.failures > 0 {
            tracing::debug!(
                failures = state.failures,
                "reached the broker again after failed attempts"
            );
        }
        state.failures = 0;
        state.not_before = None;
        state.last_error.clear();
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if self.probe {
            self.reconnect.lock().in_flight = false;
        }
    }
}

/// The reconnect state of one publisher, shared by all its deliveries.
#[derive(Debug)]
pub(crate) struct Reconnect {
    backoff: ReconnectBackoff,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    failures: u32,
    /// No attempt before this (set after a failure).
    not_before: Option<Instant>,
    /// A probe is under way (only while failing).
    in_flight: bool,
    last_error: String,
}

impl Reconnect {
    pub(crate) fn new(backoff: ReconnectBackoff) -> Reconnect {
        Reconnect {
            backoff,
            state: Mutex::new(State::default()),
        }
    }

    /// May a delivery try to reach the broker now? While it is healthy, always (deliveries run
    /// concurrently); once an attempt failed, only one at a time, and only after the backoff.
    pub(crate) fn begin(&self) -> std::result::Result<Attempt<'_>, Waiting> {
        self.begin_at(Instant::now())
    }

    fn begin_at(&self, now: Instant) -> std::result::Result<Attempt<'_>, Waiting> {
        let mut state = self.lock();
        if state.failures == 0 {
            return Ok(Attempt {
                reconnect: self,
                round: 0,
                probe: false,
            });
        }
        let left = state
            .not_before
            .map_or(Duration::ZERO, |at| at.saturating_duration_since(now));
        if state.in_flight || !left.is_zero() {
            return Err(Waiting {
                failures: state.failures,
                left,
                in_flight: state.in_flight,
                last_error: state.last_error.clone(),
            });
        }
        state.in_flight = true;
        Ok(Attempt {
            reconnect: self,
            round: state.failures,
            probe: true,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a few plain values, consistent after every statement: a panic while
        // holding the lock leaves nothing half-written.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_to_the_cap_with_jitter_in_the_upper_half() {
        let b = ReconnectBackoff::default();
        assert_eq!(b.delay_for(0), Duration::ZERO);
        for _ in 0..200 {
            let d = b.delay_for(1);
            assert!(
                d >= Duration::from_millis(50) && d <= Duration::from_millis(100),
                "{d:?}"
            );
            let d = b.delay_for(3);
            assert!(
                d >= Duration::from_millis(200) && d <= Duration::from_millis(400),
                "{d:?}"
            );
            let d = b.delay_for(40);
            assert!(d >= Duration::from_millis(2500) && d <= b.max, "{d:?}");
        }
        assert!(b.validate("x").is_ok());
        let zero = ReconnectBackoff {
            first: Duration::ZERO,
            ..b
        };
        assert!(
            zero.validate("AmqpConfig::reconnect")
                .unwrap_err()
                .to_string()
                .contains("AmqpConfig::reconnect.first")
        );
        let upside_down = ReconnectBackoff {
            max: Duration::from_millis(10),
            ..b
        };
        assert!(upside_down.validate("x").is_err());
    }

    #[test]
    fn one_probe_at_a_time_after_a_failure_and_only_after_the_wait() {
        let r = Reconnect::new(ReconnectBackoff {
            first: Duration::from_secs(1),
            max: Duration::from_secs(8),
        });
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        // Healthy: everyone may go, concurrently.
        let a = r.begin_at(t0).unwrap();
        let b = r.begin_at(t0).unwrap();
        a.failed_at("refused", t0);
        // The second failure of the same round does not lengthen the wait.
        b.failed_at("refused too", t0);
        let waiting = r.begin_at(t0).unwrap_err();
        assert_eq!(waiting.failures, 1);
        assert!(
            waiting.left >= Duration::from_millis(500) && waiting.left <= Duration::from_secs(1)
        );
        assert!(
            waiting
                .describe()
                .starts_with("refused (1 attempt in a row failed; the next in"),
            "{}",
            waiting.describe()
        );
        let probe = r.begin_at(at(1)).unwrap();
        let busy = r.begin_at(at(1)).unwrap_err();
        assert!(busy.in_flight, "{busy:?}");
        probe.failed_at("refused", at(1));
        let waiting = r.begin_at(at(1)).unwrap_err();
        assert_eq!(waiting.failures, 2);
        assert!(waiting.left >= Duration::from_secs(1), "{waiting:?}");
        // A probe whose delivery was abandoned (dropped) lets the next one probe.
        drop(r.begin_at(at(3)).unwrap());
        let probe = r.begin_at(at(3)).unwrap();
        probe.succeeded();
        assert!(r.begin_at(at(3)).is_ok() && r.begin_at(at(3)).is_ok());
    }
}

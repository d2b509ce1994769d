//! Every knob of a worker, its documented default, and the checks that reject nonsense before
//! anything starts.

use std::time::Duration;

use rand::Rng;

use crate::error::{Error, Result};

/// How long a failed event waits before its next attempt: exponential backoff with jitter.
///
/// The delay for attempt `n` (1-based, the attempt that just failed) is
/// `min(base * 2^(n-1), max)`, of which the upper half is randomised ("equal jitter"), so many
/// events that failed together do not all come back at the same instant. A handler that asks for
/// a specific delay ([`crate::HandlerError::retry_after`]) gets exactly that delay instead.
///
/// The same backoff applies when a lease expires (a worker crashed or stalled on the event): the
/// maintenance leader passes this policy to `Store::recover_expired`, which computes the delay
/// for the expired attempt in the database ([`crate::store::RecoveryBackoff`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Delay after the first failed attempt (default 1 s).
    pub base: Duration,
    /// Largest delay between attempts (default 5 min).
    pub max: Duration,
    /// Randomise the upper half of each delay (default true). Off only for tests that need exact
    /// delays.
    pub jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_secs(1),
            max: Duration::from_secs(300),
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// The delay before retrying after `attempt` (1-based) failed.
    pub fn delay_for(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(31);
        let uncapped = self.base.saturating_mul(1u32 << exponent);
        let capped = uncapped.min(self.max);
        if !self.jitter || capped.is_zero() {
            return capped;
        }
        let half = capped / 2;
        let spread = u64::try_from(half.as_micros()).unwrap_or(u64::MAX);
        half + Duration::from_micros(rand::rng().random_range(0..=spread))
    }

    fn validate(&self) -> Result<()> {
        if self.base.is_zero() {
            return Err(Error::Config(
                "retry.base must be greater than zero; the default is 1 s".into(),
            ));
        }
        if self.max < self.base {
            return Err(Error::Config(format!(
                "retry.max ({:?}) is smaller than retry.base ({:?}); raise max or lower base",
                self.max, self.base
            )));
        }
        Ok(())
    }
}

/// Most events one worker may hold claimed (`concurrency + prefetch`): far beyond any useful
/// setting, and it keeps semaphore counts well inside their limits.
const MAX_HELD: usize = 1_000_000;

/// Configuration of one worker. Built by [`crate::worker::WorkerBuilder`]; every field has a
/// default sensible for a small service.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Outbox table to deliver from (default `outbox`).
    pub table: String,
    /// Name recorded in `claimed_by` and in logs (default `<host>-<pid>-<random>`).
    pub name: String,
    /// Deliveries running at once (default 64).
    pub concurrency: usize,
    /// Largest number of events claimed in one statement (default 256). The claimer never
    /// claims more than the room left by the running and waiting deliveries (`concurrency` plus
    /// the prefetch window), so a large batch costs nothing when the sink is slow; with a fast
    /// sink, fewer and larger claims drain a backlog faster (`docs/benchmarks.md`, "How the
    /// defaults were chosen").
    pub batch_size: usize,
    /// Most claimed events waiting for a delivery slot beyond the running ones (default 512;
    /// 0 claims only into free slots).
    ///
    /// Claiming ahead keeps every slot busy while the next claim is on its way, which is what
    /// a fast sink needs. The worker sizes the window from what it measures, enough for two
    /// claim round trips at the current delivery rate, so with a slow sink it stays at one or
    /// two events: a waiting event is invisible to other workers, and this bound is how many
    /// that can be at most. Waiting events keep their lease renewed; shutdown hands them back
    /// unstarted and uncharged.
    pub prefetch: usize,
    /// Lease of a claim (default 30 s). A worker that dies loses its events for this long.
    pub lease: Duration,
    /// Renew leases of running deliveries (default true). Off only to test lease expiry.
    pub renewal: bool,
    /// How often running deliveries' leases are renewed (default a third of the lease; must be
    /// shorter than nine tenths of the lease, when the worker gives up a lease not renewed).
    pub renew_interval: Option<Duration>,
    /// Backoff between attempts, after a failed delivery or an expired lease.
    pub retry: RetryPolicy,
    /// Fallback poll interval when no notification arrives (default 2 s; jittered by ±10%).
    pub poll_interval: Duration,
    /// Wake up on LISTEN/NOTIFY (default true). Turn off behind poolers in transaction mode
    /// (PgBouncer), where LISTEN does not work; the worker then only polls.
    pub listen: bool,
    /// Deliver the events of one aggregate one at a time, in the order their transactions
    /// committed (default false; see `docs/ordering.md`).
    pub ordered: bool,
    /// Delete delivered events enqueued longer ago than this (default 7 days); `None` keeps
    /// them. The window counts from the enqueue: the event row is never updated, so it keeps no
    /// delivery time (an event delivered a day late keeps its key's protection a day less). An
    /// event not delivered yet is never purged, however old.
    ///
    /// Whatever the retention, a completion deletes the event's queue row (its delivery state),
    /// which writes no index entry; the event row stays as delivered history. With
    /// `Some(Duration::ZERO)` the completion deletes the event row too, in the same fenced
    /// statement: no delivered history is kept. The trade-off: the event id, and so the
    /// operation key, is free again once the event is delivered, so a business command retried
    /// after delivery enqueues a new event (with the same event id, which receivers that
    /// deduplicate on it still drop). With a retention above zero the key deduplicates retries
    /// for that long after the enqueue.
    pub retention: Option<Duration>,
    /// How often the maintenance leader recovers expired leases and purges (default 5 s).
    pub maintenance_interval: Duration,
    /// Rows recovered or purged per statement by maintenance (default 1000).
    pub maintenance_batch: i64,
    /// Run the maintenance task at all (default true). Some deployments run it in one place.
    pub maintenance: bool,
    /// The maintenance leader runs `VACUUM (SKIP_LOCKED)` on the outbox table and on its queue
    /// table, each once its dead row versions pass max(10,000, a fifth of its live rows) (default
    /// true), whether or not autovacuum is on. Every delivered event leaves dead versions behind
    /// (its completion deletes its queue row, its purge its event row): without any vacuum the
    /// tables grow without bound, and autovacuum, which visits a database at most once per
    /// `autovacuum_naptime` and is cost-throttled, lets them grow between its runs at a few
    /// thousand events a second. Needs a role that owns the tables; otherwise the leader logs
    /// one warning saying what to do.
    pub vacuum_dead_rows: bool,
    /// Completions written in one statement at most (default 512). A full batch is written at
    /// once; a partial one after `completion_flush`, or as soon as it holds every claim the
    /// worker has. One more batch may wait while one is written; beyond that, delivered events
    /// keep their delivery slot until there is room, so the worker claims no more than it can
    /// complete.
    pub completion_batch: usize,
    /// How long the completer waits to fill a batch (default 5 ms).
    pub completion_flush: Duration,
    /// How long shutdown waits for running deliveries before cancelling them (default 30 s), and
    /// again for the last completions to be written before abandoning them (a database that
    /// stopped answering); their events are then delivered again once their leases end.
    pub shutdown_deadline: Duration,
}

impl WorkerConfig {
    /// The defaults, for `table`.
    pub fn new(table: &str) -> Self {
        WorkerConfig {
            table: table.to_owned(),
            name: default_worker_name(),
            concurrency: 64,
            batch_size: 256,
            prefetch: 512,
            lease: Duration::from_secs(30),
            renewal: true,
            renew_interval: None,
            retry: RetryPolicy::default(),
            poll_interval: Duration::from_secs(2),
            listen: true,
            ordered: false,
            retention: Some(Duration::from_secs(7 * 24 * 3600)),
            maintenance_interval: Duration::from_secs(5),
            maintenance_batch: 1000,
            maintenance: true,
            vacuum_dead_rows: true,
            completion_batch: 512,
            completion_flush: Duration::from_millis(5),
            shutdown_deadline: Duration::from_secs(30),
        }
    }

    /// Whether completions delete the delivered events too, not only their queue rows (a
    /// retention of zero).
    pub fn deletes_on_completion(&self) -> bool {
        self.retention == Some(Duration::ZERO)
    }

    /// The effective renewal interval.
    pub fn renew_every(&self) -> Duration {
        self.renew_interval.unwrap_or(self.lease / 3)
    }

    /// Reject values that cannot work, saying which knob and what to use instead.
    pub fn validate(&self) -> Result<()> {
        // The store's rule, checked here too so a bad name fails before any I/O.
        crate::store::validate_table_name(&self.table)?;
        if self.name.trim().is_empty() {
            return Err(Error::Config("worker name must not be empty".into()));
        }
        if self.concurrency == 0 {
            return Err(Error::Config(
                "concurrency must be at least 1; the default is 64".into(),
            ));
        }
        if self.batch_size == 0 {
            return Err(Error::Config(
                "batch_size must be at least 1; the default is 256".into(),
            ));
        }
        if self.concurrency > MAX_HELD || self.prefetch > MAX_HELD - self.concurrency {
            return Err(Error::Config(format!(
                "concurrency ({}) plus prefetch ({}) exceeds {MAX_HELD} events held at once; \
                 the defaults are 64 and 512",
                self.concurrency, self.prefetch
            )));
        }
        if self.lease < Duration::from_millis(200) {
            return Err(Error::Config(format!(
                "lease {:?} is too short to renew reliably; use at least 200 ms (the default is 30 s)",
                self.lease
            )));
        }
        // The worker gives a lease up a tenth before its end unless a renewal succeeded by then
        // (see `inflight`), so the first renewal must come before that.
        let renew_before = self.lease - super::inflight::safety_margin(self.lease);
        if self.renewal && self.renew_every() >= renew_before {
            return Err(Error::Config(format!(
                "renew_interval {:?} is not shorter than nine tenths of the lease {:?} ({renew_before:?}): \
                 leases would be given up before their renewal; use about a third of the lease",
                self.renew_every(),
                self.lease
            )));
        }
        if self.renewal && self.renew_every().is_zero() {
            return Err(Error::Config(
                "renew_interval must be greater than zero".into(),
            ));
        }
        if self.poll_interval.is_zero() {
            return Err(Error::Config(
                "poll_interval must be greater than zero; the default is 2 s".into(),
            ));
        }
        if self.maintenance_interval.is_zero() {
            return Err(Error::Config(
                "maintenance_interval must be greater than zero; the default is 5 s".into(),
            ));
        }
        if self.maintenance_batch < 1 {
            return Err(Error::Config(
                "maintenance_batch must be at least 1; the default is 1000".into(),
            ));
        }
        if self.completion_batch == 0 {
            return Err(Error::Config(
                "completion_batch must be at least 1; the default is 512".into(),
            ));
        }
        self.retry.validate()
    }
}

/// `<host>-<pid>-<6 random hex digits>`: unique per worker, readable in `claimed_by`.
pub fn default_worker_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".to_owned());
    let suffix: u32 = rand::rng().random_range(0..0x100_0000);
    format!("{host}-{}-{suffix:06x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let p = RetryPolicy {
            base: Duration::from_secs(1),
            max: Duration::from_secs(10),
            jitter: false,
        };
        assert_eq!(p.delay_for(1), Duration::from_secs(1));
        assert_eq!(p.delay_for(2), Duration::from_secs(2));
        assert_eq!(p.delay_for(4), Duration::from_secs(8));
        assert_eq!(p.delay_for(5), Duration::from_secs(10));
        assert_eq!(p.delay_for(500), Duration::from_secs(10));
    }

    #[test]
    fn jitter_stays_in_upper_half() {
        let p = RetryPolicy {
            base: Duration::from_secs(4),
            max: Duration::from_secs(60),
            jitter: true,
        };
        for _ in 0..200 {
            let d = p.delay_for(1);
            assert!(
                d >= Duration::from_secs(2) && d <= Duration::from_secs(4),
                "{d:?}"
            );
        }
    }

    /// The error `change` makes `validate` return, or panics if it is accepted.
    fn refused(change: impl FnOnce(&mut WorkerConfig)) -> String {
        let mut c = WorkerConfig::new("outbox");
        change(&mut c);
        match c.validate() {
            Err(e) => e.to_string(),
            Ok(()) => panic!("accepted: {c:?}"),
        }
    }

    /// Panics with the error if `change` makes the configuration invalid.
    fn accepted(change: impl FnOnce(&mut WorkerConfig)) {
        let mut c = WorkerConfig::new("outbox");
        change(&mut c);
        if let Err(e) = c.validate() {
            panic!("refused: {e} ({c:?})");
        }
    }

    /// Every knob is refused just past its limit, named in the error, and accepted at it.
    #[test]
    fn every_knob_is_checked_at_its_boundary() {
        assert!(refused(|c| c.name = "  ".into()).contains("worker name"));
        accepted(|c| c.name = "w".into());
        assert!(refused(|c| c.table = "Bad-Name".into()).contains("Bad-Name"));
        assert!(refused(|c| c.batch_size = 0).contains("batch_size"));
        accepted(|c| c.batch_size = 1);
        accepted(|c| c.concurrency = 1);
        // concurrency plus prefetch at most MAX_HELD, checked without overflowing.
        accepted(|c| (c.concurrency, c.prefetch) = (MAX_HELD, 0));
        assert!(refused(|c| (c.concurrency, c.prefetch) = (MAX_HELD + 1, 0)).contains("prefetch"));
        accepted(|c| (c.concurrency, c.prefetch) = (64, MAX_HELD - 64));
        assert!(
            refused(|c| (c.concurrency, c.prefetch) = (64, MAX_HELD - 63)).contains("prefetch")
        );
        accepted(|c| c.lease = Duration::from_millis(200));
        assert!(refused(|c| c.lease = Duration::from_millis(199)).contains("200 ms"));
        // Without renewal, the renewal interval is not used, so it is not checked.
        accepted(|c| (c.renewal, c.renew_interval) = (false, Some(c.lease)));
        accepted(|c| (c.renewal, c.renew_interval) = (false, Some(Duration::ZERO)));
        assert!(refused(|c| c.renew_interval = Some(Duration::ZERO)).contains("greater than zero"));
        assert!(refused(|c| c.poll_interval = Duration::ZERO).contains("poll_interval"));
        accepted(|c| c.poll_interval = Duration::from_nanos(1));
        assert!(
            refused(|c| c.maintenance_interval = Duration::ZERO).contains("maintenance_interval")
        );
        accepted(|c| c.maintenance_interval = Duration::from_nanos(1));
        assert!(refused(|c| c.maintenance_batch = 0).contains("maintenance_batch"));
        accepted(|c| c.maintenance_batch = 1);
        assert!(refused(|c| c.completion_batch = 0).contains("completion_batch"));
        accepted(|c| c.completion_batch = 1);
        assert!(refused(|c| c.retry.base = Duration::ZERO).contains("retry.base"));
        assert!(refused(|c| c.retry.max = c.retry.base / 2).contains("retry.max"));
        accepted(|c| c.retry.max = c.retry.base);
    }

    #[test]
    fn the_renewal_interval_defaults_to_a_third_of_the_lease() {
        let mut c = WorkerConfig::new("outbox");
        c.lease = Duration::from_secs(30);
        assert_eq!(c.renew_every(), Duration::from_secs(10));
        c.renew_interval = Some(Duration::from_secs(4));
        assert_eq!(c.renew_every(), Duration::from_secs(4));
    }

    #[test]
    fn only_a_retention_of_zero_deletes_on_completion() {
        let mut c = WorkerConfig::new("outbox");
        c.retention = Some(Duration::ZERO);
        assert!(c.deletes_on_completion());
        c.retention = Some(Duration::from_secs(1));
        assert!(!c.deletes_on_completion());
        c.retention = None;
        assert!(!c.deletes_on_completion());
    }

    #[test]
    fn default_worker_names_are_host_pid_and_six_hex_digits() {
        let name = default_worker_name();
        let (rest, suffix) = name.rsplit_once('-').unwrap();
        assert_eq!(suffix.len(), 6, "{name}");
        assert!(suffix.chars().all(|c| c.is_ascii_hexdigit()), "{name}");
        let (host, pid) = rest.rsplit_once('-').unwrap();
        assert_eq!(pid, std::process::id().to_string(), "{name}");
        // The machine's name, where it has one: `HOSTNAME`, else /etc/hostname.
        let named = |h: String| Some(h.trim().to_owned()).filter(|h| !h.is_empty());
        let expected = std::env::var("HOSTNAME")
            .ok()
            .and_then(named)
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .and_then(named)
            })
            .unwrap_or_else(|| "worker".to_owned());
        assert_eq!(host, expected, "{name}");
    }

    #[test]
    fn validate_names_the_knob() {
        let mut c = WorkerConfig::new("outbox");
        c.validate().unwrap();
        c.concurrency = 0;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("concurrency")
        );
        let mut c = WorkerConfig::new("outbox");
        c.renew_interval = Some(c.lease);
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("renew_interval")
        );
        // Renewing later than the local lease end (nine tenths of the lease) cannot work either.
        c.renew_interval = Some(c.lease.mul_f64(0.95));
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("nine tenths")
        );
        c.renew_interval = Some(c.lease.mul_f64(0.85));
        c.validate().unwrap();
        let c = WorkerConfig::new("Bad-Name");
        assert!(c.validate().is_err());
    }
}

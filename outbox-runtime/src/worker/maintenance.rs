//! Recovers expired leases, purges delivered rows past retention, refreshes the queue gauges,
//! and vacuums the table once dead rows pile up ([`super::vacuum`]), on one worker per table at
//! a time.
//!
//! Leadership is a session advisory lock held on a dedicated connection: it is released by
//! PostgreSQL the moment that connection or its process dies, so another worker takes over on
//! its next tick. Work is done in bounded batches (a few statements of `maintenance_batch` rows
//! per tick), and a batch that fails is halved for the next try, so a slow database is not
//! hammered with statements that time out.

use std::collections::HashSet;
use std::sync::Arc;

use rand::Rng;
use sqlx::{ConnectOptions, Connection, PgConnection};
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::events::WorkerEvent;
use super::sessions::SessionRole;
use super::vacuum::{VacuumOutcome, vacuum_if_needed};
use crate::error::Result;
use crate::store::{RecoveryBackoff, queue_table};

/// Take leadership of one table's maintenance if nobody holds it. The key is the table itself,
/// resolved through the connection's search_path to its oid: two tables of one name in two
/// schemas are two tables, each with its own leader. Returns whether the lock was taken (NULL
/// when no such table is visible) and the oid key, kept to give the same lock up.
/// $1: the table name.
const TRY_LEAD: &str = "\
SELECT pg_try_advisory_lock(hashtext('outbox.maintenance'), t.key) AS taken, t.key
FROM (SELECT to_regclass($1)::oid::int4 AS key) AS t";
/// Give leadership up at shutdown. $1: the key [`TRY_LEAD`] returned.
const STOP_LEADING: &str = "SELECT pg_advisory_unlock(hashtext('outbox.maintenance'), $1)";
/// Check the leader's connection (and so its lock) is still alive.
const STILL_LEADING: &str = "SELECT 1";

/// Statements of each kind per tick at most: the rest waits for the next tick.
const ROUNDS_PER_TICK: u32 = 10;
/// The oldest ready pending events looked at for `outbox_unhandled_events` (an event nobody
/// claims stays at the head of the queue; see store/sql/unhandled_events.sql).
const UNHANDLED_LOOKED_AT: i64 = 10_000;
/// A batch never shrinks below this.
const MIN_BATCH: i64 = 10;

/// What one maintenance pass did (all zero on a worker that is not the leader), for the log line
/// and the `MaintenanceRan` hook event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MaintenanceCounts {
    /// Expired leases returned to pending.
    pub(crate) requeued: u64,
    /// Expired leases exhausted (attempts used up).
    pub(crate) exhausted: u64,
    /// Delivered rows deleted.
    pub(crate) purged: u64,
}

/// The batch after a failed statement: half of `batch`, but not below [`MIN_BATCH`] (or the
/// configured batch, when that is smaller still).
fn halved(batch: i64, configured: i64) -> i64 {
    (batch / 2).max(MIN_BATCH.min(configured))
}

pub(crate) struct Maintenance {
    pub(crate) shared: Arc<Shared>,
    conn: Option<PgConnection>,
    leader: bool,
    /// The second half of the advisory lock's key (the table's oid), once resolved.
    lock_key: Option<i32>,
    batch: i64,
    /// Set once the leader found it may not vacuum the table (warned once, not retried).
    vacuum_refused: bool,
    /// The (type, version) series of `outbox_unhandled_events` last published, to set back to
    /// zero once a worker claims them.
    unhandled: HashSet<(String, i32)>,
}

impl Maintenance {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        let batch = shared.config.maintenance_batch;
        Maintenance {
            shared,
            conn: None,
            leader: false,
            lock_key: None,
            batch,
            vacuum_refused: false,
            unhandled: HashSet::new(),
        }
    }

    pub(crate) async fn run(mut self, stop: CancellationToken) {
        let every = self.shared.config.maintenance_interval;
        // A small stagger so workers started together do not all race for the lock at once;
        // then the first pass runs at once (recovering what a crashed predecessor left).
        let stagger = every.mul_f64(rand::rng().random_range(0.0..0.1));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + stagger, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            match self.run_once().await {
                Ok(c) if c.requeued + c.exhausted + c.purged > 0 => tracing::info!(
                    requeued = c.requeued,
                    exhausted = c.exhausted,
                    purged = c.purged,
                    "maintenance"
                ),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "maintenance failed; trying again next interval")
                }
            }
        }
        self.stop_leading().await;
    }

    /// One pass: take or confirm leadership, then recover, purge and publish gauges.
    pub(crate) async fn run_once(&mut self) -> Result<MaintenanceCounts> {
        if !self.ensure_leader().await? {
            return Ok(MaintenanceCounts::default());
        }
        let shared = Arc::clone(&self.shared);
        let store = &shared.maintenance_store;
        let mut counts = MaintenanceCounts::default();
        // The worker's own retry policy: an expired lease backs off like a failed delivery.
        let retry = shared.config.retry;
        let recovery_backoff = RecoveryBackoff {
            base: retry.base,
            max: retry.max,
            jitter: retry.jitter,
        };
        for _ in 0..ROUNDS_PER_TICK {
            let batch = self.batch;
            match store.recover_expired(batch, recovery_backoff).await {
                Ok(r) => {
                    self.batch_succeeded();
                    counts.requeued += r.requeued;
                    counts.exhausted += r.exhausted;
                    if r.requeued + r.exhausted < batch as u64 {
                        break;
                    }
                }
                Err(e) => {
                    self.batch_failed();
                    return Err(e);
                }
            }
        }
        if let Some(retention) = shared.config.retention {
            for _ in 0..ROUNDS_PER_TICK {
                let batch = self.batch;
                match store.purge_delivered(retention, batch).await {
                    Ok(n) => {
                        self.batch_succeeded();
                        counts.purged += n;
                        if n < batch as u64 {
                            break;
                        }
                    }
                    Err(e) => {
                        self.batch_failed();
                        return Err(e);
                    }
                }
            }
        }
        if shared.config.vacuum_dead_rows && !self.vacuum_refused {
            self.vacuum().await?;
        }
        let gauges = store.gauges().await?;
        shared.counters.gauges(&gauges);
        self.publish_unhandled().await;
        shared.hook.emit(|| WorkerEvent::MaintenanceRan {
            requeued: counts.requeued,
            exhausted: counts.exhausted,
            purged: counts.purged,
        });
        Ok(counts)
    }

    /// Publish the events no live worker claims (`outbox_unhandled_events`), and log each type
    /// and version once when it starts waiting. A failure (a base schema without
    /// outbox_workers) costs the gauge, not the pass.
    async fn publish_unhandled(&mut self) {
        let shared = Arc::clone(&self.shared);
        match shared
            .maintenance_store
            .unhandled_events(UNHANDLED_LOOKED_AT)
            .await
        {
            Ok(now) => {
                for u in now.iter().filter(|u| {
                    !self
                        .unhandled
                        .contains(&(u.event_type.clone(), u.event_version))
                }) {
                    tracing::warn!(
                        table = %shared.config.table,
                        event_type = %u.event_type,
                        event_version = u.event_version,
                        waiting = u.waiting,
                        since = %u.since,
                        "no running worker handles these events: they wait, uncharged, until a worker that handles them is deployed"
                    );
                }
                self.unhandled = shared.counters.unhandled(&now, &self.unhandled);
            }
            Err(e) => {
                tracing::debug!(error = %e, "reading the events no worker handles failed")
            }
        }
    }

    /// Vacuum the event table and its queue table, each once its dead rows piled up (on the
    /// leader's own connection). The queue table takes the churn (every claim, renewal and
    /// completion); the event table only the purge's deletes.
    async fn vacuum(&mut self) -> Result<()> {
        let table = self.shared.config.table.clone();
        for relation in [queue_table(&table), table] {
            let Some(conn) = self.conn.as_mut() else {
                return Ok(());
            };
            match vacuum_if_needed(conn, &relation).await? {
                VacuumOutcome::NotNeeded => {}
                VacuumOutcome::Vacuumed {
                    dead_before,
                    inserted_before,
                } => {
                    tracing::info!(table = %relation, dead_before, inserted_before, "dead or inserted rows passed the threshold; vacuumed the table");
                }
                VacuumOutcome::NotAllowed { dead, autovacuum } => {
                    self.vacuum_refused = true;
                    let what = if autovacuum {
                        "this role may not vacuum the outbox tables, so they are left to autovacuum, which runs \
                         at most once per autovacuum_naptime and lets them grow between its runs at high \
                         event rates: connect the worker as the tables' owner, or tune autovacuum for them"
                            .to_owned()
                    } else {
                        format!(
                            "autovacuum is off for the outbox table {relation} and this role may not vacuum it, so \
                             dead rows pile up and the table grows: enable autovacuum, run `VACUUM {relation}` \
                             periodically as its owner, or connect the worker as the owner"
                        )
                    };
                    tracing::warn!(table = %relation, dead, "{what}");
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    fn batch_failed(&mut self) {
        self.batch = halved(self.batch, self.shared.config.maintenance_batch);
    }

    fn batch_succeeded(&mut self) {
        self.batch = self.shared.config.maintenance_batch;
    }

    /// Whether this worker leads: confirms a held lock's connection is alive, or tries to take
    /// the lock on a dedicated connection.
    async fn ensure_leader(&mut self) -> Result<bool> {
        if self.leader {
            if let Some(conn) = self.conn.as_mut() {
                if sqlx::query(STILL_LEADING).execute(&mut *conn).await.is_ok() {
                    return Ok(true);
                }
            }
            tracing::warn!(worker = %self.shared.config.name, "the maintenance connection dropped; leadership is lost");
            self.leader = false;
            self.conn = None;
        }
        if self.conn.is_none() {
            let options = self
                .shared
                .sessions
                .connect_options(SessionRole::Maintenance);
            self.conn = Some(options.connect().await?);
        }
        let conn = self.conn.as_mut().expect("connected above");
        match sqlx::query_as::<_, (Option<bool>, Option<i32>)>(TRY_LEAD)
            .bind(&self.shared.config.table)
            .fetch_one(&mut *conn)
            .await
        {
            Ok((Some(true), key)) => {
                self.lock_key = key;
                self.leader = true;
                tracing::info!(worker = %self.shared.config.name, table = %self.shared.config.table, "this worker now runs maintenance");
                self.shared.hook.emit(|| WorkerEvent::MaintenanceLeader);
                Ok(true)
            }
            Ok((Some(false), _)) => Ok(false),
            Ok((None, _)) => Err(crate::error::Error::Config(format!(
                "the outbox table `{}` is not visible on the maintenance connection's search_path; \
                 create it, or point the pool's search_path at its schema",
                self.shared.config.table
            ))),
            Err(e) => {
                self.conn = None;
                Err(e.into())
            }
        }
    }

    async fn stop_leading(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            if let (true, Some(key)) = (self.leader, self.lock_key) {
                let _ = sqlx::query(STOP_LEADING).bind(key).execute(&mut conn).await;
            }
            let _ = conn.close().await;
        }
        self.leader = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_batch_is_halved_down_to_the_floor() {
        assert_eq!(halved(1000, 1000), 500);
        assert_eq!(halved(500, 1000), 250);
        assert_eq!(halved(15, 1000), MIN_BATCH);
        assert_eq!(halved(MIN_BATCH, 1000), MIN_BATCH);
        // A configured batch below the floor is its own floor.
        assert_eq!(halved(4, 4), 4);
    }
}

//! The worker's own database sessions: one small pool per role, each session named in
//! `pg_stat_activity` as `outbox-<role> <worker name>`, so an operator can tell a worker's
//! claims from its completions and from the service's own queries (which keep the pool the
//! service gave the worker, and its `application_name`).
//!
//! ```sql
//! SELECT application_name, state, wait_event_type, query
//! FROM pg_stat_activity WHERE application_name LIKE 'outbox-%';
//! ```
//!
//! Every pool is built from the service's pool: its connect options (host, credentials, TLS,
//! search_path) and pool options (timeouts, `after_connect`), with the role's size and no idle
//! minimum. The claimer's and the completer's first sessions open at start (`Sessions::warm`);
//! the rest are lazy: a role that never runs (maintenance off, a non-leader) opens no session
//! for its statements. They close when the worker stops.

use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;

use crate::held_session::derived_pool;

/// Sessions of the completer role at most: completion batches, and the failures and releases of
/// running deliveries, which can be written at once.
const COMPLETER_CONNECTIONS: u32 = 4;

/// PostgreSQL keeps the first 63 bytes of an `application_name`.
const MAX_APPLICATION_NAME: usize = 63;

/// What a worker session is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionRole {
    /// Claims batches of events (one session).
    Claimer,
    /// Writes outcomes: completions, failures, and claims handed back.
    Completer,
    /// Renews the leases of running deliveries (one session, so renewals never wait behind
    /// outcome writes).
    Renewer,
    /// LISTENs for enqueue notifications (one session).
    Listener,
    /// Maintenance: the leader's advisory lock and VACUUM on one session, recovery, purge and
    /// gauges on another.
    Maintenance,
}

impl SessionRole {
    /// Every role.
    pub const ALL: [SessionRole; 5] = [
        SessionRole::Claimer,
        SessionRole::Completer,
        SessionRole::Renewer,
        SessionRole::Listener,
        SessionRole::Maintenance,
    ];

    /// The role's name in `application_name`.
    pub fn name(self) -> &'static str {
        match self {
            SessionRole::Claimer => "claimer",
            SessionRole::Completer => "completer",
            SessionRole::Renewer => "renewer",
            SessionRole::Listener => "listener",
            SessionRole::Maintenance => "maintenance",
        }
    }
}

/// The `application_name` of the sessions of `role` in the worker named `worker`:
/// `outbox-<role> <worker>`, cut to the 63 bytes PostgreSQL keeps (at a character boundary).
pub fn application_name(role: SessionRole, worker: &str) -> String {
    let mut name = format!("outbox-{} {worker}", role.name());
    if name.len() > MAX_APPLICATION_NAME {
        let mut end = MAX_APPLICATION_NAME;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
    }
    name
}

/// The pools of one worker, one per role that runs statements through a store.
#[derive(Debug)]
pub(crate) struct Sessions {
    worker: String,
    connect: PgConnectOptions,
    pub(crate) claimer: PgPool,
    pub(crate) completer: PgPool,
    pub(crate) renewer: PgPool,
    pub(crate) maintenance: PgPool,
}

impl Sessions {
    /// Lazy pools for the worker `worker`, derived from the service's `pool`.
    pub(crate) fn open(pool: &PgPool, worker: &str) -> Sessions {
        let service_max = pool.options().get_max_connections().max(1);
        let lazy = |role: SessionRole, max: u32| -> PgPool {
            derived_pool(pool, &application_name(role, worker), max)
        };
        Sessions {
            worker: worker.to_owned(),
            claimer: lazy(SessionRole::Claimer, 1),
            completer: lazy(
                SessionRole::Completer,
                COMPLETER_CONNECTIONS.min(service_max),
            ),
            renewer: lazy(SessionRole::Renewer, 1),
            maintenance: lazy(SessionRole::Maintenance, 1),
            connect: pool.connect_options().as_ref().clone(),
        }
    }

    /// Open the first session of the claimer and of the completer, concurrently, and keep them
    /// in their pools: the first claim and the first completion then do not wait for a
    /// connection. Opening a session is a full connection, with a TLS handshake where the
    /// server offers TLS (about 90 ms each on this machine's loopback, `docs/benchmarks.md`);
    /// opened one after the other, as the first claim and the first completion needed them,
    /// two of those stood in front of the first delivered event.
    pub(crate) async fn warm(&self) -> crate::error::Result<()> {
        let (claimer, completer) = tokio::join!(self.claimer.acquire(), self.completer.acquire());
        drop(claimer?);
        drop(completer?);
        Ok(())
    }

    /// Connect options for a session of `role` opened outside these pools (the LISTEN session,
    /// the maintenance leader's lock).
    pub(crate) fn connect_options(&self, role: SessionRole) -> PgConnectOptions {
        self.connect
            .clone()
            .application_name(&application_name(role, &self.worker))
    }

    /// Close every pool (when the worker has stopped).
    pub(crate) async fn close(&self) {
        self.claimer.close().await;
        self.completer.close().await;
        self.renewer.close().await;
        self.maintenance.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_say_role_and_worker_and_fit_postgres() {
        assert_eq!(
            application_name(SessionRole::Claimer, "w1"),
            "outbox-claimer w1"
        );
        let long = "é".repeat(60);
        let name = application_name(SessionRole::Maintenance, &long);
        assert!(name.len() <= MAX_APPLICATION_NAME, "{}", name.len());
        assert!(name.starts_with("outbox-maintenance "));
        // Byte 63 falls inside a character here: the name is cut before that character.
        let odd = format!("a{long}");
        let name = application_name(SessionRole::Maintenance, &odd);
        assert_eq!(name.len(), MAX_APPLICATION_NAME - 1);
        assert!(name.ends_with('é'));
    }
}

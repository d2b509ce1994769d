//! The sessions the outbox's own parts run on: a pool derived from the service's
//! ([`derived_pool`]: the worker's roles and the waker), and a session held from one statement
//! to the next ([`HeldSession`]), for the parts that run one statement at a time: the worker's
//! claimer and completer, and the waker.
//!
//! Every checkout of a pooled connection costs round trips the statement waits for: the pool
//! checks an idle connection with a ping before handing it out, and pings it again when it
//! comes back (and the next checkout of that connection waits for that ping). Kept, a session
//! runs a claim, a completion batch or a wake-up in one round trip. For an idle queue the
//! claim's round trip and the wake-up's are most of the wake-up latency.
//!
//! A session that failed is closed, not kept or put back: the next checkout takes a fresh one
//! from the pool, which checks it. A held session the server ended while the part was idle (a
//! restart, `pg_terminate_backend`, an idle timeout) is found out by the statement sent on it,
//! so the caller retries at once when [`HeldSession::check_in`] says the failure may be that.
//!
//! A kept session is handed back to the pool once it has been kept for the pool's
//! `max_lifetime` (sqlx's default 30 minutes; none kept for ever), at its next check-in: the
//! pool then closes it if it is past that age, as for any connection, and the next statement
//! checks one out afresh. A service that rotates its connections keeps doing so.

use std::time::{Duration, Instant};

use sqlx::PgPool;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPoolOptions, Postgres};

/// A lazy pool of at most `max` sessions named `application_name` in `pg_stat_activity`, built
/// from the service's `pool`: its connect options (host, credentials, TLS, `search_path`) and
/// pool options (timeouts, `after_connect`), without an idle minimum. Nothing is connected until
/// a statement needs it.
pub(crate) fn derived_pool(pool: &PgPool, application_name: &str, max: u32) -> PgPool {
    let named = pool
        .connect_options()
        .as_ref()
        .clone()
        .application_name(application_name);
    let options: PgPoolOptions = pool
        .options()
        .clone()
        .min_connections(0)
        .max_connections(max);
    options.connect_lazy_with(named)
}

/// The session one part keeps (see the module documentation).
pub(crate) struct HeldSession {
    pool: PgPool,
    held: Option<PoolConnection<Postgres>>,
    /// Keep the session between statements. Off where the part shares a pool of one
    /// connection with others, which must not wait for a session it never gives back.
    hold: bool,
    /// When the session in use was checked out of the pool.
    checked_out_at: Instant,
    /// The pool's `max_lifetime`: how long a session is kept before it goes back to the pool.
    keep_for: Option<Duration>,
}

/// A session checked out of a [`HeldSession`] for one statement.
pub(crate) struct Checkout {
    pub(crate) session: PoolConnection<Postgres>,
    /// The session was kept from an earlier statement, so it was not checked since: a failure
    /// on it may be a session that died while idle, and is worth one immediate retry.
    was_held: bool,
}

impl HeldSession {
    /// Sessions from `pool`, kept between statements when `hold` is true.
    pub(crate) fn new(pool: PgPool, hold: bool) -> HeldSession {
        let keep_for = pool.options().get_max_lifetime();
        HeldSession {
            pool,
            held: None,
            hold,
            checked_out_at: Instant::now(),
            keep_for,
        }
    }

    /// The held session, or one checked out of the pool.
    pub(crate) async fn checkout(&mut self) -> sqlx::Result<Checkout> {
        if let Some(session) = self.held.take() {
            return Ok(Checkout {
                session,
                was_held: true,
            });
        }
        let session = self.pool.acquire().await?;
        self.checked_out_at = Instant::now();
        Ok(Checkout {
            session,
            was_held: false,
        })
    }

    /// Take the session back after its statement ended with `result`: kept when the statement
    /// succeeded (and this part holds its session, and has not kept it for the pool's
    /// `max_lifetime` yet), closed when it failed (its state is unknown), else returned to the
    /// pool. True when the statement is worth sending again at once, on a fresh session: it
    /// failed on a session kept from an earlier statement, which may have died while idle.
    pub(crate) fn check_in<T, E>(&mut self, checkout: Checkout, result: &Result<T, E>) -> bool {
        let mut session = checkout.session;
        let kept_long_enough = self
            .keep_for
            .is_some_and(|keep_for| self.checked_out_at.elapsed() >= keep_for);
        if result.is_err() {
            session.close_on_drop();
            return checkout.was_held;
        }
        if self.hold && !kept_long_enough {
            self.held = Some(session);
        }
        false
    }
}

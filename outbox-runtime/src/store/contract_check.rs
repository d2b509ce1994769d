//! The enqueue-side contract check: a binary whose event changed shape without a version bump
//! refuses to write it, before the first row, rather than leave the worker to refuse it later.
//!
//! The first enqueue of an event type in a process reads the fingerprint the database's contract
//! registry (`outbox_contracts`) holds for the type's (name, version) and compares it with the
//! compiled one. Once they agree, the verdict is kept for the life of the process: later
//! enqueues of the type cost one lookup in a process-wide map and no statement. A version the
//! registry does not hold yet (a service without generated migrations, or a rolling deploy
//! before its migration ran) is allowed, like the worker's start-up check allows it, and
//! looked up again after [`RECHECK_UNREGISTERED`], so a migration applied later is noticed.
//! A mismatch is never cached: every enqueue of the drifted type is refused.
//!
//! The lookup runs in a savepoint of the caller's transaction, so a registry the role cannot
//! read, or a missing one, is an error that leaves the transaction usable.
//!
//! The verdict is per process and event type, not per database: a process that enqueues the
//! same type into several databases is checked against the first one (the worker checks every
//! database it starts on).

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};
use std::time::{Duration, Instant};

use sqlx::{Acquire, Postgres, Transaction};

use crate::contract::shown;
use crate::error::{Error, Result};
use crate::event::Event;

/// The registry row of one (name, version), if any.
const REGISTERED_CONTRACT: &str = include_str!("sql/registered_contract.sql");

/// How long a "not registered yet" verdict is trusted before the registry is read again.
pub const RECHECK_UNREGISTERED: Duration = Duration::from_secs(60);

/// What the registry said about one event type.
#[derive(Debug, Clone, Copy)]
enum Verdict {
    /// Registered with the compiled fingerprint: never read again in this process.
    Agrees,
    /// Not registered when last read.
    Unregistered { read_at: Instant },
}

fn verdicts() -> &'static RwLock<HashMap<TypeId, Verdict>> {
    static VERDICTS: OnceLock<RwLock<HashMap<TypeId, Verdict>>> = OnceLock::new();
    VERDICTS.get_or_init(|| RwLock::new(HashMap::new()))
}

/// Whether a kept verdict lets `E` be enqueued without reading the registry.
fn trusted<E: Event>() -> bool {
    let map = verdicts()
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    map.get(&TypeId::of::<E>())
        .is_some_and(|verdict| verdict.still_trusted_at(Instant::now()))
}

impl Verdict {
    /// Whether this verdict still stands at `now`: an agreement always, a "not registered"
    /// for [`RECHECK_UNREGISTERED`] after the read that gave it.
    fn still_trusted_at(self, now: Instant) -> bool {
        match self {
            Verdict::Agrees => true,
            Verdict::Unregistered { read_at } => {
                now.saturating_duration_since(read_at) < RECHECK_UNREGISTERED
            }
        }
    }
}

fn keep<E: Event>(verdict: Verdict) {
    verdicts()
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(TypeId::of::<E>(), verdict);
}

/// Refuse to enqueue `E` when the registry holds its (name, version) with another fingerprint.
/// Nothing is written either way, and `tx` stays usable.
pub(crate) async fn check_before_enqueue<E: Event>(
    tx: &mut Transaction<'_, Postgres>,
) -> Result<()> {
    if trusted::<E>() {
        return Ok(());
    }
    let version = i32::try_from(E::VERSION).map_err(|_| {
        Error::Config(format!(
            "event `{}` version {} does not fit an int",
            E::NAME,
            E::VERSION
        ))
    })?;
    let mut savepoint = tx.begin().await?;
    let row: std::result::Result<Option<(String, String)>, sqlx::Error> =
        sqlx::query_as(REGISTERED_CONTRACT)
            .bind(E::NAME)
            .bind(version)
            .fetch_optional(&mut *savepoint)
            .await;
    let row = match row {
        Ok(row) => {
            savepoint.commit().await?;
            row
        }
        // Dropping the savepoint rolls back to it: the caller's transaction stays usable.
        Err(e) => return Err(unreadable_registry(e)),
    };
    let Some((registered, registered_type)) = row else {
        keep::<E>(Verdict::Unregistered {
            read_at: Instant::now(),
        });
        return Ok(());
    };
    let contract = E::contract();
    let compiled = contract.fingerprint();
    if registered == compiled {
        keep::<E>(Verdict::Agrees);
        return Ok(());
    }
    Err(Error::ContractMismatch(format!(
        "refusing to enqueue event `{}` version {}: the database's contract registry holds it with fingerprint {} \
         (type `{}`), but this binary compiles it with fingerprint {} (type `{}`). The payload changed shape without \
         a version bump, or this binary does not match the migrations applied to the database. Nothing was written \
         and the transaction is still usable. Run `outbox migrations check` in the service's repository to see the \
         changed fields, then bump the version (`#[outbox(version = {})]`), keep the old type as the old version with \
         an upcast, generate and apply the migration",
        E::NAME,
        E::VERSION,
        shown(&registered),
        shown(&registered_type),
        compiled,
        contract.type_name,
        u64::from(E::VERSION) + 1,
    )))
}

/// The registry could not be read: say why and what to do.
fn unreadable_registry(error: sqlx::Error) -> Error {
    let code = error
        .as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned());
    match code.as_deref() {
        Some("42P01") => Error::ContractMismatch(
            "the contract registry table `outbox_contracts` does not exist, so the event's contract cannot be checked \
             before enqueueing: apply the base schema first (`outbox_runtime::migrate(&pool)` or `outbox migrate`)"
                .to_owned(),
        ),
        Some("42501") => Error::ContractMismatch(
            "this role may not read the contract registry `outbox_contracts`, which enqueue reads once per event type \
             to refuse a drifted payload: grant it with `outbox grants --enqueuer <role> --worker <role>` \
             (GRANT SELECT (event_type, event_version, fingerprint, type_name) ON outbox_contracts TO <role>)"
                .to_owned(),
        ),
        _ => Error::Database(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_not_registered_verdict_is_trusted_until_the_recheck_interval_has_passed() {
        let read_at = Instant::now();
        let unregistered = Verdict::Unregistered { read_at };
        assert!(unregistered.still_trusted_at(read_at));
        let just_before = read_at + RECHECK_UNREGISTERED - Duration::from_millis(1);
        assert!(unregistered.still_trusted_at(just_before));
        assert!(!unregistered.still_trusted_at(read_at + RECHECK_UNREGISTERED));
        assert!(!unregistered.still_trusted_at(read_at + RECHECK_UNREGISTERED * 10));
    }

    #[test]
    fn an_agreeing_verdict_is_trusted_for_the_life_of_the_process() {
        let now = Instant::now();
        assert!(Verdict::Agrees.still_trusted_at(now));
        assert!(Verdict::Agrees.still_trusted_at(now + Duration::from_secs(86_400 * 365)));
    }
}

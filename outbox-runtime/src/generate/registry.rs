//! The start-up check: does the database's contract registry agree with the compiled contracts?
//!
//! Decisions (documented in the README):
//! - A registered (name, version) whose fingerprint differs from the compiled one refuses the
//!   start: rows of that version may have been written in the other shape, and decoding them
//!   with this binary's type would misread them.
//! - A compiled version with no registry row is allowed and logged: the service does not use
//!   generated migrations (tests, a quickstart), or its newest migration has not been applied
//!   yet during a rolling deploy. Nothing stored can disagree with a version nobody registered.
//! - A registered version this binary does not compile is logged: it was removed (rows may
//!   still hold it), or a newer binary registered it during a rolling deploy.

use sqlx::PgPool;

use crate::contract::{Contract, shown};
use crate::error::{Error, Result};

/// Every row of the registry.
const REGISTRY_ROWS: &str = include_str!("sql/registry_rows.sql");

/// One row of `outbox_contracts`.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct RegistryRow {
    /// Event name.
    pub event_type: String,
    /// Event version.
    pub event_version: i32,
    /// SHA-256 of the registered shape.
    pub fingerprint: String,
    /// The Rust type that registered it.
    pub type_name: String,
}

/// A (name, version) the database and the binary disagree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FingerprintMismatch {
    /// Event name.
    pub name: String,
    /// Event version.
    pub version: u32,
    /// Fingerprint in the database.
    pub registered: String,
    /// Type that registered it.
    pub registered_type: String,
    /// Fingerprint of the compiled shape.
    pub compiled: String,
    /// The compiled type.
    pub compiled_type: String,
}

/// The comparison of the registry with the compiled contracts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistryComparison {
    /// Versions registered with another fingerprint: the worker must not start.
    pub mismatched: Vec<FingerprintMismatch>,
    /// Compiled versions without a registry row.
    pub unregistered: Vec<(String, u32)>,
    /// Registered versions this binary does not compile.
    pub not_compiled: Vec<(String, u32)>,
}

impl RegistryComparison {
    /// The refusal, when there is one.
    pub fn into_result(self) -> Result<()> {
        if self.mismatched.is_empty() {
            return Ok(());
        }
        let lines: Vec<String> = self
            .mismatched
            .iter()
            .map(|m| {
                format!(
                    "event `{}` version {} is registered in the database with fingerprint {} (type `{}`), but this \
                     binary compiles it with fingerprint {} (type `{}`)",
                    shown(&m.name),
                    m.version,
                    shown(&m.registered),
                    shown(&m.registered_type),
                    m.compiled,
                    shown(&m.compiled_type)
                )
            })
            .collect();
        Err(Error::ContractMismatch(format!(
            "{}. A payload shape changed without a version bump, or this binary does not match the migrations applied \
             to the database. Refusing to start rather than misread stored events: run `outbox migrations check` in \
             the service's repository to see the changed fields, bump the version, add an upcast, generate and apply \
             the migration",
            lines.join("; ")
        )))
    }
}

/// Compare registry rows with compiled contracts (pure; the database part is
/// [`verify_database_contracts`]).
pub fn compare_registry(compiled: &[Contract], rows: &[RegistryRow]) -> RegistryComparison {
    let mut out = RegistryComparison::default();
    for contract in compiled {
        let row = rows.iter().find(|r| {
            r.event_type == contract.name
                && i64::from(r.event_version) == i64::from(contract.version)
        });
        match row {
            None => out
                .unregistered
                .push((contract.name.to_owned(), contract.version)),
            Some(row) => {
                let fingerprint = contract.fingerprint();
                if row.fingerprint != fingerprint {
                    out.mismatched.push(FingerprintMismatch {
                        name: contract.name.to_owned(),
                        version: contract.version,
                        registered: row.fingerprint.clone(),
                        registered_type: row.type_name.clone(),
                        compiled: fingerprint,
                        compiled_type: contract.type_name.to_owned(),
                    });
                }
            }
        }
    }
    for row in rows {
        let known = compiled.iter().any(|c| {
            c.name == row.event_type && i64::from(c.version) == i64::from(row.event_version)
        });
        if !known {
            out.not_compiled.push((
                row.event_type.clone(),
                u32::try_from(row.event_version).unwrap_or(0),
            ));
        }
    }
    out
}

/// Read the registry rows.
pub async fn registry_rows(pool: &PgPool) -> Result<Vec<RegistryRow>> {
    sqlx::query_as::<_, RegistryRow>(REGISTRY_ROWS).fetch_all(pool).await.map_err(|e| {
        let missing_table = e.as_database_error().and_then(|d| d.code()).is_some_and(|code| code == "42P01");
        if missing_table {
            Error::ContractMismatch(
                "the contract registry table `outbox_contracts` does not exist: apply the base schema first \
                 (`outbox migrate`, or `outbox_runtime::migrate(&pool)`)"
                    .to_owned(),
            )
        } else {
            Error::Database(e)
        }
    })
}

/// Every row the generator writes has a valid name (`plan` refuses others); a row that does not
/// was written by hand, and its name is not repeated into a log line or a message unescaped.
fn refuse_invalid_rows(rows: &[RegistryRow]) -> Result<()> {
    for row in rows {
        if let Err(e) = crate::contract::validate_event_name(&row.event_type) {
            return Err(Error::ContractMismatch(format!(
                "the contract registry (outbox_contracts) holds version {} of an event whose name cannot be used: {e}. \
                 `outbox migrations generate` never writes such a row: delete it from outbox_contracts",
                row.event_version
            )));
        }
    }
    Ok(())
}

/// Refuse to start when the database's contract registry disagrees with `compiled`.
pub async fn verify_contracts(pool: &PgPool, compiled: &[Contract]) -> Result<RegistryComparison> {
    let rows = registry_rows(pool).await?;
    refuse_invalid_rows(&rows)?;
    let comparison = compare_registry(compiled, &rows);
    if !comparison.mismatched.is_empty() {
        comparison.clone().into_result()?;
    }
    if !comparison.unregistered.is_empty() {
        let names: Vec<String> = comparison
            .unregistered
            .iter()
            .map(|(n, v)| format!("{} v{v}", shown(n)))
            .collect();
        tracing::info!(
            contracts = %names.join(", "),
            "compiled event contracts are not in the database's contract registry (no generated migration applied for them yet)"
        );
    }
    if !comparison.not_compiled.is_empty() {
        let names: Vec<String> = comparison
            .not_compiled
            .iter()
            .map(|(n, v)| format!("{} v{v}", shown(n)))
            .collect();
        tracing::warn!(
            contracts = %names.join(", "),
            "the contract registry holds event versions this binary does not compile; stored rows of those versions cannot be decoded here"
        );
    }
    Ok(comparison)
}

/// Refuse to start when the database's contract registry disagrees with the contracts compiled
/// into this binary (every `#[derive(Event)]` linked in). Called by the worker at start-up.
///
/// A registered (name, version) with another fingerprint is an error
/// ([`Error::ContractMismatch`]) naming the event, the version and both types. A compiled
/// version missing from the registry is allowed (logged at info level): see the module docs.
pub async fn verify_database_contracts(pool: &PgPool) -> Result<()> {
    let compiled: Vec<Contract> = crate::contract::registered_events()
        .iter()
        .map(|r| (r.contract)())
        .collect();
    verify_contracts(pool, &compiled).await.map(|_| ())
}

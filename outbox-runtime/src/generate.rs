//! Migrations and the contract lock, generated from the event definitions.
//!
//! The events linked into a service (every `#[derive(Event)]`, collected by `inventory`) are the
//! source of truth for the database objects they need and for their contract history:
//!
//! - [`generate_migrations`] writes ONE new migration into the service's migrations folder when
//!   the events declare something the folder does not have yet: the outbox tables they name
//!   (other than the base `outbox` table) and a row per (name, version) in the contract registry
//!   (`outbox_contracts`, from the base schema). It updates the contract lock ([`LOCK_FILE`])
//!   next to the migrations. With nothing changed it writes nothing. The tables earlier
//!   generated migrations created in the one-table layout (a lock of format 1) are upgraded to
//!   the split layout by the first migration it writes, once ([`LOCK_FORMAT`]).
//! - [`check_migrations`] is the same computation without writing: CI fails when the folder is
//!   stale (like `sqlx prepare --check`).
//! - A payload shape changed under an unchanged version fails both, naming the event, the
//!   version and each changed field ([`GenerateError::ShapeChanged`]).
//! - [`verify_database_contracts`] is the worker's start-up check against the database.
//! - [`grants_sql`] writes least-privilege grants for an enqueuer and a worker role.
//!
//! The core ([`plan`]) is a pure function over contracts and the folder's contents; this module
//! adds the file system.
//!
//! What the generated files embed, and how (the migration is executed by `outbox migrate`):
//! event names and tables, from the events or read back from the lock, are refused unless they
//! follow their rules ([`crate::contract::EVENT_NAME_RULE`], [`crate::store::validate_table_name`]);
//! the Rust type name and the shape are free text, written in comments with every line break,
//! direction override and `*/` escaped, and in literals that mean the same text under either
//! setting of `standard_conforming_strings` (an escape string, or a dollar quote whose tag the
//! text cannot close). The lock is JSON, escaped by its serializer.

mod error;
mod grants;
mod lock;
mod plan;
mod registry;
mod render;
mod shape_diff;

use std::path::Path;

pub use error::{GenerateError, ShapeDrift};
pub use grants::{grants_sql, inbox_grants_sql, upgrade_grants_sql};
pub use lock::{ContractLock, LOCK_FILE, LOCK_FORMAT, LockedContract, LockedMigration};
pub use plan::{CompiledEvent, FolderSnapshot, NewMigration, Plan, RemovedContract, plan};
pub use registry::{
    FingerprintMismatch, RegistryComparison, RegistryRow, compare_registry, registry_rows,
    verify_contracts, verify_database_contracts,
};
pub use shape_diff::{ShapeChange, diff_shapes};

/// Every event version linked into this binary, as the generator sees them.
pub fn compiled_events() -> Vec<CompiledEvent> {
    crate::contract::registered_events()
        .into_iter()
        .map(CompiledEvent::from_registration)
        .collect()
}

/// What [`generate_migrations`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOutcome {
    /// The migration written, if any.
    pub written_migration: Option<String>,
    /// Whether the lock was (re)written.
    pub lock_written: bool,
    /// Versions the lock knows that are no longer compiled.
    pub removed: Vec<RemovedContract>,
}

/// What [`check_migrations`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckOutcome {
    /// Why the folder is stale; empty when it is up to date.
    pub stale: Vec<String>,
    /// Versions the lock knows that are no longer compiled (a warning, not a failure, once
    /// the lock records them as removed).
    pub removed: Vec<RemovedContract>,
}

impl CheckOutcome {
    /// Whether the folder matches the events.
    pub fn is_up_to_date(&self) -> bool {
        self.stale.is_empty()
    }
}

/// Read the migrations folder (`.sql` files and the lock; a missing folder reads as empty).
pub fn read_folder(dir: &Path) -> Result<FolderSnapshot, GenerateError> {
    let io = |source| GenerateError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut snapshot = FolderSnapshot::default();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(snapshot),
        Err(e) => return Err(io(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if !path.is_file() || !(name.ends_with(".sql") || name == LOCK_FILE) {
            continue;
        }
        let text =
            std::fs::read_to_string(&path).map_err(|source| GenerateError::Io { path, source })?;
        snapshot.files.insert(name, text);
    }
    Ok(snapshot)
}

/// Bring `dir` up to date with `events`: write the new migration (if any) and the lock (if it
/// changed). Creates `dir` when missing.
pub fn generate_migrations(
    dir: &Path,
    events: &[CompiledEvent],
) -> Result<GenerateOutcome, GenerateError> {
    let plan = plan(events, &read_folder(dir)?)?;
    if !plan.is_up_to_date() {
        std::fs::create_dir_all(dir).map_err(|source| GenerateError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|source| GenerateError::Io { path, source })
    };
    if let Some(migration) = &plan.migration {
        write(&migration.file_name, &migration.sql)?;
    }
    if plan.lock_changed {
        write(LOCK_FILE, &plan.lock_text)?;
    }
    Ok(GenerateOutcome {
        written_migration: plan.migration.map(|m| m.file_name),
        lock_written: plan.lock_changed,
        removed: plan.removed,
    })
}

/// Whether `dir` is what [`generate_migrations`] would leave; writes nothing.
pub fn check_migrations(
    dir: &Path,
    events: &[CompiledEvent],
) -> Result<CheckOutcome, GenerateError> {
    let plan = plan(events, &read_folder(dir)?)?;
    let mut stale = Vec::new();
    if let Some(migration) = &plan.migration {
        let summary: Vec<&str> = migration
            .sql
            .lines()
            .filter(|l| {
                ["-- Upgrades", "-- Creates", "-- Registers"]
                    .iter()
                    .any(|summary| l.starts_with(summary))
            })
            .collect();
        stale.push(format!(
            "a new migration {} is needed ({})",
            migration.file_name,
            summary
                .iter()
                .map(|l| l.trim_start_matches("-- "))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    if plan.lock_changed {
        stale.push(format!("{LOCK_FILE} is out of date"));
    }
    Ok(CheckOutcome {
        stale,
        removed: plan.removed,
    })
}

//! What can stop the generator, each saying what to do about it.

use std::fmt;
use std::path::PathBuf;

use super::shape_diff::ShapeChange;

/// A compiled contract whose shape differs from the one the lock recorded for its version.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeDrift {
    /// Event name.
    pub name: String,
    /// The version whose shape changed.
    pub version: u32,
    /// The compiled Rust type.
    pub type_name: String,
    /// Fingerprint in the lock.
    pub locked_fingerprint: String,
    /// Fingerprint of the compiled shape.
    pub compiled_fingerprint: String,
    /// The fields that changed.
    pub changes: Vec<ShapeChange>,
    /// Whether the lock had already marked this version removed (its number is being reused).
    pub was_removed: bool,
}

impl fmt::Display for ShapeDrift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reuse = if self.was_removed {
            " (a removed version, reused)"
        } else {
            ""
        };
        writeln!(
            f,
            "event `{}` version {}{reuse} changed shape without a version bump ({}):",
            self.name, self.version, self.type_name
        )?;
        for change in &self.changes {
            writeln!(f, "  - {change}")?;
        }
        write!(
            f,
            "  The lock records fingerprint {} for version {}, the compiled type has {}. Rows already stored as \
             version {} have the old shape. Bump the version (`#[outbox(version = {})]`), keep the old type as \
             version {} with an upcast (`impl From<Old> for New`), then run `outbox migrations generate`.",
            short(&self.locked_fingerprint),
            self.version,
            short(&self.compiled_fingerprint),
            self.version,
            self.version + 1,
            self.version
        )
    }
}

fn short(fingerprint: &str) -> &str {
    fingerprint.get(..12).unwrap_or(fingerprint)
}

/// Errors of `outbox migrations generate` and `outbox migrations check`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenerateError {
    /// One or more contracts changed shape under an unchanged version.
    #[error("contract drift:\n{}", drifts.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    ShapeChanged {
        /// Every drifted contract.
        drifts: Vec<ShapeDrift>,
    },
    /// Two compiled types declare the same (name, version).
    #[error(
        "event `{name}` version {version} is defined twice, by `{first}` and by `{second}`; \
         give one of them another name or version"
    )]
    DuplicateContract {
        /// Event name.
        name: String,
        /// Event version.
        version: u32,
        /// One type.
        first: String,
        /// The other type.
        second: String,
    },
    /// An event's name is outside the event name rule ([`crate::contract::EVENT_NAME_RULE`]).
    #[error(
        "the type `{type_name}` declares event version {version} under a name that cannot be used: {reason}; \
         rename the event (`#[outbox(name = \"...\")]`)"
    )]
    InvalidEventName {
        /// The Rust type, escaped and cut short for the message.
        type_name: String,
        /// The version it declares.
        version: u32,
        /// What is wrong with the name (the name itself, escaped, and the rule).
        reason: String,
    },
    /// A Rust type name the database cannot store (PostgreSQL text holds no NUL character).
    #[error(
        "the type name `{type_name}` contains a NUL character, which PostgreSQL cannot store; use the type's path"
    )]
    InvalidTypeName {
        /// The type name, escaped and cut short for the message.
        type_name: String,
    },
    /// An event names an outbox table that is not a safe identifier.
    #[error("event `{event}` names the outbox table `{table}`, which cannot be used: {reason}")]
    InvalidTable {
        /// Event name.
        event: String,
        /// The table name.
        table: String,
        /// Why.
        reason: String,
    },
    /// A table an earlier generator created in the one-table layout cannot be upgraded to the
    /// split layout under its name (too long for the queue table's index names).
    #[error(
        "{table} was created by an earlier `outbox migrations generate` in the one-table layout, and the \
         migration that upgrades it to the split layout cannot be written: {reason}. Rename it first: in a \
         migration of your own, `ALTER TABLE {table} RENAME TO <shorter name>`; point its events at the new \
         name (`#[outbox(table = \"...\")]`), replace the name in the \"tables\" list of outbox.lock, then \
         generate again"
    )]
    TableNotUpgradable {
        /// The table, as the lock lists it (a valid table name).
        table: String,
        /// Why.
        reason: String,
    },
    /// A migration the lock lists was edited or deleted.
    #[error(
        "{file} was written by the generator and is listed in {lock} with another checksum{what}; \
         generated migrations are applied history: restore the file from version control \
         (to change a contract, bump its version and generate a new migration)",
        what = if *missing { " but is missing" } else { ", but it was edited" }
    )]
    GeneratedMigrationChanged {
        /// The migration file.
        file: String,
        /// The lock file.
        lock: String,
        /// Whether the file is gone (otherwise edited).
        missing: bool,
    },
    /// The lock file cannot be read.
    #[error(
        "{path} is not a contract lock this version understands: {reason}; restore it from version control"
    )]
    LockUnreadable {
        /// The lock file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A migrations folder or file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

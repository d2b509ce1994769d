//! The generator's core, a pure function: compiled contracts + the migrations folder as it is
//! -> what the folder should contain. No file system, no database, no clock, so it is tested
//! with contracts built by hand.

use std::collections::{BTreeMap, BTreeSet};

use sha2::Digest;

use super::error::{GenerateError, ShapeDrift};
use super::lock::{
    ContractLock, LOCK_FILE, LOCK_FORMAT, LockedContract, LockedMigration, ONE_TABLE_LAYOUT_FORMAT,
    QUEUE_INVARIANTS_FORMAT,
};
use super::render::{MigrationContent, TableUpgrade, UpgradeStep, migration_sql};
use super::shape_diff::diff_shapes;
use crate::contract::{Contract, EventRegistration, shown};
use crate::store::{
    DEFAULT_TABLE, create_table_sql, upgrade_queue_invariants_sql, upgrade_split_layout_sql,
};

/// One compiled event version, as the generator sees it: its contract and its outbox table.
#[derive(Debug, Clone, PartialEq)]
pub struct CompiledEvent {
    /// The contract (name, version, type, shape).
    pub contract: Contract,
    /// The outbox table the version is written to.
    pub table: String,
}

impl CompiledEvent {
    /// The generator's view of a registration submitted by `#[derive(Event)]`.
    pub fn from_registration(registration: &EventRegistration) -> CompiledEvent {
        CompiledEvent {
            contract: (registration.contract)(),
            table: registration.table.to_owned(),
        }
    }
}

/// The migrations folder as read from disk.
#[derive(Debug, Clone, Default)]
pub struct FolderSnapshot {
    /// Every file name in the folder with its contents (only `.sql` files and the lock matter).
    pub files: BTreeMap<String, String>,
}

/// A migration file the generator wants to add.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMigration {
    /// `<version>_<description>.sql`, the naming sqlx's migrator reads.
    pub file_name: String,
    /// The SQL.
    pub sql: String,
}

/// A version the lock knows but no compiled type defines any more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedContract {
    /// Event name.
    pub name: String,
    /// Event version.
    pub version: u32,
    /// The table its rows were written to.
    pub table: String,
    /// Whether this run is the one that noticed (the lock still said compiled).
    pub newly_removed: bool,
}

impl RemovedContract {
    /// A warning for people: what it means and how to find rows that still hold the version.
    pub fn warning(&self) -> String {
        format!(
            "event `{}` version {} is in {LOCK_FILE} but no compiled type defines it any more; rows stored as that \
             version cannot be decoded by this binary. Keep the type (with its upcast) until none is left: \
             SELECT count(*) FROM {} WHERE event_type = {} AND event_version = {};",
            self.name,
            self.version,
            self.table,
            super::render::string_literal(&self.name),
            self.version
        )
    }
}

/// What the migrations folder should contain.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The migration to add, when the events declare something the folder does not yet have.
    pub migration: Option<NewMigration>,
    /// The lock text the folder should hold.
    pub lock_text: String,
    /// Whether that text differs from the lock on disk (or there is none).
    pub lock_changed: bool,
    /// Versions in the lock that are no longer compiled.
    pub removed: Vec<RemovedContract>,
}

impl Plan {
    /// Whether the folder is already what the events say (nothing to write).
    pub fn is_up_to_date(&self) -> bool {
        self.migration.is_none() && !self.lock_changed
    }
}

/// A contract as it goes into a migration and the lock.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PlannedContract {
    pub name: String,
    pub version: u32,
    pub type_name: String,
    pub table: String,
    pub fingerprint: String,
    pub shape: serde_json::Value,
}

impl PlannedContract {
    pub(crate) fn label(&self) -> String {
        format!("{} v{}", self.name, self.version)
    }

    pub(crate) fn pretty_shape(&self) -> String {
        serde_json::to_string_pretty(&self.shape).expect("a JSON value always serializes")
    }

    fn locked(&self) -> LockedContract {
        LockedContract {
            name: self.name.clone(),
            version: self.version,
            type_name: self.type_name.clone(),
            table: self.table.clone(),
            fingerprint: self.fingerprint.clone(),
            compiled: true,
            shape: self.shape.clone(),
        }
    }
}

/// The description part of generated migration file names.
const MIGRATION_DESCRIPTION: &str = "outbox_events";

/// Work out what the folder should contain for `events`.
///
/// Tables the lock lists were created by earlier generated migrations. A lock of format 1 lists
/// them in the one-table layout: the new migration upgrades each of them to the split layout
/// (`store::upgrade_split_layout_sql`); a lock of format 1 or 2 lists them without the queue
/// invariants, which the new migration adds (`store::upgrade_queue_invariants_sql`). Every table
/// is upgraded whether or not an event still names it (its rows are still there, and so are its
/// workers' statements), and the lock takes the current format, so no later run upgrades them
/// again.
///
/// Fails when a contract changed shape under the same version (naming every changed field),
/// when two types declare one (name, version), when an event names an unusable table, when a
/// table the lock lists cannot be upgraded, or when a migration the lock lists was edited or
/// deleted.
pub fn plan(events: &[CompiledEvent], folder: &FolderSnapshot) -> Result<Plan, GenerateError> {
    let compiled = compile(events)?;
    let existing_lock_text = folder.files.get(LOCK_FILE);
    let lock = match existing_lock_text {
        Some(text) => read_lock(text)?,
        None => ContractLock::default(),
    };
    verify_locked_migrations(&lock, folder)?;

    // Shape changes under an unchanged version: collect them all, so one run names every one.
    let drifts: Vec<ShapeDrift> = compiled
        .values()
        .filter_map(|c| {
            let locked = lock.contract(&c.name, c.version)?;
            (locked.fingerprint != c.fingerprint).then(|| ShapeDrift {
                name: c.name.clone(),
                version: c.version,
                type_name: shown(&c.type_name),
                locked_fingerprint: locked.fingerprint.clone(),
                compiled_fingerprint: c.fingerprint.clone(),
                changes: diff_shapes(&locked.shape, &c.shape),
                was_removed: !locked.compiled,
            })
        })
        .collect();
    if !drifts.is_empty() {
        return Err(GenerateError::ShapeChanged { drifts });
    }

    // Contracts the registry must (re)receive: new ones, and known ones whose table changed or
    // that come back after being removed. The Rust type name is not part of the contract: it
    // differs between binaries that include the same event file (`module_path!` names the
    // crate) and changes on a rename, neither of which changes a stored row. The lock keeps
    // the name of the type that registered the version.
    let to_register: Vec<&PlannedContract> = compiled
        .values()
        .filter(|c| match lock.contract(&c.name, c.version) {
            None => true,
            Some(l) => !l.compiled || l.table != c.table,
        })
        .collect();

    // Tables: every one an event names except the base table, which the base schema creates.
    let mut writers: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for c in compiled.values().filter(|c| c.table != DEFAULT_TABLE) {
        writers.entry(&c.table).or_default().push(c.label());
    }
    let locked_tables: BTreeSet<&str> = lock.tables.iter().map(String::as_str).collect();
    // Each table the lock lists takes, once, every upgrade its format has not had yet, in order.
    let mut upgrades = Vec::new();
    for table in &locked_tables {
        let not_upgradable = |e: crate::error::Error| GenerateError::TableNotUpgradable {
            table: (*table).to_owned(),
            reason: e.to_string(),
        };
        if lock.format == ONE_TABLE_LAYOUT_FORMAT {
            let upgrade = upgrade_split_layout_sql(table).map_err(not_upgradable)?;
            let grants = super::grants::upgrade_grants_sql(table);
            upgrades.push(TableUpgrade {
                table,
                step: UpgradeStep::SplitLayout,
                sql: format!("{}\n\n{grants}", upgrade.trim_end()),
            });
        }
        if lock.format < QUEUE_INVARIANTS_FORMAT {
            upgrades.push(TableUpgrade {
                table,
                step: UpgradeStep::QueueInvariants,
                sql: upgrade_queue_invariants_sql(table).map_err(not_upgradable)?,
            });
        }
    }
    let mut new_tables = Vec::new();
    for (table, events) in writers.iter().filter(|(t, _)| !locked_tables.contains(**t)) {
        let ddl = create_table_sql(table).map_err(|e| GenerateError::InvalidTable {
            event: events[0].clone(),
            table: (*table).to_owned(),
            reason: e.to_string(),
        })?;
        new_tables.push((*table, ddl, events.clone()));
    }

    let removed: Vec<RemovedContract> = lock
        .contracts
        .iter()
        .filter(|l| !compiled.contains_key(&(l.name.clone(), l.version)))
        .map(|l| RemovedContract {
            name: l.name.clone(),
            version: l.version,
            table: l.table.clone(),
            newly_removed: l.compiled,
        })
        .collect();

    let mut next_lock = lock.clone();
    let migration = if to_register.is_empty() && new_tables.is_empty() && upgrades.is_empty() {
        None
    } else {
        let sql = migration_sql(&MigrationContent {
            upgrades,
            tables: new_tables.clone(),
            contracts: to_register.clone(),
        });
        let file_name = next_migration_name(folder);
        next_lock.migrations.push(LockedMigration {
            file: file_name.clone(),
            sha256: sha256_hex(&sql),
        });
        Some(NewMigration { file_name, sql })
    };
    next_lock
        .tables
        .extend(new_tables.iter().map(|(t, _, _)| (*t).to_owned()));
    for c in &to_register {
        next_lock
            .contracts
            .retain(|l| !(l.name == c.name && l.version == c.version));
        next_lock.contracts.push(c.locked());
    }
    for l in next_lock.contracts.iter_mut() {
        if !compiled.contains_key(&(l.name.clone(), l.version)) {
            l.compiled = false;
        }
    }
    // Every table is in the split layout now (the old ones upgraded above). A lock that lists no
    // table keeps its format: it says the same in either, and rewriting it for the number alone
    // would make every such folder stale (`check` fails in CI) with nothing to apply.
    if !next_lock.tables.is_empty() {
        next_lock.format = LOCK_FORMAT;
    }
    let lock_text = next_lock.render();
    let lock_changed = existing_lock_text != Some(&lock_text);
    Ok(Plan {
        migration,
        lock_text,
        lock_changed,
        removed,
    })
}

/// Validate and index the compiled events by (name, version).
fn compile(
    events: &[CompiledEvent],
) -> Result<BTreeMap<(String, u32), PlannedContract>, GenerateError> {
    let mut compiled: BTreeMap<(String, u32), PlannedContract> = BTreeMap::new();
    for event in events {
        let c = &event.contract;
        // Names are refused, not escaped: the same name is the `event_type` of stored rows, a
        // NATS subject and a log field, where no escaping of the generator would help.
        crate::contract::validate_event_name(c.name).map_err(|e| {
            GenerateError::InvalidEventName {
                type_name: shown(c.type_name),
                version: c.version,
                reason: e.to_string(),
            }
        })?;
        if c.type_name.contains('\0') {
            return Err(GenerateError::InvalidTypeName {
                type_name: shown(c.type_name),
            });
        }
        crate::store::validate_table_name(&event.table).map_err(|e| {
            GenerateError::InvalidTable {
                event: format!("{} v{}", c.name, c.version),
                table: shown(&event.table),
                // The store's message for an invalid identifier repeats it unescaped; its other
                // messages (a reserved word, the `_queue` suffix) only ever name a plain one.
                reason: match e {
                    crate::Error::InvalidTableName(_) => "use 1 to 63 lowercase ASCII letters, digits and \
                                                          underscores, starting with a letter or underscore"
                        .to_owned(),
                    other => other.to_string(),
                },
            }
        })?;
        let planned = PlannedContract {
            name: c.name.to_owned(),
            version: c.version,
            type_name: c.type_name.to_owned(),
            table: event.table.clone(),
            fingerprint: c.fingerprint(),
            shape: c.shape.clone(),
        };
        if let Some(first) = compiled.get(&(planned.name.clone(), planned.version)) {
            return Err(GenerateError::DuplicateContract {
                name: planned.name,
                version: planned.version,
                first: shown(&first.type_name),
                second: shown(&planned.type_name),
            });
        }
        compiled.insert((planned.name.clone(), planned.version), planned);
    }
    Ok(compiled)
}

fn read_lock(text: &str) -> Result<ContractLock, GenerateError> {
    let lock = ContractLock::parse(text).map_err(|e| GenerateError::LockUnreadable {
        path: LOCK_FILE.into(),
        reason: e.to_string(),
    })?;
    if lock.format > LOCK_FORMAT {
        return Err(GenerateError::LockUnreadable {
            path: LOCK_FILE.into(),
            reason: format!(
                "it has format {}, this generator writes format {LOCK_FORMAT}; upgrade outbox-runtime",
                lock.format
            ),
        });
    }
    if lock.format < ONE_TABLE_LAYOUT_FORMAT {
        return Err(GenerateError::LockUnreadable {
            path: LOCK_FILE.into(),
            reason: format!(
                "it has format {}, which no generator writes (formats {ONE_TABLE_LAYOUT_FORMAT} to {LOCK_FORMAT})",
                lock.format
            ),
        });
    }
    // A lock edited by hand (or written before names were checked) must not smuggle a name or
    // a table into the SQL of a warning or a new migration. Tables are held to the identifier
    // rule only: the table rules that came later (no `_queue` suffix, the length the queue's
    // index names leave) are about tables the store can serve, and one an earlier generator
    // created that breaks them is refused by its upgrade, saying how to rename it.
    for c in &lock.contracts {
        let table_ok = crate::store::sql::validate_identifier(&c.table).is_ok();
        let problem = match crate::contract::validate_event_name(&c.name) {
            Err(e) => Some(e.to_string()),
            Ok(()) if !table_ok => Some(format!(
                "event `{}` version {} names the table \"{}\", which is not a valid outbox table name",
                c.name,
                c.version,
                shown(&c.table)
            )),
            Ok(()) => None,
        };
        if let Some(reason) = problem {
            return Err(GenerateError::LockUnreadable {
                path: LOCK_FILE.into(),
                reason,
            });
        }
    }
    if let Some(table) = lock
        .tables
        .iter()
        .find(|t| crate::store::sql::validate_identifier(t).is_err())
    {
        return Err(GenerateError::LockUnreadable {
            path: LOCK_FILE.into(),
            reason: format!(
                "it lists the table \"{}\", which is not a valid outbox table name",
                shown(table)
            ),
        });
    }
    Ok(lock)
}

/// Generated migrations are history: each must still be there, byte for byte.
fn verify_locked_migrations(
    lock: &ContractLock,
    folder: &FolderSnapshot,
) -> Result<(), GenerateError> {
    for m in &lock.migrations {
        let current = folder.files.get(&m.file);
        if current.map(|sql| sha256_hex(sql)) != Some(m.sha256.clone()) {
            return Err(GenerateError::GeneratedMigrationChanged {
                file: m.file.clone(),
                lock: LOCK_FILE.to_owned(),
                missing: current.is_none(),
            });
        }
    }
    Ok(())
}

/// `<next version>_outbox_events.sql`: one more than the highest version in the folder, padded
/// like that file's version (four digits in an empty folder). Never the clock: the name must
/// be the same on every machine that generates from the same folder.
fn next_migration_name(folder: &FolderSnapshot) -> String {
    let highest = folder
        .files
        .keys()
        .filter_map(|name| migration_version(name))
        .max_by_key(|(version, _)| *version);
    let (next, width) = match highest {
        Some((version, digits)) => (version + 1, digits),
        None => (1, 4),
    };
    format!("{next:0width$}_{MIGRATION_DESCRIPTION}.sql")
}

/// The version and its digit count, for a file sqlx would read as a migration.
fn migration_version(file_name: &str) -> Option<(u64, usize)> {
    let (prefix, rest) = file_name.split_once('_')?;
    if !rest.ends_with(".sql") || prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((prefix.parse().ok()?, prefix.len()))
}

pub(crate) fn sha256_hex(text: &str) -> String {
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(names: &[&str]) -> FolderSnapshot {
        FolderSnapshot {
            files: names
                .iter()
                .map(|n| ((*n).to_owned(), String::new()))
                .collect(),
        }
    }

    #[test]
    fn numbers_follow_the_folder() {
        assert_eq!(next_migration_name(&folder(&[])), "0001_outbox_events.sql");
        assert_eq!(
            next_migration_name(&folder(&[
                "0001_orders.sql",
                "0002_more.sql",
                "outbox.lock"
            ])),
            "0003_outbox_events.sql"
        );
        assert_eq!(
            next_migration_name(&folder(&["7_a.sql", "10_b.up.sql", "10_b.down.sql"])),
            "11_outbox_events.sql"
        );
        assert_eq!(
            next_migration_name(&folder(&["20240101120000_orders.sql"])),
            "20240101120001_outbox_events.sql"
        );
        assert_eq!(
            next_migration_name(&folder(&["README.md", "x_y.sql"])),
            "0001_outbox_events.sql"
        );
    }
}

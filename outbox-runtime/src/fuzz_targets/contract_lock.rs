//! The contract lock file (`outbox.lock`) into the generator.

use std::collections::BTreeMap;

use crate::contract::Contract;
use crate::generate::{
    CompiledEvent, ContractLock, FolderSnapshot, GenerateError, LOCK_FILE, LOCK_FORMAT, plan,
};

/// The one event the target's binary "compiles".
fn compiled_event() -> CompiledEvent {
    CompiledEvent {
        contract: Contract {
            name: "fuzz.event",
            version: 1,
            type_name: "fuzz::Event",
            shape: serde_json::json!({
                "type": "object",
                "properties": {"id": {"type": "string"}, "total": {"type": "integer"}},
                "required": ["id", "total"]
            }),
        },
        table: crate::store::DEFAULT_TABLE.to_owned(),
    }
}

/// Hand `data` to the generator as the lock of a migrations folder (with one compiled event,
/// so a locked shape is compared with it), and check:
///
/// - a lock it refuses is a typed error that names what is wrong: for a lock it cannot read,
///   the position in the text, the format, the event name or the table; for a drift, the event
///   and its version; for a listed migration, the file; for a table it cannot upgrade, the table;
/// - a lock it accepts is rewritten in the canonical form (which reads back to itself), keeps
///   every (name, version) the input listed (removed versions stay), and records the compiled
///   event with its fingerprint;
/// - the tables of an accepted lock of format 1 are each upgraded by the new migration, and the
///   written lock, like every written lock that lists a table, has the current format.
///
/// # Panics
/// When one of those invariants does not hold.
pub fn check_contract_lock(data: &[u8]) {
    // The command reads the lock as UTF-8 text; other bytes fail the read, before the parse.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let event = compiled_event();
    let folder = FolderSnapshot {
        files: BTreeMap::from([(LOCK_FILE.to_owned(), text.to_owned())]),
    };
    match plan(std::slice::from_ref(&event), &folder) {
        Ok(plan) => {
            let written = ContractLock::parse(&plan.lock_text)
                .unwrap_or_else(|e| panic!("the written lock does not read back ({e})"));
            assert_eq!(
                written.render(),
                plan.lock_text,
                "the written lock is not canonical"
            );
            let input = ContractLock::parse(text).expect("an accepted lock parses");
            for c in &input.contracts {
                assert!(
                    written.contract(&c.name, c.version).is_some(),
                    "{} v{} dropped from the lock",
                    c.name,
                    c.version
                );
            }
            let entry = written
                .contract(event.contract.name, event.contract.version)
                .expect("the compiled event is locked");
            assert!(entry.compiled);
            assert_eq!(entry.fingerprint, event.contract.fingerprint());
            if !written.tables.is_empty() {
                assert_eq!(
                    written.format, LOCK_FORMAT,
                    "tables listed under an old format"
                );
            }
            if input.format < LOCK_FORMAT {
                let migration = plan.migration.map(|m| m.sql).unwrap_or_default();
                for table in &input.tables {
                    // Format 1: the split layout first; formats 1 and 2: the queue invariants.
                    let split =
                        format!("-- ==== Outbox table {table}: upgrade to the split layout");
                    let invariants = format!("-- ==== Outbox table {table}: the queue invariants");
                    assert!(
                        (input.format != 1 || migration.contains(&split))
                            && migration.contains(&invariants),
                        "{table} of a format {} lock is not upgraded",
                        input.format
                    );
                }
            }
        }
        Err(GenerateError::TableNotUpgradable { table, reason }) => {
            let input = ContractLock::parse(text).expect("a lock listing tables parses");
            assert!(input.tables.contains(&table), "{table} is not in the lock");
            assert!(reason.contains(&table), "{reason}");
        }
        Err(GenerateError::LockUnreadable { path, reason }) => {
            assert_eq!(path, std::path::Path::new(LOCK_FILE));
            let names_it = (reason.contains("line ") && reason.contains("column "))
                || reason.contains("format")
                || reason.contains("not a valid event name")
                || reason.contains("table");
            assert!(names_it, "the reason does not say what is wrong: {reason}");
        }
        Err(GenerateError::ShapeChanged { drifts }) => {
            assert!(!drifts.is_empty());
            for drift in &drifts {
                assert_eq!(
                    (drift.name.as_str(), drift.version),
                    (event.contract.name, event.contract.version)
                );
                let message = drift.to_string();
                assert!(message.contains("`fuzz.event` version 1"), "{message}");
            }
        }
        Err(GenerateError::GeneratedMigrationChanged { file, lock, .. }) => {
            assert_eq!(lock, LOCK_FILE);
            let listed = ContractLock::parse(text).expect("a lock listing migrations parses");
            assert!(listed.migrations.iter().any(|m| m.file == file));
        }
        Err(other) => panic!("unexpected error for a lock: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;

    fn names() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("fuzz.event".to_owned()),
            "[a-z][a-z.]{0,8}",
            "[a-z.\\-_ ;'\"\u{0}é]{0,8}",
        ]
    }

    fn tables() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("outbox".to_owned()),
            "[a-z_][a-z0-9_]{0,8}",
            Just("select".to_owned()),
            Just("jobs_queue".to_owned()),
            "[A-Za-z; \"'\\-]{0,8}",
        ]
    }

    fn shapes() -> impl Strategy<Value = Value> {
        let compiled = compiled_event().contract.shape;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<i64>().prop_map(Value::from),
            "[a-z]{0,5}".prop_map(Value::String),
        ];
        let arbitrary = leaf.prop_recursive(4, 24, 3, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                proptest::collection::btree_map("type|properties|required|[a-z]{1,3}", inner, 0..3)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        });
        prop_oneof![
            Just(compiled.clone()),
            "[a-z]{1,4}".prop_map(move |field| {
                let mut shape = compiled.clone();
                shape["properties"][field] = json!({"type": "boolean"});
                shape
            }),
            arbitrary,
        ]
    }

    fn contracts() -> impl Strategy<Value = Value> {
        let fingerprint = compiled_event().contract.fingerprint();
        (
            names(),
            prop_oneof![
                Just(json!(1)),
                (0u32..3).prop_map(Value::from),
                Just(json!(-1)),
                Just(json!("1"))
            ],
            tables(),
            prop_oneof![Just(fingerprint), "[0-9a-f]{64}", "[a-z]{0,3}"],
            any::<bool>(),
            shapes(),
        )
            .prop_map(|(name, version, table, fingerprint, compiled, shape)| {
                json!({
                    "name": name, "version": version, "type_name": "fuzz::Event", "table": table,
                    "fingerprint": fingerprint, "compiled": compiled, "shape": shape
                })
            })
    }

    /// Lock texts aimed at every refusal: formats, names, tables, shapes, listed migrations,
    /// unknown and missing fields, and texts cut or spliced.
    fn lock_texts() -> impl Strategy<Value = String> {
        (
            prop_oneof![
                Just(json!(1)),
                (0u32..4).prop_map(Value::from),
                Just(json!(u64::MAX)),
                Just(json!("1"))
            ],
            proptest::collection::vec(contracts(), 0..3),
            proptest::collection::vec(tables(), 0..2),
            proptest::collection::vec(
                ("[0-9]{4}_[a-z]{1,5}\\.sql|outbox\\.lock", "[0-9a-f]{64}"),
                0..2,
            ),
            proptest::option::of(prop_oneof![
                Just("format"),
                Just("contracts"),
                Just("tables"),
                Just("unknown")
            ]),
            (
                any::<proptest::sample::Index>(),
                proptest::option::of("[\\[\\]{}\",:0-9a-z]{1,3}"),
            ),
            0u8..4,
        )
            .prop_map(
                |(format, contracts, tables, migrations, edit, (at, splice), how)| {
                    let migrations: Vec<Value> = migrations
                        .into_iter()
                        .map(|(file, sha256)| json!({"file": file, "sha256": sha256}))
                        .collect();
                    let mut lock = json!({
                        "format": format, "migrations": migrations, "tables": tables,
                        "contracts": contracts,
                    });
                    match edit {
                        Some("unknown") => lock["unknown"] = json!(true),
                        Some(key) => {
                            lock.as_object_mut().unwrap().remove(key);
                        }
                        None => {}
                    }
                    let mut text = serde_json::to_string_pretty(&lock).unwrap();
                    // Now and then break the text itself: cut it, or splice a few characters in.
                    if how == 0 {
                        let mut cut = at.index(text.len() + 1);
                        while !text.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        match splice {
                            Some(piece) => text.insert_str(cut, &piece),
                            None => text.truncate(cut),
                        }
                    }
                    text
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::fuzz_targets::proptest_cases()))]

        #[test]
        fn any_lock_text_keeps_the_contract(text in lock_texts()) {
            check_contract_lock(text.as_bytes());
        }

        #[test]
        fn any_bytes_keep_the_contract(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            check_contract_lock(&data);
        }
    }

    #[test]
    fn every_outcome_is_reached() {
        // One lock for each branch of the target, so a target that stopped reaching one
        // would show here.
        let compiled = compiled_event();
        let fingerprint = compiled.contract.fingerprint();
        let entry = |name: &str, table: &str, fingerprint: &str| {
            json!({"name": name, "version": 1, "type_name": "t", "table": table,
                   "fingerprint": fingerprint, "compiled": true, "shape": {"type": "object"}})
        };
        let lock_with_tables = |contracts: Vec<Value>, migrations: Vec<Value>, tables: &[&str]| {
            json!({"format": 1, "migrations": migrations, "tables": tables, "contracts": contracts})
                .to_string()
        };
        let lock = |contracts, migrations| lock_with_tables(contracts, migrations, &[]);
        let folder = |text: &str| FolderSnapshot {
            files: BTreeMap::from([(LOCK_FILE.to_owned(), text.to_owned())]),
        };
        let cases: Vec<(String, &str)> = vec![
            (
                lock(vec![entry("fuzz.event", "outbox", &fingerprint)], vec![]),
                "ok",
            ),
            (
                lock(vec![entry("fuzz.event", "outbox", "00")], vec![]),
                "drift",
            ),
            (
                lock(vec![entry("bad name", "outbox", "00")], vec![]),
                "name",
            ),
            (
                lock(vec![entry("other", "Robert'); --", "00")], vec![]),
                "table",
            ),
            (
                lock(vec![], vec![json!({"file": "0002_x.sql", "sha256": "00"})]),
                "migration",
            ),
            ("{\"format\": 9}".to_owned(), "format"),
            ("{\"format\": 0}".to_owned(), "format"),
            (lock_with_tables(vec![], vec![], &["orders"]), "ok"),
            (
                lock_with_tables(vec![], vec![], &["jobs_queue"]),
                "not upgradable",
            ),
            ("{\"format\": 1,".to_owned(), "syntax"),
        ];
        for (text, expected) in cases {
            check_contract_lock(text.as_bytes());
            let outcome = match plan(std::slice::from_ref(&compiled), &folder(&text)) {
                Ok(_) => "ok",
                Err(GenerateError::ShapeChanged { .. }) => "drift",
                Err(GenerateError::GeneratedMigrationChanged { .. }) => "migration",
                Err(GenerateError::LockUnreadable { reason, .. }) => {
                    if reason.contains("not a valid event name") {
                        "name"
                    } else if reason.contains("table") {
                        "table"
                    } else if reason.contains("format") {
                        "format"
                    } else {
                        "syntax"
                    }
                }
                Err(GenerateError::TableNotUpgradable { .. }) => "not upgradable",
                Err(other) => panic!("{other}"),
            };
            assert_eq!(outcome, expected, "{text}");
        }
    }
}

//! Enqueue under attack: operation keys are idempotent by payload *value* (maps in any order),
//! a conflict on another unique index or a vanishing key is a typed error instead of unbounded
//! recursion, isolation-level races and deadlocks say "retry the transaction", and a huge key
//! makes neither a huge error nor a huge row.

mod store_support;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use outbox_runtime::event::CurrentEvent;
use outbox_runtime::store::enqueue::{
    MAX_OPERATION_KEY_BYTES, canonical_json, event_id_for, legacy_payload_fingerprint,
    payload_fingerprint,
};
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::{Error, Event, Store};
use proptest::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::PgPool;
use store_support::{
    Note, OrderPlaced, count_queue_rows, count_rows, orphan_queue_rows, wait_until_blocked,
};

/// Longest any single enqueue of these tests may take before it counts as hung (the old
/// recursion never returned).
const ENQUEUE_DEADLINE: Duration = Duration::from_secs(20);

/// A command whose payload holds maps (serialized in a random order per instance) and a set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "inventory_adjusted", version = 1)]
struct InventoryAdjusted {
    /// Quantity per SKU.
    quantities: HashMap<String, i64>,
    /// Per warehouse, per bin, a note.
    bins: HashMap<String, HashMap<String, String>>,
    /// Tags (a `BTreeSet`: a set must iterate in a fixed order to fingerprint the same).
    tags: BTreeSet<String>,
}

fn inventory(entries: &[(String, i64)], tags: &[String]) -> InventoryAdjusted {
    let mut bins = HashMap::new();
    for (sku, n) in entries {
        bins.entry(format!("wh-{}", n.rem_euclid(3)))
            .or_insert_with(HashMap::new)
            .insert(sku.clone(), format!("bin of {sku}"));
    }
    InventoryAdjusted {
        quantities: entries.iter().cloned().collect(),
        bins,
        tags: tags.iter().cloned().collect(),
    }
}

/// The fingerprint enqueue computes for `payload`.
fn fingerprint_of(payload: &impl Serialize) -> [u8; 32] {
    payload_fingerprint("e", 1, &serde_json::to_value(payload).unwrap())
}

/// Any JSON value: unicode strings and keys, nested arrays and objects, integers of both signs,
/// and floats with a fractional part (an integral float is the same number as the integer,
/// which `integral_floats_and_integers_are_one_number` covers).
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (any::<i32>(), 1u32..1024).prop_map(|(whole, eighths)| {
            Value::from(f64::from(whole) + f64::from(eighths % 8 + 1) / 16.0)
        }),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..6)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The same logical payload, with its maps filled in any order and its set inserted in any
    /// order, fingerprints the same (and so is an idempotent repeat under its key).
    #[test]
    fn maps_and_sets_in_any_insertion_order_fingerprint_the_same(
        entries in prop::collection::btree_map("\\PC{1,12}", any::<i64>(), 0..24),
        tags in prop::collection::btree_set("\\PC{0,8}", 0..12),
        seed in any::<u64>(),
    ) {
        let entries: Vec<(String, i64)> = entries.into_iter().collect();
        let tags: Vec<String> = tags.into_iter().collect();
        let first = inventory(&entries, &tags);
        // The same content inserted in another order (rotated and reversed by the seed); each
        // HashMap also has its own random hasher, so serde writes them in different orders.
        let mut shuffled_entries = entries.clone();
        let mut shuffled_tags = tags.clone();
        if !shuffled_entries.is_empty() {
            let len = shuffled_entries.len();
            shuffled_entries.rotate_left((seed as usize) % len);
        }
        if seed % 2 == 0 {
            shuffled_entries.reverse();
            shuffled_tags.reverse();
        }
        let second = inventory(&shuffled_entries, &shuffled_tags);
        prop_assert_eq!(&first, &second);
        prop_assert_eq!(fingerprint_of(&first), fingerprint_of(&second));
    }

    /// Nested maps: a `HashMap` of `BTreeMap`s of `HashMap`s, built twice from the same
    /// content, fingerprints the same; and the canonical text has its keys sorted at every
    /// depth.
    #[test]
    fn nested_maps_fingerprint_by_content(
        tree in prop::collection::btree_map(
            "\\PC{0,6}",
            prop::collection::btree_map("\\PC{0,6}", prop::collection::btree_map("\\PC{0,6}", any::<i32>(), 0..4), 0..4),
            0..5,
        ),
    ) {
        let build = |reverse: bool| -> HashMap<String, BTreeMap<String, HashMap<String, i32>>> {
            let mut outer: Vec<_> = tree.iter().collect();
            if reverse {
                outer.reverse();
            }
            outer
                .into_iter()
                .map(|(k, middle)| {
                    let middle = middle
                        .iter()
                        .map(|(k, inner)| {
                            let mut inner: Vec<_> = inner.iter().map(|(k, v)| (k.clone(), *v)).collect();
                            if reverse {
                                inner.reverse();
                            }
                            (k.clone(), inner.into_iter().collect())
                        })
                        .collect();
                    (k.clone(), middle)
                })
                .collect()
        };
        prop_assert_eq!(fingerprint_of(&build(false)), fingerprint_of(&build(true)));
        // The canonical text is the sorted serialization of the same tree.
        let text = canonical_json(&serde_json::to_value(build(true)).unwrap());
        prop_assert_eq!(text, serde_json::to_string(&tree).unwrap());
    }

    /// Different payloads fingerprint differently, and equal ones the same: the fingerprint is
    /// as fine as the payload's value (the canonical text is a faithful JSON rendering of it).
    #[test]
    fn different_payloads_fingerprint_differently(a in any_json(), b in any_json()) {
        prop_assert_eq!(a == b, fingerprint_of(&a) == fingerprint_of(&b));
        // A one-field change anywhere in a document changes its fingerprint.
        let wrapped_a = json!({"payload": a.clone(), "n": 1});
        let wrapped_changed = json!({"payload": a.clone(), "n": 2});
        prop_assert_ne!(fingerprint_of(&wrapped_a), fingerprint_of(&wrapped_changed));
        // The canonical text reads back to the same value.
        let read_back: Value = serde_json::from_str(&canonical_json(&a)).unwrap();
        prop_assert_eq!(read_back, a);
    }

    /// Unicode strings (any scalar value, control characters, quotes, backslashes, astral
    /// planes) are fingerprinted by content: equal strings the same, different ones not, in
    /// values and in keys.
    #[test]
    fn unicode_strings_fingerprint_by_content(a in any::<String>(), b in any::<String>()) {
        prop_assert_eq!(a == b, fingerprint_of(&a) == fingerprint_of(&b));
        prop_assert_eq!(
            a == b,
            fingerprint_of(&json!({ a.clone(): 1 })) == fingerprint_of(&json!({ b.clone(): 1 }))
        );
        let read_back: String = serde_json::from_str(&canonical_json(&Value::String(a.clone()))).unwrap();
        prop_assert_eq!(read_back, a);
    }
}

/// One number format: a number is its value, so `1`, `1.0` and `1.00` (and `0` and `-0.0`) are
/// one number; different values stay different.
#[test]
fn integral_floats_and_integers_are_one_number() {
    let same = [
        (json!(1), json!(1.0)),
        (json!(0), json!(-0.0)),
        (json!(-3), json!(-3.0)),
        (json!(i64::MIN), json!(i64::MIN as f64)),
        (json!(1u64 << 53), json!((1u64 << 53) as f64)),
        (json!({"a": [1, 2.0]}), json!({"a": [1.0, 2]})),
    ];
    for (a, b) in same {
        assert_eq!(fingerprint_of(&a), fingerprint_of(&b), "{a} and {b}");
    }
    let different = [
        (json!(1), json!(1.5)),
        (json!(1), json!("1")),
        (json!(0.1), json!(0.2)),
        (json!(u64::MAX), json!(i64::MIN)),
        (json!(null), json!(0)),
        (json!([]), json!({})),
    ];
    for (a, b) in different {
        assert_ne!(fingerprint_of(&a), fingerprint_of(&b), "{a} and {b}");
    }
    assert_eq!(
        canonical_json(&json!({"b": 1.0, "a": -0.0})),
        r#"{"a":0,"b":1}"#
    );
    // Type and version are part of the fingerprint.
    let value = json!({"x": 1});
    assert_ne!(
        payload_fingerprint("a", 1, &value),
        payload_fingerprint("b", 1, &value)
    );
    assert_ne!(
        payload_fingerprint("a", 1, &value),
        payload_fingerprint("a", 2, &value)
    );
}

/// The edges of the integer range: 2^64, the first integral float past `u64::MAX`, is written
/// as a float, and -2^63 (`i64::MIN`) as an integer. The canonical text is stored (as the
/// fingerprint), so it must not move between versions: a row written before would stop
/// matching its own retry.
#[test]
fn the_integer_range_of_canonical_numbers_ends_at_u64_max() {
    let two_pow_64 = 18_446_744_073_709_551_616.0_f64;
    assert_eq!(canonical_json(&json!(two_pow_64)), "1.8446744073709552e+19");
    assert_eq!(canonical_json(&json!(u64::MAX)), "18446744073709551615");
    assert_eq!(
        canonical_json(&json!(i64::MIN as f64)),
        "-9223372036854775808"
    );
}

/// Enqueue with a bound on time: a hang (the old unbounded recursion) fails the test instead of
/// the suite.
async fn enqueue_bounded<E: Event + CurrentEvent>(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    event: &E,
    key: &str,
) -> Result<uuid::Uuid, Error> {
    tokio::time::timeout(ENQUEUE_DEADLINE, event.enqueue(tx, key))
        .await
        .unwrap_or_else(|_| {
            panic!("enqueue under key `{key}` did not return within {ENQUEUE_DEADLINE:?}")
        })
}

#[tokio::test]
async fn a_payload_with_hash_maps_retried_under_its_key_gets_its_event_back() {
    let db = TestDatabase::new().await;
    let entries: Vec<(String, i64)> = (0..64).map(|i| (format!("sku-{i}"), i * 7)).collect();
    let tags: Vec<String> = vec!["restock".into(), "audit".into()];

    let mut tx = db.pool().begin().await.unwrap();
    let first = enqueue_bounded(&mut tx, &inventory(&entries, &tags), "adjust/1")
        .await
        .unwrap();
    tx.commit().await.unwrap();

    // Each retry builds its maps anew (new hashers, so serde writes them in another order), in a
    // transaction of its own, as a retried command would.
    for attempt in 0..10 {
        let mut tx = db.pool().begin().await.unwrap();
        let again = enqueue_bounded(&mut tx, &inventory(&entries, &tags), "adjust/1").await;
        tx.commit().await.unwrap();
        match again {
            Ok(id) => assert_eq!(id, first, "retry {attempt}"),
            Err(error) => panic!("retry {attempt} of the same command was refused: {error}"),
        }
    }
    assert_eq!(count_rows(db.pool()).await, 1);

    // A different quantity under the same key is still a reused key.
    let mut changed = entries.clone();
    changed[5].1 += 1;
    let mut tx = db.pool().begin().await.unwrap();
    assert!(matches!(
        enqueue_bounded(&mut tx, &inventory(&changed, &tags), "adjust/1").await,
        Err(Error::OperationKeyReused { existing_event_id, .. }) if existing_event_id == first
    ));
}

/// A row written before fingerprints were canonical carries the legacy fingerprint (type,
/// version and serde's output as it came): the same command retried after the upgrade gets its
/// event back; another payload is still refused.
#[tokio::test]
async fn a_row_with_the_legacy_fingerprint_is_recognised_after_the_upgrade() {
    let db = TestDatabase::new().await;
    let event = OrderPlaced {
        order_id: "o-legacy".into(),
        total_cents: 700,
    };
    let serialized = serde_json::to_string(&event).unwrap();
    let legacy = legacy_payload_fingerprint(
        OrderPlaced::NAME,
        OrderPlaced::VERSION,
        serialized.as_bytes(),
    );
    let canonical = fingerprint_of(&event);
    assert_ne!(
        legacy, canonical,
        "the test needs the two fingerprints to differ"
    );
    let id = event_id_for("outbox", "legacy-key");
    // What the previous version's enqueue wrote (the same columns, its fingerprint), with its
    // queue row.
    sqlx::query(
        "WITH e AS (
             INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload)
             VALUES ($1, 'legacy-key', $2, $3, 1, $4::jsonb)
             RETURNING id
         )
         INSERT INTO outbox_queue (id) SELECT id FROM e",
    )
    .bind(id)
    .bind(&legacy[..])
    .bind(OrderPlaced::NAME)
    .bind(&serialized)
    .execute(db.pool())
    .await
    .unwrap();

    let mut tx = db.pool().begin().await.unwrap();
    assert_eq!(
        enqueue_bounded(&mut tx, &event, "legacy-key")
            .await
            .unwrap(),
        id
    );
    let other = OrderPlaced {
        total_cents: 701,
        ..event.clone()
    };
    assert!(matches!(
        enqueue_bounded(&mut tx, &other, "legacy-key").await,
        Err(Error::OperationKeyReused { .. })
    ));
    tx.commit().await.unwrap();
    assert_eq!(count_rows(db.pool()).await, 1);
}

/// A unique index the application added to the outbox table: its violation is a typed error
/// naming the index and saying the transaction is aborted; the process carries on.
#[tokio::test]
async fn a_violated_user_unique_index_is_a_typed_error_and_the_process_survives() {
    let db = TestDatabase::new().await;
    sqlx::query("CREATE UNIQUE INDEX one_event_per_order ON outbox (aggregate_id)")
        .execute(db.pool())
        .await
        .unwrap();
    let placed = OrderPlaced {
        order_id: "o-9".into(),
        total_cents: 1,
    };
    let mut tx = db.pool().begin().await.unwrap();
    enqueue_bounded(&mut tx, &placed, "place/o-9")
        .await
        .unwrap();
    tx.commit().await.unwrap();

    // Another key (so a free event id), same aggregate id: only the user's index conflicts.
    let mut tx = db.pool().begin().await.unwrap();
    let corrected = OrderPlaced {
        total_cents: 2,
        ..placed.clone()
    };
    match enqueue_bounded(&mut tx, &corrected, "correct/o-9").await {
        Err(error @ Error::UniqueViolation { .. }) => {
            let Error::UniqueViolation { table, constraint } = &error else {
                unreachable!()
            };
            assert_eq!(table, "outbox");
            assert_eq!(constraint, "one_event_per_order");
            let message = error.to_string();
            assert!(
                message.contains("one_event_per_order") && message.contains("aborted"),
                "{message}"
            );
            assert!(!error.is_retryable());
        }
        other => panic!("expected UniqueViolation, got {other:?}"),
    }
    tx.rollback().await.unwrap();

    // The process and the pool carry on.
    let mut tx = db.pool().begin().await.unwrap();
    enqueue_bounded(
        &mut tx,
        &OrderPlaced {
            order_id: "o-10".into(),
            total_cents: 3,
        },
        "place/o-10",
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(count_rows(db.pool()).await, 2);
}

/// The key is taken at every insert but its event is gone at every look-up (here a trigger
/// plants a row under the event id before the insert and deletes it after the statement, as a
/// purge racing the key would): enqueue gives up after a bounded number of rounds with a typed
/// error, instead of recursing until the process dies.
#[tokio::test]
async fn a_key_whose_event_keeps_vanishing_is_a_typed_error_after_bounded_rounds() {
    let db = TestDatabase::new().await;
    for statement in [
        r"CREATE FUNCTION plant_taken_key() RETURNS trigger LANGUAGE plpgsql AS $$
          BEGIN
            IF pg_trigger_depth() = 1 AND NEW.operation_key = 'vanishing' THEN
              INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload)
              VALUES (NEW.event_id, 'planted', '\x00', 'note', 1, '{}');
            END IF;
            RETURN NEW;
          END $$",
        "CREATE TRIGGER plant_taken_key BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION plant_taken_key()",
        r"CREATE FUNCTION purge_planted() RETURNS trigger LANGUAGE plpgsql AS $$
          BEGIN
            IF pg_trigger_depth() = 1 THEN
              DELETE FROM outbox WHERE operation_key = 'planted';
            END IF;
            RETURN NULL;
          END $$",
        "CREATE TRIGGER purge_planted AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION purge_planted()",
    ] {
        sqlx::query(statement).execute(db.pool()).await.unwrap();
    }

    let mut tx = db.pool().begin().await.unwrap();
    match enqueue_bounded(&mut tx, &Note { text: "v".into() }, "vanishing").await {
        Err(Error::OperationKeyVanished {
            operation_key,
            attempts,
        }) => {
            assert_eq!(operation_key, "vanishing");
            assert!((1..=10).contains(&attempts), "{attempts} rounds");
        }
        other => panic!("expected OperationKeyVanished, got {other:?}"),
    }
    // Nothing was raised in the database: the transaction still works.
    Note { text: "w".into() }
        .enqueue(&mut tx, "other")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(count_rows(db.pool()).await, 1);
    assert_eq!(
        count_queue_rows(db.pool()).await,
        1,
        "the other key's queue row only"
    );
}

/// A transaction at the isolation level `set_isolation` sets, with its snapshot taken.
async fn begin_at(
    pool: &PgPool,
    set_isolation: &'static str,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(set_isolation).execute(&mut *tx).await.unwrap();
    // Take the snapshot now.
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
    tx
}

/// Under REPEATABLE READ and SERIALIZABLE, a key committed by another transaction after this
/// one's snapshot is a serialization failure: a typed "retry the transaction" error, and the
/// retried transaction gets the other's event.
#[tokio::test]
async fn a_same_key_race_under_repeatable_read_or_serializable_says_retry_the_transaction() {
    let db = TestDatabase::new().await;
    let event = OrderPlaced {
        order_id: "o-rr".into(),
        total_cents: 42,
    };
    for isolation in [
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
    ] {
        let key = format!("race/{isolation}");
        let mut first = db.pool().begin().await.unwrap();
        let first_id = enqueue_bounded(&mut first, &event, &key).await.unwrap();
        let mut second = begin_at(db.pool(), isolation).await;
        first.commit().await.unwrap();

        match enqueue_bounded(&mut second, &event, &key).await {
            Err(error @ Error::RetryTransaction { .. }) => {
                assert!(error.is_retryable());
                let message = error.to_string();
                assert!(message.contains("40001"), "{message}");
                assert!(message.contains("retried"), "{message}");
            }
            other => panic!("{isolation}: expected RetryTransaction, got {other:?}"),
        }
        second.rollback().await.unwrap();

        let mut retried = begin_at(db.pool(), isolation).await;
        assert_eq!(
            enqueue_bounded(&mut retried, &event, &key).await.unwrap(),
            first_id
        );
        retried.commit().await.unwrap();
    }
    assert_eq!(count_rows(db.pool()).await, 2);
}

/// Two transactions enqueue two keys in opposite orders: PostgreSQL breaks the deadlock by
/// failing one of them, which enqueue reports as "retry the transaction"; the other commits.
#[tokio::test]
async fn a_deadlock_between_two_enqueues_says_retry_the_transaction() {
    let db = TestDatabase::new().await;
    let mut a = db.pool().begin().await.unwrap();
    let mut b = db.pool().begin().await.unwrap();
    let a_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *a)
        .await
        .unwrap();
    let note = Note { text: "d".into() };
    enqueue_bounded(&mut a, &note, "left").await.unwrap();
    enqueue_bounded(&mut b, &note, "right").await.unwrap();

    let crossing = |mut tx: sqlx::Transaction<'static, sqlx::Postgres>, key: &'static str| {
        let note = note.clone();
        tokio::spawn(async move {
            let outcome = enqueue_bounded(&mut tx, &note, key).await;
            if outcome.is_ok() {
                tx.commit().await.unwrap();
            } else {
                tx.rollback().await.unwrap();
            }
            outcome
        })
    };
    let a_task = crossing(a, "right");
    wait_until_blocked(db.pool(), a_pid, None).await;
    let b_task = crossing(b, "left");
    let outcomes = [a_task.await.unwrap(), b_task.await.unwrap()];

    let retries: Vec<&Error> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert_eq!(
        retries.len(),
        1,
        "exactly one side is the deadlock's victim: {outcomes:?}"
    );
    assert!(
        matches!(retries[0], Error::RetryTransaction { reason } if reason.contains("40P01")),
        "{:?}",
        retries[0]
    );
    assert!(retries[0].is_retryable());
    assert_eq!(count_rows(db.pool()).await, 2, "the winner's two events");
}

/// Errors about a key repeat at most its first 64 characters; a key over the documented limit
/// is refused before anything is written.
#[tokio::test]
async fn errors_about_long_keys_stay_small_and_an_oversized_key_is_refused() {
    let db = TestDatabase::new().await;
    let long_key = "k".repeat(MAX_OPERATION_KEY_BYTES);
    let mut tx = db.pool().begin().await.unwrap();
    let first = enqueue_bounded(&mut tx, &Note { text: "1".into() }, &long_key)
        .await
        .unwrap();
    match enqueue_bounded(&mut tx, &Note { text: "2".into() }, &long_key).await {
        Err(error @ Error::OperationKeyReused { .. }) => {
            let message = error.to_string();
            assert!(message.len() < 400, "{} bytes: {message}", message.len());
            assert!(
                message.contains(&format!("{}… ({} bytes)", "k".repeat(64), long_key.len())),
                "{message}"
            );
            let Error::OperationKeyReused {
                operation_key,
                existing_event_id,
            } = error
            else {
                unreachable!()
            };
            assert_eq!(operation_key, long_key, "the field keeps the whole key");
            assert_eq!(existing_event_id, first);
        }
        other => panic!("expected OperationKeyReused, got {other:?}"),
    }

    let huge_key = "é".repeat(512 * 1024); // 1 MiB
    match enqueue_bounded(&mut tx, &Note { text: "3".into() }, &huge_key).await {
        Err(error @ Error::OperationKeyTooLong { .. }) => {
            let message = error.to_string();
            assert!(message.len() < 500, "{} bytes", message.len());
            assert!(message.contains("1048576 bytes"), "{message}");
            assert!(
                message.contains(&format!(
                    "over the limit of {MAX_OPERATION_KEY_BYTES} bytes"
                )),
                "{message}"
            );
        }
        other => panic!("expected OperationKeyTooLong, got {other:?}"),
    }
    // Nothing was written and the transaction is usable.
    tx.commit().await.unwrap();
    assert_eq!(count_rows(db.pool()).await, 1);
}

/// Watches the two tables of the default outbox from a connection of its own until stopped:
/// every statement it runs sees one snapshot of both, and no snapshot may hold a queue row
/// without its event or (with `every_event_queued`, while nothing is delivered) an event without
/// its queue row. Returns how many snapshots it checked.
fn watch_pairs(
    pool: &PgPool,
    every_event_queued: bool,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<usize> {
    let pool = pool.clone();
    tokio::spawn(async move {
        let mut seen = 0;
        while !stop.load(Ordering::Relaxed) {
            let (unqueued, orphans): (i64, i64) = sqlx::query_as(
                "SELECT (SELECT count(*) FROM outbox e
                         WHERE NOT EXISTS (SELECT 1 FROM outbox_queue q WHERE q.id = e.id)),
                        (SELECT count(*) FROM outbox_queue q
                         WHERE NOT EXISTS (SELECT 1 FROM outbox e WHERE e.id = q.id))",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(orphans, 0, "a queue row without its event");
            if every_event_queued {
                assert_eq!(
                    unqueued, 0,
                    "an event without its queue row before delivery"
                );
            }
            seen += 1;
            tokio::task::yield_now().await;
        }
        seen
    })
}

/// Many producers enqueue one operation key at once, each in a transaction that has written an
/// event of its own first, and their commits interleave: the first insert holds the key, the
/// others wait for it; some transactions roll back, so a waiter's insert becomes the one that
/// writes. Whatever the order, the key ends with exactly one event and exactly one queue row,
/// every producer gets the key's event id, and no snapshot ever shows one row of the pair
/// without the other (nothing is delivered here).
#[tokio::test]
async fn producers_racing_one_key_write_one_event_and_one_queue_row_never_half_a_pair() {
    const PRODUCERS: usize = 12;
    const ROUNDS: usize = 4;
    let db = TestDatabase::with_pool_size(PRODUCERS as u32 + 2).await;
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_pairs(db.pool(), true, stop.clone());

    let mut kept_own = 0;
    for round in 0..ROUNDS {
        let key = format!("raced/{round}");
        let start = Arc::new(tokio::sync::Barrier::new(PRODUCERS));
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|i| {
                let (pool, key, start) = (db.pool().clone(), key.clone(), start.clone());
                tokio::spawn(async move {
                    let mut tx = pool.begin().await.unwrap();
                    enqueue_bounded(
                        &mut tx,
                        &Note { text: "own".into() },
                        &format!("own/{round}/{i}"),
                    )
                    .await
                    .unwrap();
                    start.wait().await;
                    let outcome = enqueue_bounded(
                        &mut tx,
                        &Note {
                            text: "raced".into(),
                        },
                        &key,
                    )
                    .await;
                    // Commits and rollbacks spread over a few milliseconds, in an order that
                    // changes from round to round.
                    tokio::time::sleep(Duration::from_millis(((i * 7 + round * 3) % 5) as u64))
                        .await;
                    let rolls_back = (i + round) % 3 == 0;
                    if rolls_back {
                        tx.rollback().await.unwrap();
                    } else {
                        tx.commit().await.unwrap();
                    }
                    (outcome, rolls_back)
                })
            })
            .collect();
        for producer in producers {
            let (outcome, rolls_back) = producer.await.unwrap();
            assert_eq!(
                outcome.expect("an enqueue of a raced key failed"),
                event_id_for("outbox", &key)
            );
            kept_own += usize::from(!rolls_back);
        }
        let pair: (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(q.id) FROM outbox e LEFT JOIN outbox_queue q ON q.id = e.id
             WHERE e.operation_key = $1",
        )
        .bind(&key)
        .fetch_one(db.pool())
        .await
        .unwrap();
        assert_eq!(
            pair,
            (1, 1),
            "round {round}: one event and one queue row under the key"
        );
    }
    stop.store(true, Ordering::Relaxed);
    assert!(
        watcher.await.unwrap() > 0,
        "the watcher checked no snapshot"
    );
    // The producers' own events: those of the committed transactions, each with its queue row.
    let expected = i64::try_from(ROUNDS + kept_own).unwrap();
    assert_eq!(
        (
            count_rows(db.pool()).await,
            count_queue_rows(db.pool()).await
        ),
        (expected, expected)
    );
}

/// The purge runs in a loop with a retention of zero (every delivered event is due at once)
/// while producers enqueue and two workers claim and complete, one keeping its delivered
/// events (for the purge) and one deleting them with the completion: the purge never deletes an
/// event that still has its queue row, so every event is claimed with its payload and delivered
/// exactly once, and no snapshot ever shows a queue row without its event.
#[tokio::test]
async fn a_purge_racing_enqueues_and_completions_never_deletes_an_undelivered_event() {
    const PRODUCERS: usize = 3;
    const TRANSACTIONS: usize = 150;
    let db = TestDatabase::with_pool_size(12).await;
    let store = Store::new(db.pool().clone());
    let stop = Arc::new(AtomicBool::new(false));
    let producing = Arc::new(AtomicUsize::new(PRODUCERS));
    let watcher = watch_pairs(db.pool(), false, stop.clone());

    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (pool, producing) = (db.pool().clone(), producing.clone());
            tokio::spawn(async move {
                let mut enqueued = Vec::new();
                for t in 0..TRANSACTIONS {
                    let mut tx = pool.begin().await.unwrap();
                    // Every fifth transaction writes two events.
                    for e in 0..1 + usize::from(t % 5 == 0) {
                        let note = Note {
                            text: format!("{p}/{t}/{e}"),
                        };
                        enqueued.push(
                            enqueue_bounded(&mut tx, &note, &format!("purge-race/{p}/{t}/{e}"))
                                .await
                                .unwrap(),
                        );
                    }
                    tx.commit().await.unwrap();
                }
                producing.fetch_sub(1, Ordering::Relaxed);
                enqueued
            })
        })
        .collect();
    let workers: Vec<_> = [false, true]
        .into_iter()
        .map(|by_deleting| {
            let (store, producing, pool) = (store.clone(), producing.clone(), db.pool().clone());
            tokio::spawn(async move {
                let mut delivered = Vec::new();
                loop {
                    let batch = store
                        .claim_batch("w", 10, Duration::from_secs(60), false)
                        .await
                        .unwrap();
                    if batch.is_empty() {
                        if producing.load(Ordering::Relaxed) == 0
                            && count_queue_rows(&pool).await == 0
                        {
                            return delivered;
                        }
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        continue;
                    }
                    let claims: Vec<_> = batch.iter().map(|e| e.claim()).collect();
                    let lost = if by_deleting {
                        store.complete_many_by_deleting_if_owned(&claims).await
                    } else {
                        store.complete_many_if_owned(&claims).await
                    };
                    assert!(lost.unwrap().is_empty(), "a live claim was lost");
                    delivered.extend(batch.iter().map(|e| e.event_id));
                }
            })
        })
        .collect();
    let purger = {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            let mut purged = 0;
            while !stop.load(Ordering::Relaxed) {
                purged += store.purge_delivered(Duration::ZERO, 20).await.unwrap();
                tokio::task::yield_now().await;
            }
            purged
        })
    };

    let mut enqueued = Vec::new();
    for producer in producers {
        enqueued.extend(producer.await.unwrap());
    }
    let mut delivered = Vec::new();
    for worker in workers {
        delivered.extend(
            tokio::time::timeout(Duration::from_secs(60), worker)
                .await
                .expect(
                    "the workers did not drain the queue: an event was lost under its queue row",
                )
                .unwrap(),
        );
    }
    stop.store(true, Ordering::Relaxed);
    let purged = purger.await.unwrap();
    assert!(
        watcher.await.unwrap() > 0,
        "the watcher checked no snapshot"
    );

    let unique: HashSet<_> = delivered.iter().collect();
    assert_eq!(
        unique.len(),
        delivered.len(),
        "an event was delivered twice"
    );
    assert_eq!(
        unique,
        enqueued.iter().collect::<HashSet<_>>(),
        "every event enqueued is delivered"
    );
    assert!(orphan_queue_rows(db.pool()).await.is_empty());
    // What the purge has not taken yet is delivered and kept; it goes at the next purge.
    let left = u64::try_from(count_rows(db.pool()).await).unwrap();
    assert_eq!(
        store.purge_delivered(Duration::ZERO, 10_000).await.unwrap(),
        left
    );
    println!(
        "{} events delivered, {purged} purged while the others ran, {left} after",
        delivered.len()
    );
    assert!(purged > 0, "the purge never raced anything");
}

//! The schema: the migration is the table template rendered for `outbox`, concurrent
//! migrations are safe, other outbox tables work the same, and every statement's plan uses the
//! index it was written for (the plans are printed: run with `--nocapture`).

mod store_support;

use std::time::Duration;

use outbox_runtime::Store;
use outbox_runtime::store::sql::{STATEMENTS, TABLE_PLACEHOLDER};
use outbox_runtime::store::{create_table_sql, notify_channel};
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::{Error, Event};
use sqlx::Row;
use sqlx::postgres::{PgArguments, PgListener};
use sqlx::query::Query;
use store_support::{AuditEntry, Note, bulk_insert, count_rows};

#[test]
fn the_migration_is_the_table_template_rendered_for_outbox() {
    let migration = include_str!("../outbox-runtime/migrations/0001_outbox.sql");
    assert_eq!(
        migration,
        create_table_sql("outbox").unwrap(),
        "outbox-runtime/migrations/0001_outbox.sql must be outbox-runtime/src/store/sql/create_table.sql rendered for `outbox`"
    );
}

#[test]
fn table_names_are_validated() {
    assert!(matches!(
        create_table_sql("Orders"),
        Err(Error::InvalidTableName(_))
    ));
    assert!(matches!(
        create_table_sql("orders; drop table x"),
        Err(Error::InvalidTableName(_))
    ));
    assert!(matches!(
        create_table_sql(&"t".repeat(50)),
        Err(Error::Config(_))
    ));
    // 49 bytes is the longest name whose longest index name (`_aggregate_idx`) still fits the
    // 63 bytes PostgreSQL keeps: allowed.
    assert!(create_table_sql(&"t".repeat(49)).is_ok());
    assert_eq!(notify_channel("orders_outbox"), "orders_outbox");
    // Reserved words would make every unquoted statement a syntax error at run time.
    for word in ["order", "user"] {
        let error = create_table_sql(word).unwrap_err();
        assert!(
            matches!(error, Error::ReservedTableName(_)),
            "{word}: {error}"
        );
        assert!(error.to_string().contains("reserved word"), "{error}");
    }
}

#[tokio::test]
async fn two_concurrent_migrations_of_an_empty_database_both_succeed() {
    let db = TestDatabase::empty(5).await;
    let (a, b) = tokio::join!(
        outbox_runtime::migrate(db.pool()),
        outbox_runtime::migrate(db.pool())
    );
    a.unwrap();
    b.unwrap();
    outbox_runtime::migrate(db.pool()).await.unwrap();
    let table = outbox_runtime::migrate::MIGRATIONS_TABLE;
    let applied: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT version FROM {table} ORDER BY version"
    )))
    .fetch_all(db.pool())
    .await
    .unwrap();
    let mut unique = applied.clone();
    unique.dedup();
    assert_eq!(applied, unique, "each migration applied once");
    assert_eq!(applied.first(), Some(&1));
    assert_eq!(count_rows(db.pool()).await, 0);
}

#[tokio::test]
async fn a_second_outbox_table_works_like_the_first() {
    let db = TestDatabase::new().await;
    let ddl = create_table_sql("audit_outbox").unwrap();
    assert!(
        !ddl.contains("TEMPLATE: table */"),
        "every placeholder is replaced"
    );
    for _ in 0..2 {
        // Idempotent, like the migration.
        sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.clone()))
            .execute(db.pool())
            .await
            .unwrap();
    }
    let mut listener = PgListener::connect(&db.url()).await.unwrap();
    listener
        .listen(&notify_channel("audit_outbox"))
        .await
        .unwrap();

    let mut tx = db.pool().begin().await.unwrap();
    let id = AuditEntry {
        what: "login".into(),
    }
    .enqueue(&mut tx, "audit-1")
    .await
    .unwrap();
    Note {
        text: "default table".into(),
    }
    .enqueue(&mut tx, "audit-1")
    .await
    .unwrap(); // same key, other table
    tx.commit().await.unwrap();
    assert_eq!(
        id,
        outbox_runtime::store::enqueue::event_id_for("audit_outbox", "audit-1")
    );
    let n = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n.channel(), "audit_outbox");

    assert_eq!(count_rows(db.pool()).await, 1);
    let store = Store::for_table(db.pool().clone(), "audit_outbox").unwrap();
    assert_eq!(store.table(), "audit_outbox");
    let claimed = store
        .claim_batch("w", 10, Duration::from_secs(30), false)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(
        (claimed[0].event_id, claimed[0].event_type.as_str()),
        (id, "audit_entry")
    );
    assert_eq!(
        store.complete_if_owned(claimed[0].claim()).await.unwrap(),
        outbox_runtime::store::Ownership::Owned
    );
    let status: String = sqlx::query_scalar("SELECT status FROM audit_outbox")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(status, "delivered");
    assert!(matches!(
        Store::for_table(db.pool().clone(), "Audit"),
        Err(Error::InvalidTableName(_))
    ));
}

/// Bind plausible arguments for statement `name` (every statement must be listed here, so a
/// new statement cannot skip the plan check).
fn bind_for<'q>(
    name: &str,
    q: Query<'q, sqlx::Postgres, PgArguments>,
) -> Query<'q, sqlx::Postgres, PgArguments> {
    match name {
        "enqueue" | "enqueue_notify" => {
            let q = q
                .bind(uuid::Uuid::new_v4())
                .bind("explain-key")
                .bind(vec![0_u8; 32])
                .bind("note")
                .bind(1_i32)
                .bind(None::<String>)
                .bind(None::<String>)
                .bind(None::<i64>)
                .bind(serde_json::json!({"text": "x"}))
                .bind(serde_json::json!({}))
                .bind(10_i32)
                .bind(0_i64);
            if name == "enqueue_notify" {
                q.bind("outbox")
            } else {
                q
            }
        }
        "wake" => q.bind("outbox"),
        "lock_aggregate" => q.bind("outbox").bind("order").bind("agg-1"),
        "existing_by_key" => q.bind(uuid::Uuid::new_v4()),
        "claim_batch" | "claim_batch_ordered" => {
            q.bind(100_i64).bind(30_000_000_i64).bind("explain")
        }
        "complete" | "release" => q.bind(1_i64).bind(1_i64),
        "exhaust_undecodable" => q.bind(1_i64).bind(1_i64).bind("undecodable payload"),
        "complete_many" | "complete_many_delete" => q
            .bind((1..=100).collect::<Vec<i64>>())
            .bind(vec![1_i64; 100]),
        "completed_earlier" => q
            .bind((1..=100).collect::<Vec<i64>>())
            .bind(vec![1_i64; 100])
            .bind(true),
        "renew" => q.bind(1_i64).bind(1_i64).bind(30_000_000_i64),
        "lock_free_rows" => q.bind((1..=100).collect::<Vec<i64>>()),
        "renew_many" => q
            .bind((1..=100).collect::<Vec<i64>>())
            .bind(vec![1_i64; 100])
            .bind(30_000_000_i64),
        "fail" => q
            .bind(1_i64)
            .bind(1_i64)
            .bind("boom")
            .bind(1_000_000_i64)
            .bind(false),
        "recover_expired" => q
            .bind(1000_i64)
            .bind(1_000_000_i64)
            .bind(300_000_000_i64)
            .bind(true),
        "count_delivered" | "gauges" => q,
        "retry_exhausted" => q.bind(uuid::Uuid::new_v4()),
        "retry_exhausted_of_type" => q.bind("note"),
        "exhausted_events" => q.bind(50_i64),
        "purge_delivered" => q.bind(3_600_000_000_i64).bind(1000_i64),
        "list_events" => q.bind(10_000_i64),
        "make_delayed_due" => q,
        other => panic!(
            "statement `{other}` has no EXPLAIN arguments in tests/store_schema.rs: add them"
        ),
    }
}

/// The indexes a statement may use (one of them must appear in its plan, and it must not scan
/// the table).
fn expected_indexes(name: &str) -> &'static [&'static str] {
    match name {
        "claim_batch" | "claim_batch_ordered" => &["outbox_open_idx"],
        "recover_expired" => &["outbox_open_idx"],
        "purge_delivered" => &["outbox_purge_idx"],
        "existing_by_key" => &["outbox_event_id_key"],
        // An INSERT's plan names no index; its conflict check can only use the unique indexes,
        // and the test below asserts those are the primary key and event_id's.
        "enqueue" | "enqueue_notify" => &[],
        // Reads no table: a lock on a hash of the aggregate, seeded with the table's oid.
        "lock_aggregate" => &[],
        "complete" | "release" | "renew" | "fail" | "exhaust_undecodable" => &["outbox_pkey"],
        // A batch must be joined by primary key (checked below: never through another index).
        "complete_many" | "complete_many_delete" | "renew_many" => &["outbox_pkey"],
        "completed_earlier" | "lock_free_rows" => &["outbox_pkey"],
        "retry_exhausted" => &["outbox_event_id_key"],
        "retry_exhausted_of_type" | "exhausted_events" => &["outbox_exhausted_idx"],
        // Checked below: the delivered count may scan (delivered rows are most of the table).
        "count_delivered" => &[],
        "gauges" => &["outbox_open_idx"],
        // The test kit's statements: a listing in id order, and delayed events made due.
        "list_events" => &["outbox_pkey"],
        "make_delayed_due" => &["outbox_open_idx"],
        _ => &[],
    }
}

#[tokio::test]
async fn every_statement_uses_its_index_on_a_large_table() {
    let db = TestDatabase::new().await;
    // 200,000 delivered, 10,000 pending (a tenth of them in 1,000 aggregates), 1,000
    // processing (half with expired leases), 100 exhausted.
    bulk_insert(db.pool(), "delivered", 200_000, "delivered").await;
    bulk_insert(db.pool(), "pending", 10_000, "pending").await;
    bulk_insert(db.pool(), "processing", 1_000, "processing").await;
    bulk_insert(db.pool(), "exhausted", 100, "exhausted").await;
    sqlx::query(
        "UPDATE outbox SET aggregate_type = 'order', aggregate_id = 'agg-' || (id % 1000)
         WHERE status = 'pending' AND id % 10 = 0",
    )
    .execute(db.pool())
    .await
    .unwrap();
    sqlx::query(
        "UPDATE outbox SET claim_version = 1, attempts = 1, claimed_by = 'w',
                lease_until = now() + CASE WHEN id % 2 = 0 THEN interval '-1 minute' ELSE interval '1 minute' END
         WHERE status = 'processing'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    sqlx::query("ANALYZE outbox")
        .execute(db.pool())
        .await
        .unwrap();

    let mut report = String::new();
    let mut wrong = Vec::new();
    for &(name, template) in STATEMENTS {
        let sql = template.replace(TABLE_PLACEHOLDER, "outbox");
        let explain = format!("EXPLAIN {sql}");
        let rows = bind_for(name, sqlx::query(sqlx::AssertSqlSafe(explain)))
            .fetch_all(db.pool())
            .await
            .unwrap();
        let plan: String = rows.iter().map(|r| r.get::<String, _>(0) + "\n").collect();
        report.push_str(&format!("--- {name}\n{plan}\n"));

        let batched = ["complete_many", "complete_many_delete", "renew_many"].contains(&name);
        if batched && plan.contains("outbox_open_idx") {
            wrong.push(format!(
                "{name} goes through the open index (O(in-flight x batch))"
            ));
        }
        let indexes = expected_indexes(name);
        if !indexes.is_empty() {
            if !indexes.iter().any(|i| plan.contains(i)) {
                wrong.push(format!("{name} uses none of {indexes:?}"));
            }
            if plan.contains("Seq Scan on outbox") {
                wrong.push(format!("{name} scans the table"));
            }
        }
    }
    println!(
        "EXPLAIN of every store statement on 200k delivered / 10k pending / 1k processing rows:\n\n{report}"
    );
    assert!(wrong.is_empty(), "{wrong:?}");
    let stats = report
        .split("--- ")
        .find(|s| s.starts_with("gauges"))
        .unwrap();
    for index in ["outbox_open_idx", "outbox_exhausted_idx"] {
        assert!(
            stats.contains(index),
            "the gauges should count through {index}:\n{stats}"
        );
    }
    // The enqueue's conflict check (ON CONFLICT (event_id) DO NOTHING) is event_id's index;
    // there must be exactly the primary key and event_id's, so a non-HOT write updates no
    // second unique index and the key's uniqueness is event_id's.
    let unique: Vec<String> = sqlx::query_scalar(
        "SELECT indexrelid::regclass::text FROM pg_index
         WHERE indrelid = 'outbox'::regclass AND indisunique ORDER BY 1",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(unique, ["outbox_event_id_key", "outbox_pkey"]);
    // The ordered claim checks earlier events through the aggregate index.
    let ordered = report
        .split("--- ")
        .find(|s| s.starts_with("claim_batch_ordered"))
        .unwrap();
    assert!(
        ordered.contains("outbox_aggregate_idx"),
        "ordered claim plan:\n{ordered}"
    );
}

/// The batched fences must reach the table through one primary-key scan over the batch's ids,
/// and join the pairs once, even when the statistics say nothing is in flight. Statistics taken
/// while every row was pending (the usual state after a burst of enqueues, with autovacuum off
/// or lagging) make the planner estimate one `processing` row. With the fence spelled as two
/// plain predicates, a 1,024-pair batch then scanned the whole table and joined every in-flight
/// row against every pair (O(in-flight x batch): measured at 5-9 s a statement, 756 events/s, in
/// the completion-batch sweep); and with only the id probe added, a 512-pair batch rescanned the
/// pairs once per row found (O(batch^2), a Join Filter: 49 ms instead of 4 ms, which halved the
/// default drain).
#[tokio::test]
async fn a_full_batch_probes_the_primary_key_under_statistics_taken_while_all_pending() {
    let db = TestDatabase::new().await;
    bulk_insert(db.pool(), "pending", 50_000, "pending").await;
    sqlx::query("ANALYZE outbox")
        .execute(db.pool())
        .await
        .unwrap();
    // Now the truth: 5,000 rows in flight and 5,000 delivered that the statistics do not know of.
    sqlx::query(
        "UPDATE outbox SET status = 'processing', claim_version = 1, attempts = 1,
                claimed_by = 'w', lease_until = now() + interval '1 minute'
         WHERE id <= 5000",
    )
    .execute(db.pool())
    .await
    .unwrap();
    sqlx::query(
        "UPDATE outbox SET status = 'delivered', claim_version = 1, attempts = 1,
                delivered_at = now()
         WHERE id > 5000 AND id <= 10000",
    )
    .execute(db.pool())
    .await
    .unwrap();

    let mut wrong = Vec::new();
    let mut report = String::new();
    for pairs in [512_i64, 1024] {
        for &(name, template) in STATEMENTS {
            let first = match name {
                "complete_many" | "complete_many_delete" | "renew_many" => 1,
                "completed_earlier" => 5001,
                _ => continue,
            };
            let ids: Vec<i64> = (first..first + pairs).collect();
            let versions = vec![1_i64; ids.len()];
            let sql = format!("EXPLAIN {}", template.replace(TABLE_PLACEHOLDER, "outbox"));
            let q = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(ids)
                .bind(versions);
            let q = match name {
                "renew_many" => q.bind(30_000_000_i64),
                "completed_earlier" => q.bind(false),
                _ => q,
            };
            let plan: String = q
                .fetch_all(db.pool())
                .await
                .unwrap()
                .iter()
                .map(|r| r.get::<String, _>(0) + "\n")
                .collect();
            // One primary-key scan over the ids, and no join that compares every row it found
            // against every pair.
            let probes_the_ids = plan.contains("outbox_pkey") && plan.contains("(id = ANY (");
            if plan.contains("Seq Scan on outbox")
                || plan.contains("Join Filter")
                || !probes_the_ids
            {
                wrong.push(format!("{name} ({pairs} pairs)"));
            }
            report.push_str(&format!("--- {name}, {pairs} pairs\n{plan}\n"));
        }
    }
    println!(
        "EXPLAIN of the batched statements, 50k rows analysed while all pending, then 5k in \
         flight and 5k delivered:\n\n{report}"
    );
    assert_eq!(
        report.matches("--- ").count(),
        8,
        "every batched statement was explained at both sizes:\n{report}"
    );
    assert!(
        wrong.is_empty(),
        "{wrong:?} do not reach the table through one primary-key scan over the ids and one \
         join of the pairs:\n{report}"
    );
}

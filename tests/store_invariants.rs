//! The invariants the database keeps for every writer, not only the library's enqueue: an
//! event inserted by any SQL gets its queue row, a queue row cannot outlive its event
//! (`store/sql/create_queue_invariants.sql`); `outbox_enqueue(...)`, the supported enqueue for
//! producers outside Rust (`migrations/0006_sql_enqueue.sql`); and `outbox doctor`, which finds
//! the rows that break the invariants anyway and mends them.

mod store_support;

use std::time::Duration;

use outbox_runtime::cli::{Exit, Outbox};
use outbox_runtime::store::enqueue::event_id_for;
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::{Event, Store};
use sqlx::PgPool;
use store_support::{Note, OrderPlaced};

const LEASE: Duration = Duration::from_secs(30);

/// An event inserted by plain SQL, the way another program or psql writes one.
const RAW_INSERT: &str = "INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload)
     VALUES (gen_random_uuid(), $1, '\\x00', 'note', 1, '{\"text\": \"raw\"}')";

async fn queue_rows(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_queue")
        .fetch_one(pool)
        .await
        .unwrap()
}

fn sqlstate(error: &sqlx::Error) -> Option<String> {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned())
}

/// Before the invariants, this event read as delivered at once and was purged undelivered.
#[tokio::test]
async fn an_event_inserted_by_sql_is_queued_and_delivered() {
    let db = TestDatabase::new().await;
    sqlx::query(RAW_INSERT)
        .bind("raw-1")
        .execute(db.pool())
        .await
        .unwrap();
    // COPY and multi-row inserts too: one statement, every row.
    sqlx::query(
        "INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload)
         SELECT gen_random_uuid(), 'raw-many-' || g, '\\x00', 'note', 1, jsonb_build_object('text', 'many ' || g)
         FROM generate_series(1, 3) AS g",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let store = Store::new(db.pool().clone());
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.pending, stats.delivered), (4, 0));
    let claimed = store.claim_batch("w", 10, LEASE, false).await.unwrap();
    let mut texts: Vec<&str> = claimed
        .iter()
        .map(|c| c.payload["text"].as_str().unwrap())
        .collect();
    texts.sort_unstable();
    assert_eq!(texts, ["many 1", "many 2", "many 3", "raw"]);
    for c in &claimed {
        store.complete_if_owned(c.claim()).await.unwrap();
    }
    assert_eq!(store.stats().await.unwrap().delivered, 4);
}

/// The typed enqueue writes its own queue row (its attempts and delay) in the same statement;
/// the trigger leaves it alone.
#[tokio::test]
async fn the_typed_enqueue_keeps_its_own_queue_row() {
    let db = TestDatabase::new().await;
    let options = outbox_runtime::store::EnqueueOptions {
        max_attempts: 3,
        delay: Duration::from_secs(3600),
        ..Default::default()
    };
    let mut tx = db.pool().begin().await.unwrap();
    Note { text: "t".into() }
        .enqueue_with(&mut tx, "typed", &options)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let (rows, max_attempts, delayed): (i64, i32, bool) = sqlx::query_as(
        "SELECT count(*), max(max_attempts), bool_and(available_at > now() + interval '50 minutes')
         FROM outbox_queue",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!((rows, max_attempts, delayed), (1, 3, true));
}

/// Before the foreign key, the queue row stayed, was claimed and charged until exhausted.
#[tokio::test]
async fn deleting_an_event_deletes_its_delivery_state_and_no_queue_row_is_orphaned() {
    let db = TestDatabase::new().await;
    let mut tx = db.pool().begin().await.unwrap();
    Note { text: "a".into() }
        .enqueue(&mut tx, "to-delete")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(queue_rows(db.pool()).await, 1);
    sqlx::query("DELETE FROM outbox WHERE operation_key = 'to-delete'")
        .execute(db.pool())
        .await
        .unwrap();
    assert_eq!(queue_rows(db.pool()).await, 0);
    let store = Store::new(db.pool().clone());
    assert!(
        store
            .claim_batch("w", 10, LEASE, false)
            .await
            .unwrap()
            .is_empty()
    );

    let orphan = sqlx::query("INSERT INTO outbox_queue (id) VALUES (424242)")
        .execute(db.pool())
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&orphan).as_deref(), Some("23503"), "{orphan}");
    let truncate = sqlx::query("TRUNCATE outbox")
        .execute(db.pool())
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&truncate).as_deref(), Some("0A000"), "{truncate}");
}

/// `outbox_enqueue` derives the same event id as the Rust side, around every SHA-1 block
/// boundary and with multi-byte keys.
#[tokio::test]
async fn outbox_enqueue_derives_the_typed_event_id() {
    let db = TestDatabase::new().await;
    let mut keys: Vec<String> = (0..=140).map(|n| "k".repeat(n)).collect();
    keys.extend(["café/42", "📦 order 7", "a'b\"c\\d", "ключ"].map(str::to_owned));
    for table in ["outbox", "orders_outbox"] {
        let derived: Vec<uuid::Uuid> =
            sqlx::query_scalar("SELECT outbox_event_id($1, k) FROM unnest($2::text[]) AS k")
                .bind(table)
                .bind(&keys)
                .fetch_all(db.pool())
                .await
                .unwrap();
        let expected: Vec<uuid::Uuid> = keys.iter().map(|k| event_id_for(table, k)).collect();
        assert_eq!(derived, expected, "{table}");
    }
}

#[tokio::test]
async fn outbox_enqueue_writes_one_event_per_key_and_refuses_a_reused_key() {
    let db = TestDatabase::new().await;
    let enqueue = "SELECT outbox_enqueue('outbox', $1, 'note', 1, $2::jsonb, max_attempts => 4)";
    let first: uuid::Uuid = sqlx::query_scalar(enqueue)
        .bind("sql-1")
        .bind(r#"{"text": "from sql"}"#)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(first, event_id_for("outbox", "sql-1"));
    // The same key and payload (keys in another order): the same event, nothing new.
    let again: uuid::Uuid = sqlx::query_scalar(enqueue)
        .bind("sql-1")
        .bind(r#"{ "text" : "from sql" }"#)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(again, first);
    let reused = sqlx::query_scalar::<_, uuid::Uuid>(enqueue)
        .bind("sql-1")
        .bind(r#"{"text": "something else"}"#)
        .fetch_one(db.pool())
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&reused).as_deref(), Some("23505"), "{reused}");
    assert!(
        reused
            .to_string()
            .contains("operation key 'sql-1' is already used by event"),
        "{reused}"
    );

    // Delivered like any event, to a typed handler's type.
    let store = Store::new(db.pool().clone());
    let claimed = store.claim_batch("w", 10, LEASE, false).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!((claimed[0].event_id, claimed[0].max_attempts), (first, 4));
    let note: Note = serde_json::from_value(claimed[0].payload.clone()).unwrap();
    assert_eq!(note.text, "from sql");

    // Bad input: a clear error, nothing written.
    for (args, expected) in [
        ("'orders', 'k', 'note', 1, '{}'", "does not exist"),
        (
            "'outbox', 'k', 'Bad Name', 1, '{}'",
            "event type 'Bad Name' is not a valid event name",
        ),
        (
            "'outbox', '', 'note', 1, '{}'",
            "the operation key must be 1 to 1024 bytes",
        ),
        (
            "'outbox', 'k', 'note', 0, '{}'",
            "event version must be 1 or more",
        ),
        ("'outbox', 'k', 'note', 1, NULL", "the payload is null"),
    ] {
        let error = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT outbox_enqueue({args})"
        )))
        .execute(db.pool())
        .await
        .unwrap_err();
        assert!(error.to_string().contains(expected), "{args}: {error}");
    }
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(events, 1);
}

/// The aggregate lock is taken, also without an aggregate type (grouped under the event type,
/// as the typed enqueue does), so a second producer of the aggregate waits for the first; and
/// it is the typed enqueue's lock, so SQL and Rust producers of one aggregate are ordered
/// together. Before, the documented recipe locked `NULL` for such rows: no lock at all.
#[tokio::test]
async fn outbox_enqueue_takes_the_aggregate_lock_of_the_typed_enqueue() {
    let db = TestDatabase::new().await;
    let mut first = db.pool().begin().await.unwrap();
    sqlx::query("SELECT outbox_enqueue('outbox', 'a-1', 'note', 1, '{}', aggregate_id => 'agg-1')")
        .execute(&mut *first)
        .await
        .unwrap();
    let mut second = db.pool().begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '300ms'")
        .execute(&mut *second)
        .await
        .unwrap();
    let waited = sqlx::query(
        "SELECT outbox_enqueue('outbox', 'a-2', 'note', 1, '{}', aggregate_type => NULL, aggregate_id => 'agg-1')",
    )
    .execute(&mut *second)
    .await
    .unwrap_err();
    assert_eq!(sqlstate(&waited).as_deref(), Some("55P03"), "{waited}");
    second.rollback().await.unwrap();
    // Another aggregate does not wait.
    sqlx::query("SELECT outbox_enqueue('outbox', 'b-1', 'note', 1, '{}', aggregate_id => 'agg-2')")
        .execute(db.pool())
        .await
        .unwrap();
    first.commit().await.unwrap();

    // The typed enqueue of `order_placed` for order o-9 and the SQL enqueue of the same
    // aggregate take one lock.
    let mut sql = db.pool().begin().await.unwrap();
    sqlx::query(
        "SELECT outbox_enqueue('outbox', 'o-9-sql', 'order_placed', 1, '{\"order_id\": \"o-9\", \"total_cents\": 1}',
                               aggregate_type => 'order', aggregate_id => 'o-9')",
    )
    .execute(&mut *sql)
    .await
    .unwrap();
    let mut typed = db.pool().begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '300ms'")
        .execute(&mut *typed)
        .await
        .unwrap();
    let waited = OrderPlaced {
        order_id: "o-9".into(),
        total_cents: 2,
    }
    .enqueue(&mut typed, "o-9-typed")
    .await
    .unwrap_err();
    assert!(waited.to_string().contains("lock"), "{waited}");
    sql.commit().await.unwrap();
}

async fn doctor(db: &TestDatabase, extra: &[&str]) -> (Exit, String, String) {
    let url = db.url();
    let mut args = vec!["outbox", "doctor", "--database-url", url.as_str()];
    args.extend_from_slice(extra);
    let mut out = Vec::new();
    let mut err = Vec::new();
    let exit = Outbox::new()
        .events(Vec::new())
        .run_with(args, &mut out, &mut err)
        .await;
    (
        exit,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

/// Rows written while the invariants were off (a superuser's session_replication_role, a
/// disabled trigger, or a table from before them) are found, told apart from delivered events,
/// and mended on request.
#[tokio::test]
async fn doctor_finds_never_claimed_events_and_orphan_queue_rows_and_mends_them() {
    let db = TestDatabase::new().await;
    let (exit, out, err) = doctor(&db, &[]).await;
    assert_eq!(exit, Exit::Ok, "{out}{err}");
    assert!(
        out.contains("ok       every inserted event gets its queue row"),
        "{out}"
    );

    // A delivered event (typed enqueue, claimed, completed): healthy, never listed.
    let mut tx = db.pool().begin().await.unwrap();
    Note {
        text: "delivered".into(),
    }
    .enqueue(&mut tx, "delivered")
    .await
    .unwrap();
    Note {
        text: "doomed".into(),
    }
    .enqueue(&mut tx, "doomed")
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let store = Store::new(db.pool().clone());
    for c in store.claim_batch("w", 10, LEASE, false).await.unwrap() {
        if c.payload["text"] == "delivered" {
            store.complete_if_owned(c.claim()).await.unwrap();
        }
    }
    // Everything off, as a superuser can: a raw event without its queue row, and an event
    // deleted from under its queue row.
    let mut conn = db.pool().acquire().await.unwrap();
    for statement in [
        "ALTER TABLE outbox DISABLE TRIGGER outbox_queue_new_events",
        "ALTER TABLE outbox_queue DISABLE TRIGGER ALL",
        "ALTER TABLE outbox DISABLE TRIGGER ALL",
    ] {
        sqlx::query(statement).execute(&mut *conn).await.unwrap();
    }
    sqlx::query(RAW_INSERT)
        .bind("never-claimed")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("DELETE FROM outbox WHERE operation_key = 'doomed'")
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);
    let stats = store.stats().await.unwrap();
    assert_eq!(
        stats.delivered, 2,
        "the raw event reads as delivered: the lie the doctor finds"
    );

    let (exit, out, err) = doctor(&db, &[]).await;
    assert_eq!(exit, Exit::Failed, "{out}");
    assert!(err.contains("does not keep every invariant"), "{err}");
    assert!(
        out.contains("OFF      every inserted event gets its queue row"),
        "{out}"
    );
    assert!(
        out.contains("OFF      a queue row cannot outlive its event"),
        "{out}"
    );
    assert!(
        out.contains("FOUND    1 queue rows without their event"),
        "{out}"
    );
    assert!(
        out.contains("FOUND    1 events that read as delivered"),
        "{out}"
    );
    assert!(out.contains("key never-claimed"), "{out}");
    assert!(!out.contains("key delivered"), "{out}");
    let (_, json, _) = doctor(&db, &["--json"]).await;
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["tables"][0]["never_claimed_events"], 1, "{json}");
    assert_eq!(json["tables"][0]["orphan_queue_rows"], 1, "{json}");

    // Back on, then mended: the orphan deleted, the raw event queued and delivered.
    for statement in [
        "ALTER TABLE outbox ENABLE TRIGGER ALL",
        "ALTER TABLE outbox_queue ENABLE TRIGGER ALL",
    ] {
        sqlx::query(statement).execute(db.pool()).await.unwrap();
    }
    let (exit, out, err) = doctor(&db, &["--repair", "--requeue"]).await;
    assert_eq!(exit, Exit::Ok, "{out}{err}");
    assert!(
        out.contains("deleted 1 queue rows without an event")
            && out.contains("queued 1 events that were never claimed"),
        "{out}"
    );
    let claimed = store.claim_batch("w", 10, LEASE, false).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].payload["text"], "raw");
}

/// A table upgraded with orphans in its queue keeps its foreign key NOT VALID (the migration
/// does not fail), and `doctor --repair` validates it once they are gone.
#[tokio::test]
async fn doctor_repair_validates_a_key_the_upgrade_left_not_valid() {
    let db = TestDatabase::new().await;
    let mut conn = db.pool().acquire().await.unwrap();
    sqlx::query("ALTER TABLE outbox_queue DROP CONSTRAINT outbox_queue_event_fk")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO outbox_queue (id) VALUES (777)")
        .execute(&mut *conn)
        .await
        .unwrap();
    // The upgrade again, as a migration on a table with an orphan.
    let upgrade = outbox_runtime::store::upgrade_queue_invariants_sql("outbox").unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(upgrade))
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);
    let (exit, out, _) = doctor(&db, &[]).await;
    assert_eq!(exit, Exit::Failed, "{out}");
    assert!(out.contains("is not validated"), "{out}");
    let (exit, out, err) = doctor(&db, &["--repair"]).await;
    assert_eq!(exit, Exit::Ok, "{out}{err}");
    let valid: bool = sqlx::query_scalar(
        "SELECT convalidated FROM pg_constraint WHERE conname = 'outbox_queue_event_fk'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(valid);
}

/// The guide's example, run as it is written: the business change and the event in one
/// transaction, from SQL alone.
#[tokio::test]
async fn the_sql_enqueue_guide_example_runs_as_written() {
    let db = TestDatabase::new().await;
    let guide = include_str!("../docs/sql-enqueue.md");
    let start = guide.find("```sql\n").expect("the guide's example") + "```sql\n".len();
    let example = &guide[start..start + guide[start..].find("```").unwrap()];
    sqlx::raw_sql(
        "CREATE TABLE orders (id bigint PRIMARY KEY, status text); INSERT INTO orders VALUES (42, 'new')",
    )
    .execute(db.pool())
    .await
    .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(example.to_owned()))
        .execute(db.pool())
        .await
        .unwrap();
    let (status, event_id, aggregate): (String, uuid::Uuid, Option<String>) = sqlx::query_as(
        "SELECT q.status, e.event_id, q.aggregate_id
         FROM outbox e JOIN outbox_queue q USING (id), orders o
         WHERE o.id = 42 AND o.status = 'placed'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        (status.as_str(), event_id, aggregate.as_deref()),
        (
            "pending",
            event_id_for("outbox", "place-order/42"),
            Some("42")
        )
    );
}

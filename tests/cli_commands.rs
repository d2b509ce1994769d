//! The `outbox` command against a real database: each command's output, its exit code, and
//! the database state it leaves.

mod generate_support;

use std::time::Duration;

use generate_support::*;
use outbox_runtime::cli::{Exit, Outbox};
use outbox_runtime::generate::CompiledEvent;
use outbox_runtime::store::FailOutcome;
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::{Event, Store};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::Row;

/// Run `outbox <args>`; returns (exit, stdout, stderr).
async fn outbox(cli: &Outbox, args: &[&str]) -> (Exit, String, String) {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let argv = std::iter::once("outbox").chain(args.iter().copied());
    let exit = cli.run_with(argv, &mut out, &mut err).await;
    (
        exit,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

fn cli_for(dir: &TempDir, events: Vec<outbox_runtime::generate::CompiledEvent>) -> Outbox {
    Outbox::new().migrations_dir(dir.path()).events(events)
}

#[tokio::test]
async fn migrations_generate_and_check() {
    let dir = TempDir::new();
    let cli = cli_for(&dir, vec![order_confirmed_v1(), shipment_sent()]);
    let dir_arg = dir.path().to_str().unwrap();

    let (exit, _, err) = outbox(&cli, &["migrations", "check"]).await;
    assert_eq!(exit, Exit::Failed, "{err}");
    assert_eq!(exit.code(), 1);
    assert!(
        err.contains("stale: a new migration 0001_outbox_events.sql is needed"),
        "{err}"
    );
    assert!(
        err.contains("run `outbox migrations generate --dir"),
        "{err}"
    );

    let (exit, out, err) = outbox(&cli, &["migrations", "generate", "--dir", dir_arg]).await;
    assert_eq!(exit, Exit::Ok, "{err}");
    assert!(
        out.contains("0001_outbox_events.sql") && out.contains("outbox.lock"),
        "{out}"
    );
    assert_eq!(dir.names(), ["0001_outbox_events.sql", "outbox.lock"]);

    let (exit, out, _) = outbox(&cli, &["migrations", "generate"]).await;
    assert_eq!(exit, Exit::Ok);
    assert!(out.contains("is up to date: nothing written"), "{out}");

    let (exit, out, _) = outbox(&cli, &["migrations", "check", "--dir", dir_arg]).await;
    assert_eq!(exit, Exit::Ok);
    assert!(out.contains("is up to date (2 event versions)"), "{out}");

    // The shape of a locked version changes without a bump.
    let mut changed = order_confirmed_v1();
    changed.contract.shape["properties"]["total_cents"] = json!({"type": "number"});
    let drifted = cli_for(&dir, vec![changed, shipment_sent()]);
    let before = dir.files();
    for command in ["generate", "check"] {
        let (exit, _, err) = outbox(&drifted, &["migrations", command]).await;
        assert_eq!(exit, Exit::Failed, "{command}: {err}");
        assert!(
            err.contains("event `order.confirmed` version 1 changed shape without a version bump"),
            "{err}"
        );
        assert!(
            err.contains("field `total_cents` changed type from \"integer\" to \"number\""),
            "{err}"
        );
    }
    assert_eq!(dir.files(), before);

    // An unreadable lock is a folder error.
    dir.write("outbox.lock", "{ not json");
    let (exit, _, err) = outbox(&cli, &["migrations", "check"]).await;
    assert_eq!((exit, exit.code()), (Exit::Files, 4), "{err}");
    assert!(err.contains("outbox.lock is not a contract lock"), "{err}");
}

#[tokio::test]
async fn migrate_applies_the_base_schema_and_the_service_folder() {
    let db = TestDatabase::empty(2).await;
    let url = db.url();
    let dir = TempDir::new();
    dir.write(
        "0001_orders.sql",
        "CREATE TABLE orders (id bigint PRIMARY KEY);\n",
    );
    let cli = cli_for(&dir, vec![order_confirmed_v1(), shipment_sent()]);
    assert_eq!(outbox(&cli, &["migrations", "generate"]).await.0, Exit::Ok);

    for run in 0..2 {
        let (exit, out, err) = outbox(&cli, &["migrate", "--database-url", &url]).await;
        assert_eq!(exit, Exit::Ok, "run {run}: {err}");
        assert!(out.contains("base schema: up to date"), "{out}");
        assert!(out.contains("(2 files)"), "{out}");
        assert!(
            out.contains(
                "contract registry: agrees with this binary (2 compiled, 0 not registered)"
            ),
            "{out}"
        );
    }

    let service: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY 1")
        .fetch_all(db.pool())
        .await
        .unwrap();
    assert_eq!(service, [1, 2]);
    let base: i64 = sqlx::query_scalar("SELECT count(*) FROM _outbox_migrations")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(
        base as usize,
        outbox_runtime::migrate::MIGRATOR.iter().count()
    );
    let registered: Vec<String> = sqlx::query_scalar(
        "SELECT event_type || ' v' || event_version FROM outbox_contracts ORDER BY 1",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(registered, ["order.confirmed v1", "shipment.sent v1"]);
    let shipping: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.tables WHERE table_name IN ('shipping_outbox', 'shipping_outbox_queue')",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(shipping, 2, "the event table and its queue table");

    // A binary whose contract drifted from what the database registered: exit 1.
    let mut changed = order_confirmed_v1();
    changed.contract.shape["properties"]["total_cents"] = json!({"type": "number"});
    let drifted = Outbox::new()
        .migrations_dir(dir.path())
        .events(vec![changed]);
    let (exit, _, err) = outbox(&drifted, &["migrate", "--database-url", &url]).await;
    assert_eq!(exit, Exit::Failed, "{err}");
    assert!(
        err.contains("contract mismatch: event `order.confirmed` version 1 is registered"),
        "{err}"
    );
}

/// Three parcels: one delivered, one exhausted (permanent failure), one pending.
async fn seed(db: &TestDatabase) -> (uuid::Uuid, uuid::Uuid, uuid::Uuid) {
    let ids = enqueue_parcels(db.pool(), "p", 3).await;
    let store = Store::new(db.pool().clone());
    let claimed = store
        .claim_batch("test-worker", 2, Duration::from_secs(60), false)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    let (first, second) = (&claimed[0], &claimed[1]);
    store.complete_if_owned(first.claim()).await.unwrap();
    let failed = store
        .fail_if_owned(
            second.claim(),
            "receiver said 422:\naddress unknown",
            Duration::from_secs(1),
            true,
        )
        .await
        .unwrap();
    assert_eq!(failed, FailOutcome::Exhausted);
    let pending = ids
        .iter()
        .copied()
        .find(|id| *id != first.event_id && *id != second.event_id)
        .unwrap();
    (first.event_id, second.event_id, pending)
}

#[tokio::test]
async fn status_for_people_and_for_scripts() {
    let db = TestDatabase::new().await;
    let url = db.url();
    let (_, exhausted, _) = seed(&db).await;
    let cli = Outbox::new().events(vec![parcel_event()]);

    let (exit, out, err) = outbox(&cli, &["status", "--database-url", &url]).await;
    assert_eq!(exit, Exit::Ok, "{err}");
    let line = |label: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(out.starts_with("table outbox\n"), "{out}");
    assert_eq!(
        line("pending")
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>(),
        ["pending", "1"],
        "{out}"
    );
    assert!(line("pending").contains("oldest "), "{out}");
    assert_eq!(
        line("processing").split_whitespace().collect::<Vec<_>>(),
        ["processing", "0"]
    );
    assert_eq!(
        line("delivered").split_whitespace().collect::<Vec<_>>(),
        ["delivered", "1"]
    );
    assert_eq!(
        line("exhausted ").split_whitespace().collect::<Vec<_>>(),
        ["exhausted", "1"]
    );
    let row = out
        .lines()
        .find(|l| l.contains(&exhausted.to_string()))
        .expect("the exhausted event is listed");
    assert!(
        row.contains("parcel.sent") && row.contains("receiver said 422: address unknown"),
        "{row}"
    );

    let (exit, out, _) = outbox(&cli, &["status", "--json", "--database-url", &url]).await;
    assert_eq!(exit, Exit::Ok);
    let v: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
    let t = &v["tables"][0];
    assert_eq!(t["table"], "outbox");
    assert_eq!(
        (t["pending"].as_i64(), t["processing"].as_i64()),
        (Some(1), Some(0))
    );
    assert_eq!(
        (t["delivered"].as_i64(), t["exhausted"].as_i64()),
        (Some(1), Some(1))
    );
    assert!(t["oldest_pending_age_seconds"].as_f64().unwrap() >= 0.0);
    let e = &t["exhausted_events"][0];
    assert_eq!(e["event_id"], exhausted.to_string());
    assert_eq!(e["event_type"], "parcel.sent");
    assert_eq!(e["attempts"], 1);
    assert_eq!(e["handler_failures"], 1);
    assert_eq!(e["last_error"], "receiver said 422:\naddress unknown");
}

#[tokio::test]
async fn retry_one_event_or_all_of_a_type() {
    let db = TestDatabase::new().await;
    let url = db.url();
    let (delivered, exhausted, _) = seed(&db).await;
    let cli = Outbox::new().events(vec![parcel_event()]);

    let (exit, out, err) = outbox(
        &cli,
        &["retry", &exhausted.to_string(), "--database-url", &url],
    )
    .await;
    assert_eq!(exit, Exit::Ok, "{err}");
    assert!(
        out.contains(&format!(
            "event {exhausted} in table outbox is pending again"
        )),
        "{out}"
    );
    let row = sqlx::query(
        "SELECT q.status, q.attempts FROM outbox e JOIN outbox_queue q ON q.id = e.id WHERE e.event_id = $1",
    )
        .bind(exhausted)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<String, _>("status"),
            row.get::<i32, _>("attempts")
        ),
        ("pending".to_owned(), 0)
    );

    // Not exhausted (any more, or ever): exit 1, the error says where the event is, and
    // nothing changes.
    for (id, whereabouts) in [
        (exhausted, "it is pending in table outbox".to_owned()),
        (delivered, "it is delivered in table outbox".to_owned()),
        (
            uuid::Uuid::new_v4(),
            "no event has that id there".to_owned(),
        ),
    ] {
        let (exit, _, err) =
            outbox(&cli, &["retry", &id.to_string(), "--database-url", &url]).await;
        assert_eq!(exit, Exit::Failed, "{err}");
        assert!(
            err.contains(&format!(
                "no exhausted event {id} in table outbox: {whereabouts}"
            )),
            "{err}"
        );
    }
    let delivered_status: String = sqlx::query_scalar(
        "SELECT coalesce(q.status, 'delivered') FROM outbox e LEFT JOIN outbox_queue q ON q.id = e.id \
         WHERE e.event_id = $1",
    )
    .bind(delivered)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(delivered_status, "delivered");

    // Exhaust both pending parcels, then retry the type.
    let store = Store::new(db.pool().clone());
    for claimed in store
        .claim_batch("w", 10, Duration::from_secs(60), false)
        .await
        .unwrap()
    {
        store
            .fail_if_owned(claimed.claim(), "down", Duration::ZERO, true)
            .await
            .unwrap();
    }
    let (exit, out, err) = outbox(
        &cli,
        &["retry", "--type", "parcel.sent", "--database-url", &url],
    )
    .await;
    assert_eq!(exit, Exit::Ok, "{err}");
    assert_eq!(
        out,
        "2 exhausted events of type parcel.sent in table outbox are pending again with fresh attempts\n"
    );
    let exhausted_left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_queue WHERE status = 'exhausted'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(exhausted_left, 0);
}

#[tokio::test]
async fn purge_deletes_only_delivered_events_past_the_age() {
    let db = TestDatabase::new().await;
    let url = db.url();
    let (delivered, _, _) = seed(&db).await;
    // A second delivered event, enqueued eight days ago by the database clock (the retention
    // counts from the enqueue).
    let old = enqueue_parcels(db.pool(), "old", 1).await[0];
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "UPDATE outbox SET created_at = now() - interval '8 days' WHERE event_id = '{old}';
         DELETE FROM outbox_queue WHERE id = (SELECT id FROM outbox WHERE event_id = '{old}');"
    )))
    .execute(db.pool())
    .await
    .unwrap();
    let cli = Outbox::new().events(vec![parcel_event()]);

    let (exit, out, err) = outbox(
        &cli,
        &[
            "purge",
            "--older-than",
            "7d",
            "--batch",
            "1",
            "--database-url",
            &url,
        ],
    )
    .await;
    assert_eq!(exit, Exit::Ok, "{err}");
    assert_eq!(
        out,
        "deleted 1 delivered events older than 7d from outbox\n"
    );
    let left: Vec<(uuid::Uuid, String)> = sqlx::query_as(
        "SELECT e.event_id, coalesce(q.status, 'delivered') FROM outbox e \
             LEFT JOIN outbox_queue q ON q.id = e.id ORDER BY e.id",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(left.len(), 3, "{left:?}");
    assert!(!left.iter().any(|(id, _)| *id == old));
    assert!(
        left.iter()
            .any(|(id, status)| *id == delivered && status == "delivered")
    );
}

/// A parcel written to a second outbox table of the same binary.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "parcel.returned", version = 1, table = "returns_outbox")]
pub struct ParcelReturned {
    pub tracking: String,
}

/// Exhaust every pending event of `table` (claimed and failed for good).
async fn exhaust_all(pool: &sqlx::PgPool, table: &str) {
    let store = Store::for_table(pool.clone(), table).unwrap();
    for claimed in store
        .claim_batch("w", 100, Duration::from_secs(60), false)
        .await
        .unwrap()
    {
        store
            .fail_if_owned(claimed.claim(), "down", Duration::ZERO, true)
            .await
            .unwrap();
    }
}

/// The operator commands act on the table the event is in, as `status` shows every table: an
/// exhausted event of a second outbox table is found by `retry <id>` (which says the table),
/// `retry --type` and `purge` act on every table of the binary and report each, and an id found
/// nowhere names the tables searched and exits 1. Before, all three looked at `outbox` only:
/// `retry <id>` failed, and `retry --type` answered "0" with exit 0.
#[tokio::test]
async fn retry_and_purge_act_on_every_outbox_table_of_the_binary() {
    let db = TestDatabase::new().await;
    let url = db.url();
    sqlx::raw_sql(sqlx::AssertSqlSafe(
        outbox_runtime::store::create_table_sql("returns_outbox").unwrap(),
    ))
    .execute(db.pool())
    .await
    .unwrap();
    let returned = |n: usize| ParcelReturned {
        tracking: format!("r-{n}"),
    };
    let mut tx = db.pool().begin().await.unwrap();
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(
            returned(n)
                .enqueue(&mut tx, &format!("return/{n}"))
                .await
                .unwrap(),
        );
    }
    tx.commit().await.unwrap();
    exhaust_all(db.pool(), "returns_outbox").await;
    enqueue_parcels(db.pool(), "p", 1).await;
    let cli = Outbox::new().events(vec![
        parcel_event(),
        CompiledEvent {
            contract: ParcelReturned::contract(),
            table: ParcelReturned::TABLE.to_owned(),
        },
    ]);
    let queue_status = |id: uuid::Uuid| {
        let pool = db.pool().clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT coalesce(q.status, 'delivered') FROM returns_outbox e \
                 LEFT JOIN returns_outbox_queue q ON q.id = e.id WHERE e.event_id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };

    // One event, found in the second table without --table.
    let (exit, out, err) = outbox(
        &cli,
        &["retry", &ids[0].to_string(), "--database-url", &url],
    )
    .await;
    assert_eq!(exit, Exit::Ok, "{err}");
    assert_eq!(
        out,
        format!(
            "event {} in table returns_outbox is pending again with fresh attempts\n",
            ids[0]
        )
    );
    assert_eq!(queue_status(ids[0]).await, "pending");

    // An id in no table: exit 1, naming every table searched.
    let nowhere = uuid::Uuid::new_v4();
    let (exit, out, err) = outbox(
        &cli,
        &["retry", &nowhere.to_string(), "--database-url", &url],
    )
    .await;
    assert_eq!((exit, exit.code()), (Exit::Failed, 1), "{out}");
    assert!(
        err.contains(&format!(
            "no exhausted event {nowhere} in tables outbox, returns_outbox: no event has that id there"
        )) && err.contains("--table"),
        "{err}"
    );
    // With --table, only that table is searched, and the error says so.
    let (exit, _, err) = outbox(
        &cli,
        &[
            "retry",
            &ids[1].to_string(),
            "--table",
            "outbox",
            "--database-url",
            &url,
        ],
    )
    .await;
    assert_eq!(exit, Exit::Failed, "{err}");
    assert!(
        err.contains(&format!("no exhausted event {} in table outbox:", ids[1]))
            && err.contains("only the tables given with --table"),
        "{err}"
    );
    assert_eq!(queue_status(ids[1]).await, "exhausted");

    // Every exhausted event of the type, in whichever table it is, each table reported.
    let (exit, out, err) = outbox(
        &cli,
        &["retry", "--type", "parcel.returned", "--database-url", &url],
    )
    .await;
    assert_eq!(exit, Exit::Ok, "{err}");
    assert_eq!(
        out,
        "0 exhausted events of type parcel.returned in table outbox are pending again with fresh attempts\n\
         2 exhausted events of type parcel.returned in table returns_outbox are pending again with fresh attempts\n\
         2 in all, in 2 tables\n"
    );
    for id in &ids {
        assert_eq!(queue_status(*id).await, "pending");
    }

    // Purge: every table in turn. Deliver the returns, and date them eight days back.
    let store = Store::for_table(db.pool().clone(), "returns_outbox").unwrap();
    for claimed in store
        .claim_batch("w", 100, Duration::from_secs(60), false)
        .await
        .unwrap()
    {
        store.complete_if_owned(claimed.claim()).await.unwrap();
    }
    sqlx::query("UPDATE returns_outbox SET created_at = now() - interval '8 days'")
        .execute(db.pool())
        .await
        .unwrap();
    let (exit, out, err) = outbox(
        &cli,
        &["purge", "--older-than", "7d", "--database-url", &url],
    )
    .await;
    assert_eq!(exit, Exit::Ok, "{err}");
    assert_eq!(
        out,
        "deleted 0 delivered events older than 7d from outbox\n\
         deleted 3 delivered events older than 7d from returns_outbox\n\
         deleted 3 in all, from 2 tables\n"
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM returns_outbox")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(left, 0);
    let parcels: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(parcels, 1, "the pending parcel of `outbox` is kept");
}

#[tokio::test]
async fn usage_and_database_errors_have_their_own_exit_codes() {
    let db = TestDatabase::empty(2).await;
    let url = db.url();
    let cli = Outbox::new().events(vec![parcel_event()]);

    let (exit, out, _) = outbox(&cli, &["--help"]).await;
    assert_eq!(exit, Exit::Ok);
    for command in [
        "migrate",
        "migrations",
        "status",
        "retry",
        "purge",
        "grants",
    ] {
        assert!(out.contains(command), "--help lists {command}: {out}");
    }

    for args in [
        vec![],
        vec!["frobnicate"],
        vec!["retry"],
        vec!["purge", "--older-than", "7x"],
        vec!["status", "--limit", "many"],
    ] {
        let (exit, _, err) = outbox(&cli, &args).await;
        assert_eq!((exit, exit.code()), (Exit::Usage, 2), "{args:?}: {err}");
    }
    let (_, _, err) = outbox(&cli, &["purge", "--older-than", "7x"]).await;
    assert!(err.contains("`7x` is not a duration"), "{err}");

    let (exit, _, err) = outbox(
        &cli,
        &[
            "status",
            "--table",
            "x; DROP TABLE outbox",
            "--database-url",
            &url,
        ],
    )
    .await;
    assert_eq!(exit, Exit::Usage, "{err}");
    assert!(err.contains("is not a valid outbox table name"), "{err}");

    let (exit, _, err) = outbox(&cli, &["status", "--database-url", ""]).await;
    assert_eq!(exit, Exit::Usage, "{err}");
    assert!(
        err.contains("set DATABASE_URL or pass --database-url"),
        "{err}"
    );

    // Nothing listens on port 1 of the loopback interface.
    let (exit, _, err) = outbox(
        &cli,
        &[
            "status",
            "--database-url",
            "postgres://postgres@127.0.0.1:1/none",
        ],
    )
    .await;
    assert_eq!((exit, exit.code()), (Exit::Database, 3), "{err}");
    assert!(err.contains("cannot connect to the database"), "{err}");

    // An empty database (no schema): a database error that says what to run.
    let (exit, _, err) = outbox(&cli, &["status", "--database-url", &url]).await;
    assert_eq!(exit, Exit::Database, "{err}");
    assert!(
        err.contains(
            "the outbox table `outbox` does not exist in this database: run `outbox migrate`"
        ),
        "{err}"
    );

    // A negative limit is a usage error, before any connection.
    let (exit, _, err) = outbox(&cli, &["status", "--limit=-5", "--database-url", &url]).await;
    assert_eq!((exit, exit.code()), (Exit::Usage, 2), "{err}");
    assert!(err.contains("--limit"), "{err}");

    // Another database's URL is refused as such, without echoing it (it may hold a password).
    let (exit, _, err) = outbox(
        &cli,
        &[
            "status",
            "--database-url",
            "mysql://root:secret@127.0.0.1/shop",
        ],
    )
    .await;
    assert_eq!((exit, exit.code()), (Exit::Usage, 2), "{err}");
    assert!(
        err.contains("not a PostgreSQL URL (it starts with `mysql://`)"),
        "{err}"
    );
    assert!(!err.contains("secret"), "{err}");
}

/// A mistyped `--table` is told apart from a table not created yet; PostgreSQL's messages reach
/// the operator without the server's source position.
#[tokio::test]
async fn a_mistyped_table_and_a_failing_migration_say_what_is_wrong() {
    let db = TestDatabase::new().await;
    let url = db.url();
    let cli = Outbox::new().events(vec![parcel_event()]);
    for args in [
        vec!["status", "--table", "outbx"],
        vec!["retry", "--type", "parcel.sent", "--table", "outbx"],
        vec!["purge", "--older-than", "7d", "--table", "outbx"],
    ] {
        let mut args = args;
        args.extend(["--database-url", &url]);
        let (exit, _, err) = outbox(&cli, &args).await;
        assert_eq!((exit, exit.code()), (Exit::Database, 3), "{args:?}: {err}");
        assert!(
            err.contains("there is no table `outbx` in this database")
                && err.contains("check --table")
                && err.contains("outbox"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("outbox migrate"), "{args:?}: {err}");
    }

    let dir = TempDir::new();
    dir.write("0001_broken.sql", "CREATE TABLE (;\n");
    let (exit, _, err) = outbox(
        &cli_for(&dir, vec![parcel_event()]),
        &["migrate", "--database-url", &url],
    )
    .await;
    assert_eq!((exit, exit.code()), (Exit::Database, 3), "{err}");
    assert!(err.contains("SQLSTATE 42601"), "{err}");
    assert!(!err.contains(" at line "), "{err}");
}

/// A binary with no events linked (the `use my_crate as _;` line forgotten) refuses to
/// generate an empty lock, says why and how, and writes nothing.
#[tokio::test]
async fn generate_and_check_refuse_a_binary_without_events() {
    let dir = TempDir::new();
    let cli = cli_for(&dir, Vec::new());
    for command in ["generate", "check"] {
        let (exit, out, err) = outbox(&cli, &["migrations", command]).await;
        assert_eq!((exit, exit.code()), (Exit::Usage, 2), "{command}: {err}");
        assert!(
            err.contains("0 events are linked into this binary")
                && err.contains("as _;` to src/bin/outbox.rs"),
            "{command}: {err}"
        );
        assert!(!out.contains("review and commit"), "{out}");
    }
    assert!(dir.names().is_empty(), "nothing written: {:?}", dir.names());
}

/// The default folder, when relative, is found in the package's directory when run by Cargo
/// (which sets CARGO_MANIFEST_DIR, as for this test), not in the current directory; a missing
/// folder says so instead of only "stale".
#[tokio::test]
async fn the_default_folder_is_relative_to_the_package() {
    let cli = Outbox::new()
        .migrations_dir("no-such-migrations")
        .events(vec![parcel_event()]);
    let (exit, _, err) = outbox(&cli, &["migrations", "check"]).await;
    let expected = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("no-such-migrations");
    assert_eq!(exit, Exit::Failed, "{err}");
    assert!(
        err.contains(&format!(
            "the migrations folder {} does not exist",
            expected.display()
        )),
        "{err}"
    );
    assert!(err.contains("--dir"), "{err}");
}

/// `--help` ends with the exit code table, from the one place it is kept.
#[tokio::test]
async fn help_lists_the_exit_codes() {
    let (exit, out, _) = outbox(&Outbox::new(), &["--help"]).await;
    assert_eq!(exit, Exit::Ok);
    assert_eq!(out.matches("Exit codes:").count(), 1, "{out}");
    for code in Exit::ALL {
        assert!(
            out.contains(&format!("  {}  {}", code.code(), code.meaning())),
            "{out}"
        );
    }
}

#[tokio::test]
async fn grants_prints_sql_for_the_tables_the_events_name() {
    let cli = Outbox::new().events(vec![parcel_event(), shipment_sent()]);
    let (exit, out, err) = outbox(
        &cli,
        &[
            "grants",
            "--enqueuer",
            "shop_app",
            "--worker",
            "shop_worker",
        ],
    )
    .await;
    assert_eq!(exit, Exit::Ok, "{err}");
    assert!(
        out.contains("ON outbox TO shop_app;") && out.contains("ON shipping_outbox TO shop_app;"),
        "{out}"
    );
    assert!(
        out.contains("GRANT SELECT, DELETE ON shipping_outbox TO shop_worker;")
            && out.contains("GRANT SELECT, DELETE ON shipping_outbox_queue TO shop_worker;")
            && out.contains("ON shipping_outbox_queue TO shop_app;"),
        "both tables of each outbox table: {out}"
    );

    let (exit, _, err) = outbox(
        &cli,
        &[
            "grants",
            "--enqueuer",
            "app\"; DROP ROLE x; --",
            "--worker",
            "w",
        ],
    )
    .await;
    assert_eq!(exit, Exit::Usage, "{err}");
    assert!(err.contains("is not a usable role name"), "{err}");
}

/// `GRANT ... TO public` would give every role of the cluster the right to enqueue (or to
/// change delivery state); `current_user` and the like name whoever applies the migration.
#[tokio::test]
async fn grants_refuses_role_names_postgres_reads_specially() {
    let cli = Outbox::new().events(vec![parcel_event()]);
    for special in [
        "public",
        "current_user",
        "current_role",
        "session_user",
        "none",
        "user",
        "pg_write_all_data",
    ] {
        for args in [
            ["grants", "--enqueuer", special, "--worker", "shop_worker"],
            ["grants", "--enqueuer", "shop_app", "--worker", special],
        ] {
            let (exit, out, err) = outbox(&cli, &args).await;
            assert_eq!(exit, Exit::Usage, "{args:?}: {err}");
            assert!(out.is_empty(), "{args:?} printed SQL: {out}");
            assert!(
                err.contains(&format!("`{special}` is not a role of its own"))
                    && err.contains("create a dedicated role"),
                "{args:?}: {err}"
            );
        }
    }
}

/// The table name is checked before any connection: with nothing listening at the database
/// URL, a bad name still gets the table-name error (not "cannot connect").
#[tokio::test]
async fn status_validates_the_table_name_before_connecting() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let url = format!("postgres://postgres@127.0.0.1:{port}/none");
    let cli = Outbox::new();

    let (exit, _, err) = outbox(
        &cli,
        &[
            "status",
            "--table",
            "x; DROP TABLE outbox",
            "--database-url",
            &url,
        ],
    )
    .await;
    assert_eq!((exit, exit.code()), (Exit::Usage, 2), "{err}");
    assert!(err.contains("is not a valid outbox table name"), "{err}");
    assert!(!err.contains("cannot connect"), "{err}");

    // A good name does reach the (closed) port: the order of the checks is what the test shows.
    let (exit, _, err) = outbox(
        &cli,
        &["status", "--table", "outbox", "--database-url", &url],
    )
    .await;
    assert_eq!(exit, Exit::Database, "{err}");
    assert!(err.contains("cannot connect to the database"), "{err}");
}

/// A receiver's body ends up in `last_error`, and a row written by raw SQL can hold any event
/// type: `outbox status` must not hand either to the operator's terminal as control sequences
/// (an ANSI escape could recolour, retitle or rewrite the screen). Control characters print
/// escaped; the JSON output keeps the stored text exactly.
#[tokio::test]
async fn status_prints_control_characters_from_the_database_escaped() {
    let db = TestDatabase::new().await;
    let url = db.url();
    let (_, exhausted, _) = seed(&db).await;
    let hostile_error = "bad gateway\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[31mred\u{0}\u{9b}";
    let hostile_type = "parcel.sent\u{1b}[8m";
    sqlx::query(
        "WITH e AS (UPDATE outbox SET event_type = $2 WHERE event_id = $3 RETURNING id) \
         UPDATE outbox_queue SET last_error = $1 WHERE id = (SELECT id FROM e)",
    )
    .bind(hostile_error.replace('\u{0}', ""))
    .bind(hostile_type)
    .bind(exhausted)
    .execute(db.pool())
    .await
    .unwrap();
    let cli = Outbox::new().events(vec![parcel_event()]);

    let (exit, out, err) = outbox(&cli, &["status", "--database-url", &url]).await;
    assert_eq!(exit, Exit::Ok, "{err}");
    let controls: Vec<char> = out
        .chars()
        .filter(|c| c.is_control() && *c != '\n')
        .collect();
    assert!(
        controls.is_empty(),
        "status printed control characters from the database: {controls:?}\n{out:?}"
    );
    let row = out
        .lines()
        .find(|l| l.contains(&exhausted.to_string()))
        .expect("the exhausted event is listed");
    assert!(
        row.contains(r"parcel.sent\u{1b}[8m") && row.contains(r"bad gateway\u{1b}]0;pwned\u{7}"),
        "the hostile text is shown escaped, not dropped: {row}"
    );

    let (exit, out, _) = outbox(&cli, &["status", "--json", "--database-url", &url]).await;
    assert_eq!(exit, Exit::Ok);
    let v: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
    let e = &v["tables"][0]["exhausted_events"][0];
    assert_eq!(e["event_type"], hostile_type);
    assert_eq!(e["last_error"], hostile_error.replace('\u{0}', ""));
}

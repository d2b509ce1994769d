//! The relay's first slice against a real logical slot (docs/relay.md): events inserted by
//! concurrent producers into a relay table (the outbox DDL without its queue trigger) come back
//! from a `pgoutput` slot through `outbox_runtime::relay`, every committed one exactly once,
//! each aggregate's in commit order, each transaction's in insert order, and none of a
//! transaction that rolled back.
//!
//! Needs a server with `wal_level=logical`: the test starts the one of `scripts/logical_pg.sh`
//! (127.0.0.1:5499, a throwaway cluster from the local PostgreSQL binaries; idempotent), since
//! the machine's server on 5432 runs `wal_level=replica`. `RELAY_DATABASE_URL` names another.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::{Duration, Instant};

use outbox_runtime::relay::inserts::Transactions;
use outbox_runtime::relay::pgoutput::Lsn;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Executor, Row};

const PRODUCERS: usize = 4;
const TRANSACTIONS_EACH: usize = 40;
const AGGREGATES: usize = 5;

/// The server's URL, found (and the server started) once per process.
static SERVER_URL: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();

async fn logical_server() -> PgConnectOptions {
    let url = SERVER_URL.get_or_init(|| async { server_url() }).await;
    PgConnectOptions::from_str(url).expect("a PostgreSQL URL")
}

fn server_url() -> String {
    match std::env::var("RELAY_DATABASE_URL") {
        Ok(url) => url,
        Err(_) => {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/logical_pg.sh");
            let out = std::process::Command::new(script)
                .arg("start")
                .output()
                .unwrap_or_else(|e| panic!("running {script} start: {e}"));
            assert!(
                out.status.success(),
                "{script} start failed (it needs initdb and postgres under \
                 /usr/lib/postgresql/*/bin): {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .and_then(|l| l.split_whitespace().last())
                .expect("the script prints the server's URL")
                .to_owned()
        }
    }
}

/// Drops the slot, then the database, whatever the test did (a logical slot keeps its database
/// from being dropped).
struct Cleanup {
    admin: PgConnectOptions,
    database: String,
    slot: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (admin, database, slot) =
            (self.admin.clone(), self.database.clone(), self.slot.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async move {
                    if let Ok(mut conn) = admin.connect().await {
                        let _ = sqlx::query(
                            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                             WHERE slot_name = $1",
                        )
                        .bind(&slot)
                        .execute(&mut conn)
                        .await;
                        let _ = conn
                            .execute(sqlx::AssertSqlSafe(format!(
                                "DROP DATABASE IF EXISTS {database} WITH (FORCE)"
                            )))
                            .await;
                    }
                });
            }
        })
        .join();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_hands_back_committed_events_in_commit_order_per_aggregate() {
    let admin = logical_server().await;
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let database = format!("relay_test_{suffix}");
    let slot = format!("relay_test_{suffix}");
    let mut conn = admin
        .connect()
        .await
        .expect("connecting to the logical server");
    let level: String = sqlx::query_scalar("SHOW wal_level")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        level, "logical",
        "the relay's server must run wal_level=logical"
    );
    conn.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
        .await
        .unwrap();
    let _cleanup = Cleanup {
        admin: admin.clone(),
        database: database.clone(),
        slot: slot.clone(),
    };
    let options = admin.clone().database(&database);
    let pool = PgPoolOptions::new()
        .max_connections(u32::try_from(PRODUCERS).unwrap() + 2)
        .connect_with(options.clone())
        .await
        .unwrap();

    // A relay table: the outbox DDL without the trigger and queue table of claim mode.
    let ddl = outbox_runtime::store::create_table_sql("relay").unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&pool)
        .await
        .unwrap();
    sqlx::raw_sql(
        "DROP TRIGGER relay_queue_new_events ON relay; DROP TABLE relay_queue; \
         DROP FUNCTION relay_queue_new_events(); \
         CREATE TABLE aggregates (id int PRIMARY KEY, version bigint NOT NULL); \
         INSERT INTO aggregates SELECT g, 0 FROM generate_series(0, 4) g; \
         CREATE PUBLICATION relay_pub FOR TABLE relay WITH (publish = 'insert');",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
        .bind(&slot)
        .execute(&pool)
        .await
        .unwrap();

    // Producers share the aggregates. Each transaction bumps its aggregate's version (the row
    // lock makes one aggregate's transactions commit in version order) and inserts two events
    // carrying it; no producer lock, so ids need not follow commit order. Every fifth
    // transaction rolls back.
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let pool = pool.clone();
        producers.push(tokio::spawn(async move {
            let mut committed = 0usize;
            for t in 0..TRANSACTIONS_EACH {
                let aggregate = i32::try_from((p * 3 + t) % AGGREGATES).unwrap();
                let mut tx = pool.begin().await.unwrap();
                let version: i64 = sqlx::query_scalar(
                    "UPDATE aggregates SET version = version + 1 WHERE id = $1 RETURNING version",
                )
                .bind(aggregate)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
                for step in 0..2 {
                    sqlx::query(
                        "INSERT INTO relay (event_id, operation_key, payload_fingerprint, \
                         event_type, event_version, aggregate_type, aggregate_id, \
                         aggregate_version, payload) \
                         VALUES (gen_random_uuid(), gen_random_uuid()::text, '\\x00', \
                         'Bumped', 1, 'agg', $1, $2, jsonb_build_object('step', $3::int))",
                    )
                    .bind(aggregate.to_string())
                    .bind(version)
                    .bind(step)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                }
                if t % 5 == 4 {
                    tx.rollback().await.unwrap();
                } else {
                    tx.commit().await.unwrap();
                    committed += 2;
                }
            }
            committed
        }));
    }
    let mut expected = 0;
    for p in producers {
        expected += p.await.unwrap();
    }

    // The relay's read: peek a batch, take it, advance the slot past its last commit.
    let mut reader = options.connect().await.unwrap();
    let mut follow = Transactions::new(["relay"]);
    let mut seen = 0usize;
    let mut last_version: HashMap<String, (i64, i64)> = HashMap::new();
    let mut last_commit = Lsn::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen < expected {
        assert!(
            Instant::now() < deadline,
            "only {seen} of {expected} committed events came back from the slot within 60 s"
        );
        let rows = sqlx::query(
            "SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, 100, \
             'proto_version', '1', 'publication_names', 'relay_pub')",
        )
        .bind(&slot)
        .fetch_all(&mut reader)
        .await
        .unwrap();
        let mut confirm = None;
        for row in &rows {
            let data: &[u8] = row.try_get(0).unwrap();
            let Some(committed) = follow.push(data).expect("a well-formed pgoutput stream") else {
                continue;
            };
            assert!(
                committed.commit_lsn > last_commit,
                "transactions out of commit order"
            );
            assert!(committed.end_lsn > committed.commit_lsn);
            last_commit = committed.commit_lsn;
            assert_eq!(
                committed.rows.len(),
                2,
                "each transaction inserted two events"
            );
            for (step, row) in committed.rows.iter().enumerate() {
                let aggregate = row.get("aggregate_id").unwrap().to_owned();
                let version: i64 = row.get("aggregate_version").unwrap().parse().unwrap();
                let payload: serde_json::Value =
                    serde_json::from_str(row.get("payload").unwrap()).unwrap();
                assert_eq!(
                    payload["step"], step,
                    "a transaction's events in insert order"
                );
                let step = i64::try_from(step).unwrap();
                let previous = last_version.insert(aggregate.clone(), (version, step));
                let in_order = match previous {
                    None => true,
                    Some((v, s)) => (version, step) > (v, s),
                };
                assert!(
                    in_order,
                    "aggregate {aggregate}: version {version} step {step} after {previous:?}"
                );
                assert_eq!(row.get("event_type"), Some("Bumped"));
                assert!(row.get("id").unwrap().parse::<i64>().is_ok());
                seen += 1;
            }
            confirm = Some(committed.end_lsn);
        }
        match confirm {
            Some(to) => {
                sqlx::query("SELECT pg_replication_slot_advance($1, $2::text::pg_lsn)")
                    .bind(&slot)
                    .bind(to.to_string())
                    .execute(&mut reader)
                    .await
                    .unwrap();
            }
            None => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    assert_eq!(seen, expected, "every committed event exactly once");
    // Versions are gap-free per aggregate among committed transactions: each aggregate's last
    // version equals its committed count.
    let versions: Vec<(i32, i64)> = sqlx::query_as("SELECT id, version FROM aggregates")
        .fetch_all(&pool)
        .await
        .unwrap();
    for (id, version) in versions {
        assert_eq!(
            last_version.get(&id.to_string()).map(|v| v.0),
            Some(version),
            "aggregate {id}'s last delivered version"
        );
    }
    // The slot moved past everything it handed out: nothing is left to read.
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL, \
         'proto_version', '1', 'publication_names', 'relay_pub')",
    )
    .bind(&slot)
    .fetch_one(&mut reader)
    .await
    .unwrap();
    assert_eq!(
        left, 0,
        "the slot was advanced past every delivered transaction"
    );
    let confirmed: String = sqlx::query_scalar(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(&slot)
    .fetch_one(&mut reader)
    .await
    .unwrap();
    assert!(Lsn::from_str(&confirmed).unwrap() > last_commit);
}

/// The relay's check at start reads the real settings: the logical server passes (its
/// `max_slot_wal_keep_size` is capped, so without a warning), a role without `REPLICATION` is
/// refused with the `ALTER ROLE` that fixes it, and the machine's default server is judged by
/// what it actually runs (`wal_level=replica` on this machine: refused, with the command).
#[tokio::test]
async fn the_check_at_start_reads_the_servers_settings_and_names_the_fix() {
    use outbox_runtime::relay::preflight::{PreflightError, Problem, preflight};

    let admin = logical_server().await;
    let mut conn = admin
        .connect()
        .await
        .expect("connecting to the logical server");
    let warnings = preflight(&mut conn, "payments")
        .await
        .expect("the logical server of scripts/logical_pg.sh is fit for a relay");
    assert_eq!(
        warnings,
        [],
        "scripts/logical_pg.sh caps max_slot_wal_keep_size"
    );

    let role = format!("relay_test_{}", uuid::Uuid::new_v4().simple());
    conn.execute(sqlx::AssertSqlSafe(format!("CREATE ROLE {role} LOGIN")))
        .await
        .unwrap();
    let as_role = admin.clone().username(&role).connect().await;
    let refused = match as_role {
        Ok(mut c) => preflight(&mut c, "payments").await,
        Err(e) => panic!("connecting as {role} (trust authentication): {e}"),
    };
    conn.execute(sqlx::AssertSqlSafe(format!("DROP ROLE {role}")))
        .await
        .unwrap();
    match refused {
        Err(PreflightError::Unfit { problems, .. }) => {
            assert_eq!(
                problems,
                [Problem::NoReplicationRole { role: role.clone() }]
            );
            assert!(
                problems[0]
                    .to_string()
                    .contains(&format!("ALTER ROLE {role} REPLICATION;"))
            );
        }
        other => panic!("a role without REPLICATION passed the check: {other:?}"),
    }

    let default_server = outbox_runtime::testing::server_options().await;
    let mut conn = default_server.connect().await.unwrap();
    let level: String = sqlx::query_scalar("SHOW wal_level")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let result = preflight(&mut conn, "payments").await;
    if level == "logical" {
        assert!(result.is_ok(), "{result:?}");
    } else {
        let text = result
            .expect_err("a server without logical decoding")
            .to_string();
        assert!(text.contains(&format!("wal_level is {level}")), "{text}");
        assert!(
            text.contains("ALTER SYSTEM SET wal_level = logical;"),
            "{text}"
        );
    }
}

//! The WAL relay's spike (issue 42, docs/relay.md): what one event row costs to enqueue next to
//! today's event + queue row, and how fast a relay reads committed events from a logical slot
//! three ways, on the server of `scripts/logical_pg.sh` (wal_level=logical).
//!
//!   scripts/logical_pg.sh start
//!   cargo run -p outbox-bench --bin relay_spike -- [--url postgres://postgres@127.0.0.1:5499/postgres]
//!       [--events 50000] [--rounds 3] [--enqueue-secs 5] [--batch 3000] [--latency-events 300]
//!       [--only enqueue,read,latency]
//!
//! Drops and recreates the database `relay_spike` on that server. Every variant runs once per
//! round, in an order rotated each round; the table prints each variant's median with its
//! range, and its ratio to the reference of its section.
//!
//! - enqueue: 4 clients, each a loop of one-by-one committed business transactions (an UPDATE
//!   of an `orders` row, plus the event): `business` (the UPDATE alone), `relay` (+ the event
//!   row alone: the relay table has no queue trigger and no queue table), `relay + lock` (the
//!   aggregate's transaction-scoped advisory lock first, as the typed enqueue takes it, so ids
//!   follow commit order per aggregate), the same in one statement (`relay: lock+event, 1 stmt`)
//!   and `claim` (today's enqueue: the lock, the event and its queue row). WAL bytes per
//!   transaction from `pg_current_wal_lsn()`.
//! - read: N events committed one per transaction into the relay table, then drained from a
//!   slot of their own by each reader: `sql-get` (`pg_logical_slot_get_binary_changes`, which
//!   consumes), `sql-peek` (`pg_logical_slot_peek_binary_changes`, then
//!   `pg_replication_slot_advance` past the batch: at least once) and `stream` (the replication
//!   protocol through the pgwire-replication crate, confirming each commit's end). The sink does
//!   nothing with the decoded rows. Server CPU is the postmaster's and its children's CPU time
//!   (Linux /proc, same machine, the data directory of `scripts/logical_pg.sh`), per event and
//!   per enqueue transaction.
//! - latency: events committed one at a time, every 10 ms, while a reader waits; commit to seen
//!   from the commit timestamp in the transaction's Begin (server clock, same machine).

use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use outbox_runtime::relay::inserts::{Committed, Transactions};
use outbox_runtime::relay::pgoutput::{Lsn, PG_EPOCH_UNIX_MICROS};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Executor, PgConnection, PgPool, Row};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const DB: &str = "relay_spike";
const PUBLICATION: &str = "relay_pub";
const ORDERS: i32 = 1000;
const CLIENTS: usize = 4;

struct Args {
    url: String,
    events: usize,
    rounds: usize,
    enqueue_secs: u64,
    batch: usize,
    latency_events: usize,
    only: Vec<String>,
}

fn args() -> Res<Args> {
    let mut a = Args {
        url: "postgres://postgres@127.0.0.1:5499/postgres".into(),
        events: 50_000,
        rounds: 3,
        enqueue_secs: 5,
        batch: 3000,
        latency_events: 300,
        only: vec!["enqueue".into(), "read".into(), "latency".into()],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => a.url = value()?,
            "--events" => a.events = value()?.parse()?,
            "--rounds" => a.rounds = value()?.parse()?,
            "--enqueue-secs" => a.enqueue_secs = value()?.parse()?,
            "--batch" => a.batch = value()?.parse()?,
            "--latency-events" => a.latency_events = value()?.parse()?,
            "--only" => a.only = value()?.split(',').map(str::to_owned).collect(),
            other => {
                return Err(
                    format!("unknown option {other} (see the header of relay_spike.rs)").into(),
                );
            }
        }
    }
    Ok(a)
}

#[tokio::main]
async fn main() -> Res<()> {
    let args = args()?;
    let admin = PgConnectOptions::from_str(&args.url)?;
    let pool = setup(&admin).await?;
    let options = admin.clone().database(DB);
    println!(
        "relay spike: server {}:{}, N={} events, {} rounds, {} enqueue clients x {} s, batch {} rows",
        options.get_host(),
        options.get_port(),
        args.events,
        args.rounds,
        CLIENTS,
        args.enqueue_secs,
        args.batch
    );
    if args.only.iter().any(|o| o == "enqueue") {
        enqueue_section(&pool, &args).await?;
    }
    if args.only.iter().any(|o| o == "read") {
        read_section(&pool, &options, &args).await?;
    }
    if args.only.iter().any(|o| o == "latency") {
        latency_section(&pool, &options, &args).await?;
    }
    Ok(())
}

/// A fresh database: the outbox schema, a relay table (the outbox DDL without its queue), the
/// business table and the publication.
async fn setup(admin: &PgConnectOptions) -> Res<PgPool> {
    let mut conn = admin.connect().await?;
    let level: String = sqlx::query_scalar("SHOW wal_level")
        .fetch_one(&mut conn)
        .await?;
    if level != "logical" {
        return Err(format!(
            "wal_level is {level}: a relay needs logical decoding. On this server run \
             `ALTER SYSTEM SET wal_level = logical;` and restart it, or start the spike's own \
             server with scripts/logical_pg.sh start"
        )
        .into());
    }
    // Slots of an earlier run would pin WAL and stop the DROP.
    conn.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
         WHERE slot_name LIKE 'relay_spike_%' AND NOT active",
    )
    .await?;
    conn.execute(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {DB} WITH (FORCE)"
    )))
    .await?;
    conn.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {DB}")))
        .await?;
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(admin.clone().database(DB))
        .await?;
    outbox_runtime::migrate(&pool).await?;
    let relay_ddl = outbox_runtime::store::create_table_sql("relay")?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(relay_ddl))
        .execute(&pool)
        .await?;
    sqlx::raw_sql(
        "DROP TRIGGER relay_queue_new_events ON relay; DROP TABLE relay_queue; \
         DROP FUNCTION relay_queue_new_events(); \
         CREATE TABLE orders (id int PRIMARY KEY, total bigint NOT NULL); \
         INSERT INTO orders SELECT g, 0 FROM generate_series(1, 1000) g; \
         CREATE PUBLICATION relay_pub FOR TABLE relay WITH (publish = 'insert');",
    )
    .execute(&pool)
    .await?;
    Ok(pool)
}

// ---------------------------------------------------------------------------------------------
// Enqueue

const BUSINESS: &str = "UPDATE orders SET total = total + 1 WHERE id = $1";
/// The relay table's enqueue: the event row alone (columns as the typed enqueue writes them).
const RELAY_INSERT: &str = "INSERT INTO relay (event_id, operation_key, payload_fingerprint, \
    event_type, event_version, aggregate_type, aggregate_id, aggregate_version, payload, headers) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (event_id) DO NOTHING";
/// The same row with the aggregate's lock taken by the same statement (one round trip): the
/// materialized CTE is scanned before the INSERT's projection draws the id.
const RELAY_LOCKED_INSERT: &str = "WITH lock AS MATERIALIZED (SELECT pg_advisory_xact_lock(\
    hashtextextended(length($6::text)::text || ':' || $6::text || $7::text, \
    'relay'::regclass::oid::bigint)) AS held) \
    INSERT INTO relay (event_id, operation_key, payload_fingerprint, event_type, event_version, \
    aggregate_type, aggregate_id, aggregate_version, payload, headers) \
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 FROM lock ON CONFLICT (event_id) DO NOTHING";
/// Today's claim-mode enqueue of `outbox` (store/sql/lock_aggregate.sql then enqueue.sql, as the
/// typed enqueue runs them; the table's trigger adds nothing, the statement wrote the queue row).
const CLAIM_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtextextended(length($2)::text || ':' \
    || $2 || $3, $1::text::regclass::oid::bigint))";
const CLAIM_INSERT: &str = "WITH event AS (INSERT INTO outbox (event_id, operation_key, \
    payload_fingerprint, event_type, event_version, aggregate_type, aggregate_id, \
    aggregate_version, payload, headers) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
    ON CONFLICT (event_id) DO NOTHING RETURNING id, aggregate_type, aggregate_id) \
    INSERT INTO outbox_queue (id, aggregate_type, aggregate_id, max_attempts, available_at) \
    SELECT id, aggregate_type, aggregate_id, $11::integer, now() + $12::bigint * interval '1 microsecond' \
    FROM event";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Enqueue {
    Business,
    Relay,
    RelayLocked,
    RelayLockedOne,
    Claim,
}

impl Enqueue {
    fn label(self) -> &'static str {
        match self {
            Enqueue::Business => "business only (UPDATE)",
            Enqueue::Relay => "relay: + event row",
            Enqueue::RelayLocked => "relay: + agg. lock + event",
            Enqueue::RelayLockedOne => "relay: lock+event, 1 stmt",
            Enqueue::Claim => "claim: + event + queue row",
        }
    }
}

/// One business transaction of `kind` for order `order`.
async fn business_tx(conn: &mut PgConnection, kind: Enqueue, order: i32, n: u64) -> Res<()> {
    let mut tx = conn.begin().await?;
    sqlx::query(BUSINESS).bind(order).execute(&mut *tx).await?;
    let aggregate = order.to_string();
    let key = format!("order-{order}-{n}-{}", uuid::Uuid::new_v4().simple());
    let payload = serde_json::json!({
        "order_id": order, "total_cents": 12_345, "currency": "EUR",
        "lines": [{"sku": "SKU-123", "qty": 2}, {"sku": "SKU-456", "qty": 1}],
    });
    let event = |q: sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments>| {
        q.bind(uuid::Uuid::new_v4())
            .bind(key.clone())
            .bind(vec![7u8; 32])
            .bind("OrderPlaced")
            .bind(1i32)
            .bind("order")
            .bind(aggregate.clone())
            .bind(Option::<i64>::None)
            .bind(sqlx::types::Json(payload.clone()))
            .bind(sqlx::types::Json(serde_json::json!({})))
    };
    match kind {
        Enqueue::Business => {}
        Enqueue::Relay => {
            event(sqlx::query(RELAY_INSERT)).execute(&mut *tx).await?;
        }
        Enqueue::RelayLocked => {
            sqlx::query(CLAIM_LOCK)
                .bind("relay")
                .bind("order")
                .bind(&aggregate)
                .execute(&mut *tx)
                .await?;
            event(sqlx::query(RELAY_INSERT)).execute(&mut *tx).await?;
        }
        Enqueue::RelayLockedOne => {
            event(sqlx::query(RELAY_LOCKED_INSERT))
                .execute(&mut *tx)
                .await?;
        }
        Enqueue::Claim => {
            sqlx::query(CLAIM_LOCK)
                .bind("outbox")
                .bind("order")
                .bind(&aggregate)
                .execute(&mut *tx)
                .await?;
            event(sqlx::query(CLAIM_INSERT))
                .bind(10i32)
                .bind(0i64)
                .execute(&mut *tx)
                .await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

async fn wal_lsn(pool: &PgPool) -> Res<u64> {
    let text: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(pool)
        .await?;
    Ok(Lsn::from_str(&text)?.0)
}

/// Transactions per second, WAL bytes and server CPU µs per transaction of `kind`, `CLIENTS`
/// clients.
async fn enqueue_run(pool: &PgPool, kind: Enqueue, secs: u64) -> Res<(f64, f64, f64)> {
    // The pool's connections are open before and after: their backends are alive at both
    // samples.
    let cpu0 = server_cpu();
    let before = wal_lsn(pool).await?;
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await?;
            let mut n = 0u64;
            while Instant::now() < deadline {
                // Spread over the orders, each client on its own stride.
                let order = i32::try_from((n * 7 + client as u64 * 251) % ORDERS as u64)? + 1;
                business_tx(&mut conn, kind, order, n).await?;
                n += 1;
            }
            Res::Ok(n)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let wal = wal_lsn(pool).await? - before;
    let cpu = match (cpu0, server_cpu()) {
        (Some(a), Some(b)) => (b - a) / total as f64 * 1e6,
        _ => f64::NAN,
    };
    Ok((total as f64 / elapsed, wal as f64 / total as f64, cpu))
}

async fn enqueue_section(pool: &PgPool, args: &Args) -> Res<()> {
    let kinds = [
        Enqueue::Business,
        Enqueue::Relay,
        Enqueue::RelayLocked,
        Enqueue::RelayLockedOne,
        Enqueue::Claim,
    ];
    let mut tps: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    let mut wal: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    // Warm-up (caches, the first pages of each table), not counted.
    for &k in &kinds {
        enqueue_run(pool, k, 1).await?;
    }
    for round in 0..args.rounds {
        for i in 0..kinds.len() {
            let k = (i + round) % kinds.len();
            let (t, w, c) = enqueue_run(pool, kinds[k], args.enqueue_secs).await?;
            eprintln!(
                "  enqueue round {round}: {:<28} {t:>8.0} tx/s {w:>6.0} WAL B/tx {c:>6.0} server µs/tx",
                kinds[k].label()
            );
            tps[k].push(t);
            wal[k].push(w);
            cpu[k].push(c);
        }
    }
    println!("\nenqueue: {CLIENTS} clients, business transactions committed one by one (fsync on)");
    println!(
        "  {:<28} {:>10} {:>17} {:>9} {:>11} {:>10} {:>14} {:>17}",
        "variant",
        "tx/s",
        "(min..max)",
        "x base",
        "WAL B/tx",
        "x base",
        "server µs/tx",
        "(min..max)"
    );
    let base_t = median(&tps[0]);
    let base_w = median(&wal[0]);
    for (i, k) in kinds.iter().enumerate() {
        println!(
            "  {:<28} {:>10.0} {:>17} {:>9.2} {:>11.0} {:>10.2} {:>14.0} {:>17}",
            k.label(),
            median(&tps[i]),
            range(&tps[i], 0),
            median(&tps[i]) / base_t,
            median(&wal[i]),
            median(&wal[i]) / base_w,
            median(&cpu[i]),
            range(&cpu[i], 0)
        );
    }
    println!(
        "  relay / claim throughput: {:.2}",
        median(&tps[1]) / median(&tps[4])
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Read throughput

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Reader {
    SqlGet,
    SqlPeek,
    Stream,
}

impl Reader {
    fn label(self) -> &'static str {
        match self {
            Reader::SqlGet => "sql-get (consumes)",
            Reader::SqlPeek => "sql-peek + advance",
            Reader::Stream => "stream (pgwire-replication)",
        }
    }

    fn slot(self) -> &'static str {
        match self {
            Reader::SqlGet => "relay_spike_get",
            Reader::SqlPeek => "relay_spike_peek",
            Reader::Stream => "relay_spike_stream",
        }
    }
}

/// What a drain saw: events, and whether the transactions came in commit order.
#[derive(Default)]
struct Seen {
    events: usize,
    last_commit: Lsn,
    out_of_order: usize,
}

impl Seen {
    /// The no-op sink: counts the rows, and checks each transaction's commit comes after the
    /// previous one's (the order a relay delivers in; event ids need not follow it, since an id
    /// is drawn at the insert, before a concurrent transaction may commit first).
    fn take(&mut self, c: &Committed) {
        if c.commit_lsn <= self.last_commit {
            self.out_of_order += 1;
        }
        self.last_commit = c.commit_lsn;
        self.events += c.rows.len();
    }
}

/// N one-event transactions into the relay table, 4 clients, commit without waiting for the
/// flush (the WAL is the same; the prefill is not what is measured).
async fn prefill(pool: &PgPool, n: usize) -> Res<()> {
    let per = n / CLIENTS;
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let pool = pool.clone();
        let count = if c == 0 { n - per * (CLIENTS - 1) } else { per };
        tasks.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await?;
            conn.execute("SET synchronous_commit = off").await?;
            for i in 0..count {
                let order = i32::try_from(i % ORDERS as usize)? + 1;
                business_tx(&mut conn, Enqueue::Relay, order, i as u64).await?;
            }
            conn.execute("RESET synchronous_commit").await?;
            Res::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// CPU seconds of the server: the postmaster, its live children, and its reaped children.
fn server_cpu() -> Option<f64> {
    let pid_file = std::fs::read_to_string("/tmp/outbox-logical-pg/data/postmaster.pid").ok()?;
    let pid: u32 = pid_file.lines().next()?.trim().parse().ok()?;
    let ticks = 100.0; // USER_HZ on Linux
    let stat = |p: u32| -> Option<(u32, [f64; 4])> {
        let s = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        let rest = &s[s.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split(' ').collect();
        let n = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        Some((f.get(1)?.parse().ok()?, [n(11), n(12), n(13), n(14)]))
    };
    let (_, own) = stat(pid)?;
    let mut total = own.iter().sum::<f64>();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        if let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
            && let Some((ppid, t)) = stat(child)
            && ppid == pid
        {
            total += t[0] + t[1];
        }
    }
    Some(total / ticks)
}

/// CPU seconds of this process.
fn own_cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let Some(close) = s.rfind(')') else {
        return 0.0;
    };
    let f: Vec<&str> = s[close + 2..].split(' ').collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (n(11) + n(12)) / 100.0
}

async fn drain_sql(conn: &mut PgConnection, reader: Reader, n: usize, batch: usize) -> Res<Seen> {
    let mut follow = Transactions::new(["relay"]);
    let mut seen = Seen::default();
    let function = if reader == Reader::SqlGet {
        "pg_logical_slot_get_binary_changes"
    } else {
        "pg_logical_slot_peek_binary_changes"
    };
    let read = format!(
        "SELECT lsn::text, data FROM {function}($1, NULL, $2, \
         'proto_version', '1', 'publication_names', '{PUBLICATION}')"
    );
    while seen.events < n {
        let rows = sqlx::query(sqlx::AssertSqlSafe(read.clone()))
            .bind(reader.slot())
            .bind(i32::try_from(batch)?)
            .fetch_all(&mut *conn)
            .await?;
        if rows.is_empty() {
            return Err(format!(
                "{}: slot empty after {} of {n} events",
                reader.label(),
                seen.events
            )
            .into());
        }
        let mut confirm = None;
        for row in &rows {
            let data: &[u8] = row.try_get(1)?;
            if let Some(c) = follow.push(data)? {
                seen.take(&c);
                confirm = Some(c.end_lsn);
            }
        }
        if reader == Reader::SqlPeek {
            // Delivered (the no-op sink): move the slot past the batch's last commit.
            let to = confirm.ok_or("a peeked batch without a commit")?;
            sqlx::query("SELECT pg_replication_slot_advance($1, $2::text::pg_lsn)")
                .bind(reader.slot())
                .bind(to.to_string())
                .execute(&mut *conn)
                .await?;
        }
    }
    Ok(seen)
}

fn stream_config(options: &PgConnectOptions, slot: &str) -> pgwire_replication::ReplicationConfig {
    let mut cfg = pgwire_replication::ReplicationConfig::new(
        options.get_host(),
        options.get_username(),
        "",
        options.get_database().unwrap_or(DB),
        slot,
        PUBLICATION,
    );
    cfg.port = options.get_port();
    cfg.status_interval = Duration::from_secs(1);
    cfg.idle_wakeup_interval = Duration::from_secs(1);
    cfg
}

/// Reads through the streaming protocol until `n` events; gives the client back still
/// connected (its walsender's CPU time is sampled before it ends).
async fn drain_stream(
    mut client: pgwire_replication::ReplicationClient,
    n: usize,
    mut on_commit: impl FnMut(&Committed),
) -> Res<(Seen, pgwire_replication::ReplicationClient)> {
    use pgwire_replication::ReplicationEvent;
    let mut follow = Transactions::new(["relay"]);
    let mut seen = Seen::default();
    while seen.events < n {
        let event = tokio::time::timeout(Duration::from_secs(30), client.recv())
            .await
            .map_err(|_| {
                format!(
                    "stream: nothing for 30 s after {} of {n} events",
                    seen.events
                )
            })??
            .ok_or("stream ended")?;
        // The crate takes Begin and Commit apart itself and hands on the other messages; the
        // decoder gets the same bytes the SQL functions return, re-framed for the two.
        let bytes: Vec<u8> = match event {
            ReplicationEvent::Begin {
                final_lsn,
                xid,
                commit_time_micros,
            } => {
                let mut m = vec![b'B'];
                m.extend(final_lsn.as_u64().to_be_bytes());
                m.extend(commit_time_micros.to_be_bytes());
                m.extend(xid.to_be_bytes());
                m
            }
            ReplicationEvent::Commit {
                lsn,
                end_lsn,
                commit_time_micros,
            } => {
                let mut m = vec![b'C', 0];
                m.extend(lsn.as_u64().to_be_bytes());
                m.extend(end_lsn.as_u64().to_be_bytes());
                m.extend(commit_time_micros.to_be_bytes());
                m
            }
            ReplicationEvent::XLogData { data, .. } => data.to_vec(),
            _ => continue,
        };
        if let Some(c) = follow.push(&bytes)? {
            seen.take(&c);
            on_commit(&c);
            client.update_applied_lsn(pgwire_replication::Lsn::from_u64(c.end_lsn.0));
        }
    }
    Ok((seen, client))
}

async fn connect_stream(
    options: &PgConnectOptions,
    slot: &str,
) -> Res<pgwire_replication::ReplicationClient> {
    Ok(pgwire_replication::ReplicationClient::connect(stream_config(options, slot)).await?)
}

async fn create_slot(pool: &PgPool, slot: &str) -> Res<()> {
    sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
        .bind(slot)
        .execute(pool)
        .await?;
    Ok(())
}

async fn drop_slot(pool: &PgPool, slot: &str) -> Res<()> {
    // The walsender of a stream that just shut down may hold the slot for a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = sqlx::query("SELECT pg_drop_replication_slot($1)")
            .bind(slot)
            .execute(pool)
            .await;
        match r {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() < deadline && e.to_string().contains("is active") => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn read_section(pool: &PgPool, options: &PgConnectOptions, args: &Args) -> Res<()> {
    let readers = [Reader::SqlGet, Reader::SqlPeek, Reader::Stream];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); readers.len()];
    let mut server: Vec<Vec<f64>> = vec![Vec::new(); readers.len()];
    let mut client: Vec<Vec<f64>> = vec![Vec::new(); readers.len()];
    let mut wal_per_event = Vec::new();
    for round in 0..args.rounds {
        // One slot per reader, made before the events: each decodes the same WAL.
        for r in readers {
            create_slot(pool, r.slot()).await?;
        }
        let before = wal_lsn(pool).await?;
        prefill(pool, args.events).await?;
        wal_per_event.push((wal_lsn(pool).await? - before) as f64 / args.events as f64);
        for i in 0..readers.len() {
            let k = (i + round) % readers.len();
            let r = readers[k];
            // Connected before the clock starts, and sampled before the connection ends: the
            // backend (or walsender) that decodes is alive at both samples.
            let mut conn = options.connect().await?;
            let (s0, c0) = (server_cpu(), own_cpu());
            let start = Instant::now();
            let (seen, secs, s1, c1) = match r {
                Reader::Stream => {
                    let client = connect_stream(options, r.slot()).await?;
                    let (seen, mut client) = drain_stream(client, args.events, |_| {}).await?;
                    let secs = start.elapsed().as_secs_f64();
                    let (s1, c1) = (server_cpu(), own_cpu());
                    client.shutdown().await?;
                    (seen, secs, s1, c1)
                }
                _ => {
                    let seen = drain_sql(&mut conn, r, args.events, args.batch).await?;
                    let secs = start.elapsed().as_secs_f64();
                    (seen, secs, server_cpu(), own_cpu())
                }
            };
            conn.close().await?;
            if seen.events != args.events || seen.out_of_order != 0 {
                return Err(format!(
                    "{}: {} events seen of {}, {} out of commit order",
                    r.label(),
                    seen.events,
                    args.events,
                    seen.out_of_order
                )
                .into());
            }
            let rate = seen.events as f64 / secs;
            let scpu = match (s0, s1) {
                (Some(a), Some(b)) => (b - a) / secs,
                _ => f64::NAN,
            };
            eprintln!(
                "  read round {round}: {:<28} {rate:>8.0} events/s  server {scpu:.2} cores, client {:.2} cores",
                r.label(),
                (c1 - c0) / secs
            );
            rates[k].push(rate);
            // CPU per event, not cores: on a machine shared with other builds a process gets
            // what the scheduler leaves it, so its cores say little; its CPU time per event
            // does not depend on how long it waited for a core.
            server[k].push(scpu * secs / seen.events as f64 * 1e6);
            client[k].push((c1 - c0) / seen.events as f64 * 1e6);
        }
        for r in readers {
            drop_slot(pool, r.slot()).await?;
        }
        sqlx::query("TRUNCATE relay").execute(pool).await?;
    }
    println!(
        "\nread: {} events committed one per transaction ({:.0} WAL bytes each), drained from a slot \
         of their own, no-op sink, sql batch {} rows",
        args.events,
        median(&wal_per_event),
        args.batch
    );
    println!(
        "  {:<28} {:>10} {:>17} {:>9} {:>13} {:>13}",
        "reader", "events/s", "(min..max)", "x get", "server µs/ev", "client µs/ev"
    );
    let base = median(&rates[0]);
    for (i, r) in readers.iter().enumerate() {
        println!(
            "  {:<28} {:>10.0} {:>17} {:>9.2} {:>13.1} {:>13.1}",
            r.label(),
            median(&rates[i]),
            range(&rates[i], 0),
            median(&rates[i]) / base,
            median(&server[i]),
            median(&client[i])
        );
        println!(
            "  {:<28} server µs/event (min..max) {}, client {}",
            "",
            range(&server[i], 1),
            range(&client[i], 1)
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Latency

/// This machine's clock in PostgreSQL's epoch, to compare with a commit timestamp of the server
/// on the same machine (one clock). A measurement only: nothing the outbox decides reads it, and
/// asking the server for its clock per event would add a round trip to what is measured.
#[allow(clippy::disallowed_methods)]
fn now_pg_micros() -> i64 {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    unix - PG_EPOCH_UNIX_MICROS
}

/// Commits `n` events one at a time, every 10 ms, in the background.
fn light_load(pool: &PgPool, n: usize) -> tokio::task::JoinHandle<Res<()>> {
    let pool = pool.clone();
    tokio::spawn(async move {
        let mut conn = pool.acquire().await?;
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        for i in 0..n {
            tick.tick().await;
            let order = i32::try_from(i % ORDERS as usize)? + 1;
            business_tx(&mut conn, Enqueue::Relay, order, i as u64).await?;
        }
        Ok(())
    })
}

/// Latencies (ms) from commit to seen, for the SQL peek reader polling every `poll`.
async fn latency_sql(
    pool: &PgPool,
    options: &PgConnectOptions,
    n: usize,
    poll: Duration,
) -> Res<Vec<f64>> {
    let slot = Reader::SqlPeek.slot();
    create_slot(pool, slot).await?;
    let load = light_load(pool, n);
    let mut conn = options.connect().await?;
    let mut follow = Transactions::new(["relay"]);
    let mut lat = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60) + Duration::from_millis(10 * n as u64);
    while lat.len() < n && Instant::now() < deadline {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, 3000, \
             'proto_version', '1', 'publication_names', '{PUBLICATION}')"
        )))
        .bind(slot)
        .fetch_all(&mut conn)
        .await?;
        let mut confirm = None;
        for row in &rows {
            let data: &[u8] = row.try_get(0)?;
            if let Some(c) = follow.push(data)? {
                let now = now_pg_micros();
                for _ in &c.rows {
                    lat.push((now - c.commit_time) as f64 / 1000.0);
                }
                confirm = Some(c.end_lsn);
            }
        }
        match confirm {
            Some(to) => {
                sqlx::query("SELECT pg_replication_slot_advance($1, $2::text::pg_lsn)")
                    .bind(slot)
                    .bind(to.to_string())
                    .execute(&mut conn)
                    .await?;
            }
            None => tokio::time::sleep(poll).await,
        }
    }
    load.await??;
    drop_slot(pool, slot).await?;
    Ok(lat)
}

async fn latency_stream(pool: &PgPool, options: &PgConnectOptions, n: usize) -> Res<Vec<f64>> {
    let slot = Reader::Stream.slot();
    create_slot(pool, slot).await?;
    let load = light_load(pool, n);
    let mut lat = Vec::new();
    let client = connect_stream(options, slot).await?;
    let (_, mut client) = drain_stream(client, n, |c| {
        let now = now_pg_micros();
        for _ in &c.rows {
            lat.push((now - c.commit_time) as f64 / 1000.0);
        }
    })
    .await?;
    client.shutdown().await?;
    load.await??;
    drop_slot(pool, slot).await?;
    Ok(lat)
}

async fn latency_section(pool: &PgPool, options: &PgConnectOptions, args: &Args) -> Res<()> {
    let n = args.latency_events;
    let labels = ["sql-peek, poll 10 ms", "sql-peek, poll 100 ms", "stream"];
    let mut p50: Vec<Vec<f64>> = vec![Vec::new(); 3];
    let mut p99: Vec<Vec<f64>> = vec![Vec::new(); 3];
    for round in 0..args.rounds {
        for i in 0..3 {
            let k = (i + round) % 3;
            let mut lat = match k {
                0 => latency_sql(pool, options, n, Duration::from_millis(10)).await?,
                1 => latency_sql(pool, options, n, Duration::from_millis(100)).await?,
                _ => latency_stream(pool, options, n).await?,
            };
            lat.sort_by(f64::total_cmp);
            let (a, b) = (pct(&lat, 0.50), pct(&lat, 0.99));
            eprintln!(
                "  latency round {round}: {:<24} p50 {a:.1} ms p99 {b:.1} ms ({} events)",
                labels[k],
                lat.len()
            );
            p50[k].push(a);
            p99[k].push(b);
        }
    }
    println!("\nlatency: commit to seen by the relay, {n} events one per transaction every 10 ms");
    println!(
        "  {:<28} {:>9} {:>17} {:>9} {:>17}",
        "reader", "p50 ms", "(min..max)", "p99 ms", "(min..max)"
    );
    for k in 0..3 {
        println!(
            "  {:<28} {:>9.1} {:>17} {:>9.1} {:>17}",
            labels[k],
            median(&p50[k]),
            range(&p50[k], 1),
            median(&p99[k]),
            range(&p99[k], 1)
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        f64::NAN
    } else {
        s[s.len() / 2]
    }
}

fn range(v: &[f64], decimals: usize) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("({min:.decimals$}..{max:.decimals$})")
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

//! The benchmark's own database: dropped and recreated at start, the outbox schema applied, plus
//! the business table and the raw-SQL ceiling's table. Every measurement starts from a table
//! that was truncated, `VACUUM ANALYZE`d and checkpointed, as the peer harness does.

use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::{ConnectOptions, Connection, PgPool};

use crate::BenchResult;

/// The database this program drops and recreates.
pub const DB_NAME: &str = "outbox_bench";

const DROP_DATABASE: &str = "DROP DATABASE IF EXISTS outbox_bench WITH (FORCE)";
const CREATE_DATABASE: &str = "CREATE DATABASE outbox_bench";
/// The business table of the enqueue workload (the same as the peer harness's).
const CREATE_ORDERS: &str = "CREATE TABLE orders (id bigint PRIMARY KEY, \
    status text NOT NULL DEFAULT 'new', updated_at timestamptz)";
const DROP_ORDERS: &str = "DROP TABLE IF EXISTS orders";
const FILL_ORDERS: &str = "INSERT INTO orders (id) SELECT g FROM generate_series(1, $1::bigint) g";
/// Empties the outbox's two tables, the events and their queue (new relation files: no dead
/// tuples carried over).
const TRUNCATE_OUTBOX: &str = "TRUNCATE outbox, outbox_queue RESTART IDENTITY";
const VACUUM_ANALYZE: &str = "VACUUM ANALYZE";
/// The trigger and the foreign key of `store/sql/create_queue_invariants.sql`, dropped.
const DROP_QUEUE_INVARIANTS: &str = "DROP TRIGGER outbox_queue_new_events ON outbox; \
    ALTER TABLE outbox_queue DROP CONSTRAINT outbox_queue_event_fk";
const CHECKPOINT: &str = "CHECKPOINT";
/// Events pending or processing: the open queue rows (the queue's open index covers this).
const UNFINISHED: &str = "SELECT count(*) FROM outbox_queue WHERE exhausted_at IS NULL";
/// The server's version and whether this session runs over TLS (printed in the table's header).
const SERVER_VERSION: &str = "SELECT current_setting('server_version') \
    || CASE WHEN (SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()) THEN ', TLS' ELSE ', no TLS' END";

/// A connection pool on the benchmark database.
#[derive(Debug, Clone)]
pub struct BenchDb {
    pool: PgPool,
    options: PgConnectOptions,
}

impl BenchDb {
    /// Drop and recreate [`DB_NAME`] on the server, apply the outbox migrations and the
    /// ceiling's table. `pool_size` connections at most.
    pub async fn recreate(pool_size: u32) -> BenchResult<BenchDb> {
        let admin = outbox_runtime::testing::server_options().await;
        // The peer harness runs every client without TLS (its run.sh exports
        // PGSSLMODE=disable); so does this program unless PGSSLMODE says otherwise. With TLS
        // every new session costs a handshake (about 90 ms each on this machine's loopback),
        // which the worker pays inside the timed drain and the ceiling's warm pool does not.
        let admin = if std::env::var_os("PGSSLMODE").is_none() {
            admin.ssl_mode(PgSslMode::Disable)
        } else {
            admin
        };
        let mut conn = admin.connect().await?;
        sqlx::query(DROP_DATABASE).execute(&mut conn).await?;
        sqlx::query(CREATE_DATABASE).execute(&mut conn).await?;
        conn.close().await?;
        let options = admin.database(DB_NAME).application_name("outbox-bench");
        let pool = PgPoolOptions::new()
            .max_connections(pool_size)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(options.clone())
            .await?;
        outbox_runtime::migrate(&pool).await?;
        crate::ceiling::create_table(&pool).await?;
        Ok(BenchDb { pool, options })
    }

    /// Drop the queue invariants of `outbox` (`--without-queue-invariants`).
    pub async fn drop_queue_invariants(&self) -> BenchResult<()> {
        sqlx::raw_sql(DROP_QUEUE_INVARIANTS)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The shared pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A separate pool of `size` connections (so that one workload's clients do not queue
    /// behind another part's connections).
    pub async fn extra_pool(&self, size: u32) -> BenchResult<PgPool> {
        Ok(PgPoolOptions::new()
            .max_connections(size)
            .min_connections(size)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(self.options.clone())
            .await?)
    }

    /// Empty the outbox and the ceiling's table.
    pub async fn truncate_outboxes(&self) -> BenchResult<()> {
        sqlx::query(TRUNCATE_OUTBOX).execute(&self.pool).await?;
        crate::ceiling::truncate(&self.pool).await?;
        Ok(())
    }

    /// A fresh `orders` table with `rows` rows.
    pub async fn recreate_orders(&self, rows: i64) -> BenchResult<()> {
        sqlx::query(DROP_ORDERS).execute(&self.pool).await?;
        sqlx::query(CREATE_ORDERS).execute(&self.pool).await?;
        sqlx::query(FILL_ORDERS)
            .bind(rows)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// `VACUUM ANALYZE` and `CHECKPOINT` (untimed, before every measurement).
    pub async fn settle(&self) -> BenchResult<()> {
        sqlx::query(VACUUM_ANALYZE).execute(&self.pool).await?;
        sqlx::query(CHECKPOINT).execute(&self.pool).await?;
        Ok(())
    }

    /// Events still pending or processing.
    pub async fn unfinished(&self) -> BenchResult<i64> {
        Ok(sqlx::query_scalar(UNFINISHED).fetch_one(&self.pool).await?)
    }

    /// Poll every 10 ms (as the peer harness does) until no event is pending or processing,
    /// or `timeout` passed; returns whether the table drained.
    pub async fn wait_drained(&self, timeout: Duration) -> BenchResult<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.unfinished().await? == 0 {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The server's version string and the transport (`, TLS` or `, no TLS`).
    pub async fn server_version(&self) -> BenchResult<String> {
        Ok(sqlx::query_scalar(SERVER_VERSION)
            .fetch_one(&self.pool)
            .await?)
    }
}

//! Shared by the dashboard tests: rows in every state (including hostile text), a dashboard
//! served on a loopback port, and direct reads of the database to compare the page with.
#![allow(dead_code)] // each test file uses a different subset

use std::net::SocketAddr;

use outbox_runtime::dashboard::{self, DashboardConfig};
use sqlx::PgPool;
use tokio::sync::oneshot;
use uuid::Uuid;

/// An event type and an error text that would run script if the page parsed them as markup.
pub const HOSTILE_TYPE: &str = "<script>window.pwned = 'type'</script>";
pub const HOSTILE_ERROR: &str =
    "receiver said <img src=x onerror=\"window.pwned='error'\"> & <b>bold</b> 100% _done_";

macro_rules! token {
    () => {
        "9f2c4e7a1b8d3f6e0c5a2d9b7e4f1a3c8b6d0e2f5a7c9e1b3d4f6a8c0e2b4d6f"
    };
}

/// The action token of the tests' dashboards (64 hexadecimal digits, as `openssl rand -hex 32`
/// makes them).
pub const TOKEN: &str = token!();
/// The `Authorization` header value carrying [`TOKEN`].
pub const BEARER: &str = concat!("Bearer ", token!());
/// A viewer token, as strong.
pub const VIEWER_TOKEN: &str = "3e8a1c5f7b2d9e4a6c0f8b3d5e7a9c1f2b4d6e8a0c3f5b7d9e1a2c4f6b8d0e3a";

/// `config` with the action token [`TOKEN`].
pub fn with_token(config: DashboardConfig) -> DashboardConfig {
    config
        .with_token(Some(TOKEN.to_owned()))
        .expect("a strong token is accepted")
}

/// `config` with the viewer token [`VIEWER_TOKEN`].
pub fn with_viewer_token(config: DashboardConfig) -> DashboardConfig {
    config
        .with_viewer_token(Some(VIEWER_TOKEN.to_owned()))
        .expect("a strong viewer token is accepted")
}

/// One event to write, with the columns a test cares about.
#[derive(Debug, Clone)]
pub struct Seed {
    pub event_type: String,
    pub status: &'static str,
    pub aggregate_id: Option<String>,
    pub attempts: i32,
    pub max_attempts: i32,
    pub lease_expiries: i32,
    pub handler_failures: i32,
    pub last_error: Option<String>,
    pub claimed_by: Option<String>,
    /// Seconds until the lease ends (processing events).
    pub lease_seconds: f64,
    /// How long ago the event was written (a delivered event keeps no other time).
    pub created_ago_seconds: f64,
    pub payload: serde_json::Value,
}

impl Seed {
    pub fn new(event_type: &str, status: &'static str) -> Seed {
        Seed {
            event_type: event_type.to_owned(),
            status,
            aggregate_id: None,
            attempts: 0,
            max_attempts: 3,
            lease_expiries: 0,
            handler_failures: 0,
            last_error: None,
            claimed_by: None,
            lease_seconds: 30.0,
            created_ago_seconds: 120.0,
            payload: serde_json::json!({"n": 1}),
        }
    }
}

/// Write an event in the state `seed` describes, directly (the states' own transitions are
/// tested by the store and worker tests; here the page is the subject): the event row, and its
/// queue row unless it is delivered. Returns its event id.
pub async fn insert(pool: &PgPool, seed: &Seed) -> Uuid {
    insert_into(pool, "outbox", seed).await
}

/// [`insert`] into the outbox table `table` (created with `create_table_sql`).
pub async fn insert_into(pool: &PgPool, table: &str, seed: &Seed) -> Uuid {
    let event_id = Uuid::new_v4();
    let sql = format!(
        "WITH e AS (
             INSERT INTO {table} (event_id, operation_key, payload_fingerprint, event_type,
                                 event_version, aggregate_type, aggregate_id, payload, headers,
                                 created_at)
             VALUES ($1, $1::text, '\\x00', $2, 1,
                     CASE WHEN $3::text IS NOT NULL THEN 'order' END, $3, $4,
                     '{{\"traceparent\": \"00-abc-def-01\"}}', now() - $12 * interval '1 second')
             RETURNING id, aggregate_type, aggregate_id, created_at
         )
         INSERT INTO {table}_queue (id, aggregate_type, aggregate_id, status, available_at,
                                   lease_until, claimed_by, claim_version, attempts, max_attempts,
                                   lease_expiries, handler_failures, last_error, updated_at,
                                   exhausted_at)
         SELECT id, aggregate_type, aggregate_id, $5::text, created_at,
                CASE WHEN $5::text = 'processing' THEN now() + $10 * interval '1 second' END,
                $9, $6, $6, $7, $8, $11, $13, now(),
                CASE WHEN $5::text = 'exhausted' THEN now() END
         FROM e
         WHERE $5::text <> 'delivered'"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(event_id)
        .bind(&seed.event_type)
        .bind(&seed.aggregate_id)
        .bind(&seed.payload)
        .bind(seed.status)
        .bind(seed.attempts)
        .bind(seed.max_attempts)
        .bind(seed.lease_expiries)
        .bind(&seed.claimed_by)
        .bind(seed.lease_seconds)
        .bind(seed.handler_failures)
        .bind(seed.created_ago_seconds)
        .bind(&seed.last_error)
        .execute(pool)
        .await
        .expect("insert a seeded event");
    if seed.status == "delivered" {
        // The insert gave the event its queue row (the table's trigger); delivered has none.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {table}_queue WHERE id = (SELECT id FROM {table} WHERE event_id = $1)"
        )))
        .bind(event_id)
        .execute(pool)
        .await
        .expect("deliver a seeded event");
    }
    event_id
}

/// What `scenario` wrote.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// An exhausted `note` event (a receiver refused it three times).
    pub exhausted_note: Uuid,
    /// A second exhausted `note` event.
    pub exhausted_note_2: Uuid,
    /// The exhausted event whose type and error are hostile markup.
    pub hostile: Uuid,
    /// A pending event that failed once and waits to retry.
    pub failing: Uuid,
    /// A delivered event with a payload holding personal data.
    pub delivered_private: Uuid,
}

/// Events in every state, all enqueued in the last ten minutes: 4 pending (one failing), 2
/// processing (worker-a), 6 delivered, 3 exhausted (one with hostile text).
pub async fn scenario(pool: &PgPool) -> Scenario {
    for i in 0..3 {
        let mut s = Seed::new("order.confirmed", "pending");
        s.aggregate_id = Some(format!("order-{i}"));
        insert(pool, &s).await;
    }
    let mut failing = Seed::new("order.confirmed", "pending");
    failing.aggregate_id = Some("order-77".into());
    failing.attempts = 1;
    failing.handler_failures = 1;
    failing.last_error = Some("shipping answered 503 Service Unavailable".into());
    failing.claimed_by = Some("worker-b".into());
    let failing = insert(pool, &failing).await;
    for _ in 0..2 {
        let mut s = Seed::new("order.confirmed", "processing");
        s.claimed_by = Some("worker-a".into());
        s.attempts = 1;
        s.lease_seconds = 25.0;
        insert(pool, &s).await;
    }
    let mut delivered_private = Seed::new("customer.registered", "delivered");
    delivered_private.payload = serde_json::json!({"email": "jane.doe@example.invalid"});
    let delivered_private = insert(pool, &delivered_private).await;
    for i in 0..5 {
        let mut s = Seed::new("order.confirmed", "delivered");
        s.created_ago_seconds = 300.0 + f64::from(i) * 60.0;
        insert(pool, &s).await;
    }
    let mut note = Seed::new("note", "exhausted");
    note.attempts = 3;
    note.handler_failures = 2;
    note.lease_expiries = 1;
    note.claimed_by = Some("worker-c".into());
    note.last_error = Some("receiver refused: 422 unknown customer".into());
    let exhausted_note = insert(pool, &note).await;
    let exhausted_note_2 = insert(pool, &note).await;
    let mut hostile = Seed::new(HOSTILE_TYPE, "exhausted");
    hostile.attempts = 3;
    hostile.handler_failures = 3;
    hostile.claimed_by = Some("<i>worker</i>".into());
    hostile.last_error = Some(HOSTILE_ERROR.into());
    let hostile = insert(pool, &hostile).await;
    Scenario {
        exhausted_note,
        exhausted_note_2,
        hostile,
        failing,
        delivered_private,
    }
}

/// The status of each event: its queue row's, or `delivered` when it has none.
const STATUSES: &str = "SELECT e.event_id, coalesce(q.status, 'delivered') AS status
                        FROM outbox e LEFT JOIN outbox_queue q ON q.id = e.id";

/// Events of `status`, counted by the database.
pub async fn count(pool: &PgPool, status: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM ({STATUSES}) AS s WHERE s.status = $1"
    )))
    .bind(status)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The status of one event.
pub async fn status_of(pool: &PgPool, event_id: Uuid) -> String {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT s.status FROM ({STATUSES}) AS s WHERE s.event_id = $1"
    )))
    .bind(event_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A dashboard served on a free loopback port until dropped.
pub struct Served {
    pub address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl Served {
    /// The page's address.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{}", self.address, path.trim_start_matches('/'))
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Serve `dashboard::router(pool, config)` the way `outbox dashboard` does, on loopback.
pub async fn serve(pool: &PgPool, config: DashboardConfig) -> Served {
    serve_on(pool, config, "127.0.0.1:0").await
}

/// [`serve`] on `listen` (`0.0.0.0:0`: every interface, a free port); [`Served::url`] names it
/// by 127.0.0.1 all the same.
pub async fn serve_on(pool: &PgPool, config: DashboardConfig, listen: &str) -> Served {
    let listener = tokio::net::TcpListener::bind(listen).await.unwrap();
    let mut address = listener.local_addr().unwrap();
    if address.ip().is_unspecified() {
        address.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let (stop, stopped) = oneshot::channel::<()>();
    let pool = pool.clone();
    tokio::spawn(async move {
        dashboard::serve(listener, pool, config, async {
            let _ = stopped.await;
        })
        .await
        .expect("the dashboard serves");
    });
    Served {
        address,
        stop: Some(stop),
    }
}

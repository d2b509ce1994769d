//! Shared helpers of the `worker_*` and `crash_*` tests: event types (`#[derive(Event)]`),
//! enqueueing through the real enqueue path, reads of outbox and receiver state, waiting on
//! database state (never on a timer alone), and spawning the `crash_target` worker process.
#![allow(dead_code)] // each test file uses a different subset

pub mod proxy;
pub mod receiver;

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use outbox_runtime::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Row};

/// A sink that accepts every event at once.
pub struct Accept;

impl outbox_runtime::Sink for Accept {
    fn deliver<'a>(
        &'a self,
        _event: &'a outbox_runtime::store::ClaimedEvent,
        _delivery: &'a outbox_runtime::Delivery,
    ) -> futures::future::BoxFuture<'a, Result<(), outbox_runtime::HandlerError>> {
        Box::pin(async { Ok(()) })
    }
}

/// A runtime on this thread alone, for tests that install a metrics recorder for this thread
/// (`metrics::with_local_recorder`): every task of the worker then records into it.
pub fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// An event without aggregate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "job", version = 1)]
pub struct Job {
    pub n: i64,
}

/// An event of an aggregate (`account`, keyed by `account`), numbered in aggregate order by
/// `seq`, its aggregate version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "step", version = 1, aggregate = "account")]
pub struct Step {
    #[outbox(aggregate_id)]
    pub account: String,
    #[outbox(aggregate_version)]
    pub seq: i64,
}

/// A test database with the receiver's tables.
pub async fn database() -> outbox_runtime::testing::TestDatabase {
    let db = outbox_runtime::testing::TestDatabase::with_pool_size(20).await;
    receiver::setup(db.pool()).await;
    db
}

/// Enqueue jobs `from..to` through the real enqueue path (with NOTIFY when `notify`), in
/// transactions of up to 500.
pub async fn enqueue_jobs(pool: &PgPool, from: i64, to: i64, notify: bool) {
    let options = outbox_runtime::store::EnqueueOptions {
        notify,
        ..Default::default()
    };
    let mut start = from;
    while start < to {
        let end = (start + 500).min(to);
        let mut tx = pool.begin().await.unwrap();
        for n in start..end {
            Job { n }
                .enqueue_with(&mut tx, &format!("job-{n}"), &options)
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
        start = end;
    }
}

/// Enqueue jobs with a given `max_attempts`.
pub async fn enqueue_jobs_with_attempts(pool: &PgPool, from: i64, to: i64, max_attempts: i32) {
    let options = outbox_runtime::store::EnqueueOptions {
        notify: false,
        max_attempts,
        ..Default::default()
    };
    let mut tx = pool.begin().await.unwrap();
    for n in from..to {
        Job { n }
            .enqueue_with(&mut tx, &format!("job-{n}"), &options)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

/// Enqueue `per_account` steps for each of `accounts` accounts, interleaved across accounts
/// (the order a busy service would write them in).
pub async fn enqueue_steps(pool: &PgPool, accounts: usize, per_account: i64) {
    let options = outbox_runtime::store::EnqueueOptions {
        notify: false,
        ..Default::default()
    };
    let mut tx = pool.begin().await.unwrap();
    for seq in 1..=per_account {
        for a in 0..accounts {
            let account = format!("acct-{a}");
            Step {
                account: account.clone(),
                seq,
            }
            .enqueue_with(&mut tx, &format!("{account}-{seq}"), &options)
            .await
            .unwrap();
        }
    }
    tx.commit().await.unwrap();
}

/// Insert `n` events of type `ping` with payload `{"n": 1..=n}` and operation keys
/// `{key_prefix}-{n}` straight into `outbox` and `outbox_queue` (both rows, as the enqueue
/// writes them), in one statement: many events fast, without the enqueue's checks.
pub async fn insert_pings(pool: &PgPool, key_prefix: &str, n: i64) {
    sqlx::query(
        "WITH e AS (
             INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload)
             SELECT gen_random_uuid(), $2 || '-' || g, '\\x00', 'ping', 1, jsonb_build_object('n', g)
             FROM generate_series(1, $1) AS g
             RETURNING id, aggregate_type, aggregate_id
         )
         INSERT INTO outbox_queue (id, aggregate_type, aggregate_id) SELECT * FROM e",
    )
    .bind(n)
    .bind(key_prefix)
    .execute(pool)
    .await
    .unwrap();
}

/// Events of `status`: `delivered` is an event without a queue row, every other status is its
/// queue row's.
pub async fn count_status(pool: &PgPool, status: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM outbox AS e LEFT JOIN outbox_queue AS q ON q.id = e.id
         WHERE coalesce(q.status, 'delivered') = $1",
    )
    .bind(status)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Queue rows of `status` claimed by `worker`. A delivered event has no queue row and so no
/// claimant: [`delivered_by`] asks the receiver's log which claim delivered it.
pub async fn count_claimed_by(pool: &PgPool, worker: &str, status: &str) -> i64 {
    assert_ne!(
        status, "delivered",
        "a delivered event has no claimant: use delivered_by"
    );
    sqlx::query_scalar("SELECT count(*) FROM outbox_queue WHERE status = $1 AND claimed_by = $2")
        .bind(status)
        .bind(worker)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Delivered events (no queue row) whose accepted delivery the receiver logged under a claim of
/// `worker`.
pub async fn delivered_by(pool: &PgPool, worker: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(DISTINCT e.id) FROM outbox AS e JOIN receiver_log AS l ON l.event_id = e.event_id
         WHERE l.outcome = 'ok' AND l.claimed_by = $1
           AND NOT EXISTS (SELECT 1 FROM outbox_queue AS q WHERE q.id = e.id)",
    )
    .bind(worker)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// One event and where it stands.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRow {
    pub id: i64,
    pub event_id: uuid::Uuid,
    /// The queue row's status, or `delivered` when the event has none.
    pub status: String,
}

/// Every event of `outbox`, by id (delivered ones until they are purged).
pub async fn events(pool: &PgPool) -> Vec<EventRow> {
    sqlx::query(
        "SELECT e.id, e.event_id, coalesce(q.status, 'delivered') AS status
         FROM outbox AS e LEFT JOIN outbox_queue AS q ON q.id = e.id ORDER BY e.id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .iter()
    .map(|r| EventRow {
        id: r.get("id"),
        event_id: r.get("event_id"),
        status: r.get("status"),
    })
    .collect()
}

/// The delivery state of one event that is not delivered: its queue row, with its event id.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueRow {
    pub id: i64,
    pub event_id: uuid::Uuid,
    pub status: String,
    pub attempts: i32,
    pub claim_version: i64,
    pub claimed_by: Option<String>,
    pub lease_expiries: i32,
    pub handler_failures: i32,
    pub last_error: Option<String>,
    /// Seconds from now (database clock) until the row is available again.
    pub available_in_secs: f64,
}

/// Every queue row, by id: the events that are not delivered. A delivered event keeps no
/// state; what its delivering claim had, the receiver's log tells ([`Received`]).
pub async fn queue_rows(pool: &PgPool) -> Vec<QueueRow> {
    sqlx::query(
        "SELECT q.id, e.event_id, q.status, q.attempts, q.claim_version, q.claimed_by, q.lease_expiries,
                q.handler_failures, q.last_error,
                extract(epoch FROM q.available_at - now())::float8 AS available_in
         FROM outbox_queue AS q JOIN outbox AS e ON e.id = q.id ORDER BY q.id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .iter()
    .map(|r| QueueRow {
        id: r.get("id"),
        event_id: r.get("event_id"),
        status: r.get("status"),
        attempts: r.get("attempts"),
        claim_version: r.get("claim_version"),
        claimed_by: r.get("claimed_by"),
        lease_expiries: r.get("lease_expiries"),
        handler_failures: r.get("handler_failures"),
        last_error: r.get("last_error"),
        available_in_secs: r.get("available_in"),
    })
    .collect()
}

/// One delivery as the receiver logged it.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    pub seq: i64,
    pub event_id: uuid::Uuid,
    pub idempotency_key: String,
    pub attempt: i32,
    pub worker: String,
    pub aggregate_id: Option<String>,
    pub aggregate_version: Option<i64>,
    pub outcome: String,
    /// The fencing token of the claim that delivered it.
    pub claim_version: i64,
    /// The event's queue row in `outbox` as this delivery saw it (None when the event is not
    /// in that table): a delivered event keeps no state, so what its delivering claim had is
    /// read here.
    pub claimed_by: Option<String>,
    pub lease_expiries: Option<i32>,
    pub handler_failures: Option<i32>,
    pub last_error: Option<String>,
}

/// Everything the receiver logged, in arrival order.
pub async fn received(pool: &PgPool) -> Vec<Received> {
    sqlx::query(
        "SELECT seq, event_id, idempotency_key, attempt, worker, aggregate_id, aggregate_version, outcome,
                claim_version, claimed_by, lease_expiries, handler_failures, last_error
         FROM receiver_log ORDER BY seq",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .iter()
    .map(|r| Received {
        seq: r.get("seq"),
        event_id: r.get("event_id"),
        idempotency_key: r.get("idempotency_key"),
        attempt: r.get("attempt"),
        worker: r.get("worker"),
        aggregate_id: r.get("aggregate_id"),
        aggregate_version: r.get("aggregate_version"),
        outcome: r.get("outcome"),
        claim_version: r.get("claim_version"),
        claimed_by: r.get("claimed_by"),
        lease_expiries: r.get("lease_expiries"),
        handler_failures: r.get("handler_failures"),
        last_error: r.get("last_error"),
    })
    .collect()
}

/// The accepted deliveries the receiver logged (outcome `ok`), in arrival order.
pub async fn accepted(pool: &PgPool) -> Vec<Received> {
    let mut log = received(pool).await;
    log.retain(|r| r.outcome == "ok");
    log
}

/// Effects the receiver kept (one per idempotency key).
pub async fn effects(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM receiver_effects")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Rows of `worker_events` (written by `crash_target` from its worker's test hook) of `kind`.
pub async fn worker_events(pool: &PgPool, worker: &str, kind: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM worker_events WHERE worker = $1 AND kind = $2")
        .bind(worker)
        .bind(kind)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Backend pids of the sessions in the test's database named `application_name`, in order.
pub async fn session_pids(pool: &PgPool, application_name: &str) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = $1 ORDER BY pid",
    )
    .bind(application_name)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Terminate every session in the test's database named `application_name` (each must end);
/// how many there were.
pub async fn terminate_sessions(pool: &PgPool, application_name: &str) -> usize {
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = $1",
    )
    .bind(application_name)
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(killed.iter().all(|k| *k), "{killed:?}");
    killed.len()
}

/// Wait until `check` is true, polling every 50 ms; panics with `what` after `timeout`.
/// (A bound on a wait that should succeed, not an assertion about speed.)
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Wait for a worker event matching `pred` on a hook channel.
pub async fn wait_event(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<outbox_runtime::worker::WorkerEvent>,
    timeout: Duration,
    what: &str,
    mut pred: impl FnMut(&outbox_runtime::worker::WorkerEvent) -> bool,
) -> outbox_runtime::worker::WorkerEvent {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(e)) if pred(&e) => return e,
            Ok(Some(_)) => {}
            Ok(None) => panic!("the worker's event channel closed while waiting for {what}"),
            Err(_) => panic!("timed out after {timeout:?} waiting for {what}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The worker process (examples/crash_target.rs)

/// The `crash_target` binary (see [`example`]).
pub fn crash_target() -> PathBuf {
    example("crash_target")
}

/// The binary of `examples/<name>.rs`, found (and built when missing) like [`crash_target`].
pub fn example(name: &str) -> PathBuf {
    static PATHS: OnceLock<Mutex<std::collections::HashMap<String, PathBuf>>> = OnceLock::new();
    let mut paths = PATHS.get_or_init(Default::default).lock().unwrap();
    paths
        .entry(name.to_owned())
        .or_insert_with(|| {
            // <target>/<profile>/deps/<test binary>
            let exe = std::env::current_exe().expect("test binary path");
            let profile_dir = exe
                .parent()
                .and_then(|deps| deps.parent())
                .expect("test binary lives in <target>/<profile>/deps");
            let target_dir = profile_dir
                .parent()
                .expect("profile directory has a parent");
            let profile = profile_dir
                .file_name()
                .and_then(|p| p.to_str())
                .unwrap_or("debug");
            let path = profile_dir.join("examples").join(name);
            // `cargo test --workspace` builds examples before running tests, so the binary is
            // there and fresh. A filtered run should name it too
            // (`cargo test --test crash_faults --example crash_target`); only a missing binary is
            // built here, because a nested cargo sees different environment variables and would
            // rebuild dependencies back and forth with the outer one.
            let fresh = path.is_file();
            if !fresh {
                let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
                let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
                // `test` is the profile `cargo test` builds examples with, so its work is reused.
                let cargo_profile = if profile == "debug" { "test" } else { profile };
                let mut build = Command::new(cargo);
                build
                    .args([
                        "build",
                        "--example",
                        name,
                        "--manifest-path",
                        manifest,
                        "--profile",
                        cargo_profile,
                    ])
                    .env("CARGO_TARGET_DIR", target_dir);
                // The variables cargo sets for a running test would change build fingerprints and
                // make the nested build recompile dependencies.
                for (key, _) in std::env::vars_os() {
                    let key = key.to_string_lossy().into_owned();
                    if (key.starts_with("CARGO_") && key != "CARGO_HOME")
                        || key == "OUT_DIR"
                        || key.starts_with("RUST_TEST")
                    {
                        build.env_remove(&key);
                    }
                }
                let status = build
                    .status()
                    .unwrap_or_else(|e| panic!("running cargo to build examples/{name}.rs: {e}"));
                assert!(status.success(), "building examples/{name}.rs failed");
            }
            assert!(
                path.is_file(),
                "examples/{name} is not at {}",
                path.display()
            );
            path
        })
        .clone()
}

/// A running `crash_target` process.
pub struct WorkerProcess {
    pub name: String,
    child: Child,
    output: Arc<Mutex<Vec<String>>>,
    /// The thread that copies stdout into `output`; it ends at end of file, after the
    /// process's last line.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl WorkerProcess {
    /// Start a worker process named `name` against `url`, with extra `args`
    /// (see `examples/crash_target.rs --help`).
    pub fn spawn(url: &str, name: &str, args: &[&str]) -> WorkerProcess {
        WorkerProcess::spawn_example("crash_target", url, name, args)
    }

    /// Start `examples/<example>.rs` named `name` against `url`, with extra `args`.
    pub fn spawn_example(
        example_name: &str,
        url: &str,
        name: &str,
        args: &[&str],
    ) -> WorkerProcess {
        let mut child = Command::new(example(example_name))
            .env("DATABASE_URL", url)
            .env(
                "RUST_LOG",
                std::env::var("CRASH_TARGET_LOG").unwrap_or_else(|_| "warn".to_owned()),
            )
            .args(["--name", name])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning examples/{example_name}: {e}"));
        let output = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().expect("piped stdout");
        let sink = Arc::clone(&output);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        WorkerProcess {
            name: name.to_owned(),
            child,
            output,
            reader: Some(reader),
        }
    }

    /// SIGKILL (std's `Child::kill` sends SIGKILL on Unix): no cleanup runs in the worker.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM via the `kill` command, asking for a graceful shutdown.
    pub fn terminate(&mut self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Wait for the process to exit (up to `timeout`); returns whether it exited successfully.
    ///
    /// Returns only once everything the process printed is in [`Self::output`]: the exit can
    /// be seen before the reader thread has copied the last lines (the report a graceful
    /// shutdown prints), and a caller reading `reported` right after must find them.
    pub async fn wait_exit(&mut self, timeout: Duration) -> bool {
        let start = Instant::now();
        loop {
            if let Some(status) = self
                .child
                .try_wait()
                .expect("waiting on the worker process")
            {
                while self.reader.as_ref().is_some_and(|r| !r.is_finished()) {
                    assert!(
                        start.elapsed() < timeout,
                        "worker process {} exited but its stdout did not end within {timeout:?}",
                        self.name
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                if let Some(reader) = self.reader.take() {
                    reader.join().expect("the stdout reader thread panicked");
                }
                return status.success();
            }
            assert!(
                start.elapsed() < timeout,
                "worker process {} did not exit within {timeout:?}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Lines the process printed so far.
    pub fn output(&self) -> Vec<String> {
        self.output.lock().unwrap().clone()
    }

    /// The value of the last `key=value` line printed, if any.
    pub fn reported(&self, key: &str) -> Option<String> {
        let prefix = format!("{key}=");
        self.output()
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
    }

    /// Wait until the process printed `line`.
    pub async fn wait_line(&self, line: &str, timeout: Duration) {
        wait_until(timeout, &format!("{} prints `{line}`", self.name), || {
            let found = self.output().iter().any(|l| l == line);
            async move { found }
        })
        .await;
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

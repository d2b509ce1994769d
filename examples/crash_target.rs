//! A worker process for the process-level tests (`tests/crash_*.rs`): one outbox worker with
//! a recording receiver (`tests/worker_support/receiver.rs`) that writes what it received into
//! the same database, so a test can SIGKILL this process and still see what the receiver saw.
//!
//! ```text
//! DATABASE_URL=postgres://... cargo run --example crash_target -- --name w1 --lease-ms 2000
//! ```
//!
//! Prints `ready` once the worker runs. On SIGTERM or Ctrl-C it shuts down gracefully and prints
//! its counters as `key=value` lines, then `stopped`. The worker's test hook is written to the
//! `worker_events` table (`stale`, `lease_lost`, `released`, `listener_connected`, and `claimed`
//! with `--record-claims`), one row per event with the outbox row id.

#[path = "../tests/worker_support/receiver.rs"]
mod receiver;

use std::time::Duration;

use clap::Parser;
use outbox_runtime::worker::{RetryPolicy, Worker, WorkerEvent};
use sqlx::postgres::PgPoolOptions;

#[derive(Debug, Parser)]
#[command(about = "An outbox worker with a recording receiver, for crash tests")]
struct Args {
    /// Database to work on.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// Worker name (recorded in claimed_by and in the receiver's log).
    #[arg(long)]
    name: String,
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    #[arg(long, default_value_t = 16)]
    batch: usize,
    #[arg(long, default_value_t = 2000)]
    lease_ms: u64,
    /// Do not renew leases (a handler slower than the lease loses its claim).
    #[arg(long)]
    no_renewal: bool,
    /// Renewal interval (default a third of the lease).
    #[arg(long)]
    renew_ms: Option<u64>,
    /// Receiver delay per event.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Per-aggregate ordering.
    #[arg(long)]
    ordered: bool,
    /// Poll only (no LISTEN).
    #[arg(long)]
    no_listen: bool,
    #[arg(long, default_value_t = 1000)]
    poll_ms: u64,
    #[arg(long, default_value_t = 500)]
    maintenance_ms: u64,
    /// Receiver fails attempts 1..=N.
    #[arg(long, default_value_t = 0)]
    fail_first: u32,
    /// Receiver applies the effect but loses its response on attempts 1..=N.
    #[arg(long, default_value_t = 0)]
    lose_response_first: u32,
    #[arg(long, default_value_t = 100)]
    retry_base_ms: u64,
    #[arg(long, default_value_t = 10_000)]
    shutdown_deadline_ms: u64,
    /// Record every claim in worker_events.
    #[arg(long)]
    record_claims: bool,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect(&args.database_url)
        .await?;
    receiver::setup(&pool).await;

    let knobs = receiver::Knobs {
        delay: Duration::from_millis(args.delay_ms),
        fail_first: args.fail_first,
        lose_response_first: args.lose_response_first,
        ..Default::default()
    };
    let sink = receiver::Receiver::new(pool.clone(), &args.name, knobs);
    let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
    let recorder = tokio::spawn(record_events(
        pool.clone(),
        args.name.clone(),
        args.record_claims,
        events_rx,
    ));

    let mut builder = Worker::builder(pool.clone(), sink)
        .name(args.name.clone())
        .concurrency(args.concurrency)
        .batch_size(args.batch)
        .lease(Duration::from_millis(args.lease_ms))
        .renewal(!args.no_renewal)
        .ordered(args.ordered)
        .listen(!args.no_listen)
        .poll_interval(Duration::from_millis(args.poll_ms))
        .maintenance_interval(Duration::from_millis(args.maintenance_ms))
        .retry(RetryPolicy {
            base: Duration::from_millis(args.retry_base_ms),
            max: Duration::from_secs(2),
            jitter: true,
        })
        .shutdown_deadline(Duration::from_millis(args.shutdown_deadline_ms))
        .events(events_tx);
    if let Some(ms) = args.renew_ms {
        builder = builder.renew_interval(Duration::from_millis(ms));
    }
    // Installed before `ready`, so a SIGTERM right after start is a graceful shutdown.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let worker = builder.start().await?;
    println!("ready");

    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    worker.shutdown().await;
    let c = worker.counters();
    drop(worker);
    // The recorder ends when the worker's hook sender is dropped with the worker.
    let _ = recorder.await;
    println!("delivered={}", c.delivered);
    println!("retried={}", c.retried);
    println!("stale={}", c.stale_completions);
    println!("lease_lost={}", c.lease_lost);
    println!("released={}", c.released);
    println!("stopped");
    Ok(())
}

/// Write the worker's hook events into `worker_events`, so a test sees them even after a
/// SIGKILL.
async fn record_events(
    pool: sqlx::PgPool,
    worker: String,
    record_claims: bool,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<WorkerEvent>,
) {
    const INSERT: &str =
        "INSERT INTO worker_events (worker, kind, row_id) SELECT $1, $2, unnest($3::bigint[])";
    while let Some(event) = rx.recv().await {
        let (kind, rows): (&str, Vec<i64>) = match event {
            WorkerEvent::ClaimedBatch(claims) if record_claims => {
                ("claimed", claims.iter().map(|c| c.id).collect())
            }
            WorkerEvent::CompletedBatch { stale, .. } if !stale.is_empty() => {
                ("stale", stale.iter().map(|c| c.id).collect())
            }
            WorkerEvent::Failed(claim, outbox_runtime::store::FailOutcome::Lost) => {
                ("stale", vec![claim.id])
            }
            WorkerEvent::LeaseLost(claim) => ("lease_lost", vec![claim.id]),
            WorkerEvent::Released(claim) => ("released", vec![claim.id]),
            WorkerEvent::ListenerConnected => ("listener_connected", vec![0]),
            _ => continue,
        };
        if let Err(e) = sqlx::query(INSERT)
            .bind(&worker)
            .bind(kind)
            .bind(&rows)
            .execute(&pool)
            .await
        {
            eprintln!("crash_target: recording worker event {kind}: {e}");
        }
    }
}

//! A process that commits through a `Producer` and ends right after, for
//! `tests/worker_wakeups.rs`: the shape of a command-line tool or batch job, whose `main` returns
//! (and whose runtime ends) as soon as its last transaction has committed.
//!
//! ```text
//! DATABASE_URL=postgres://... cargo run --example producer_exit -- --events 5 --close
//! ```
//!
//! Enqueues `--events` jobs (event `job`, version 1, the shape of the worker tests' `Job`) in one
//! `Producer` transaction, commits, calls `Producer::close` when `--close` is given, prints
//! `committed` and returns from `main`. Without `--close` the wake-up of the commit is asked for
//! but its task ends with the runtime before it is sent: the workers find the events at their
//! next poll.

use clap::Parser;
use outbox_runtime::{Event, Producer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;

/// The worker tests' `Job` (`tests/worker_support`), declared again: an example cannot use a
/// test's module without its `#[path]` tree.
#[derive(Debug, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "job", version = 1)]
struct Job {
    n: i64,
}

#[derive(Debug, Parser)]
#[command(about = "Commit events through a Producer, then exit at once")]
struct Args {
    /// Database to write to.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// Jobs to enqueue (numbered from 0, operation keys `exit-job-<n>`).
    #[arg(long, default_value_t = 1)]
    events: i64,
    /// Close the producer before exiting (its last wake-up goes out).
    #[arg(long)]
    close: bool,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&args.database_url)
        .await?;
    let producer = Producer::new(pool);
    let mut tx = producer.begin().await?;
    for n in 0..args.events {
        tx.enqueue(&Job { n }, &format!("exit-job-{n}")).await?;
    }
    tx.commit().await?;
    if args.close {
        producer.close().await;
    }
    println!("committed");
    Ok(())
}

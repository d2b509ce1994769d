//! The command line, as clap reads it.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use uuid::Uuid;

use super::duration::parse_duration;

/// Operate the transactional outbox of this service.
#[derive(Debug, Parser)]
#[command(name = "outbox", version, after_help = super::exit_codes())]
pub(crate) struct Cli {
    /// PostgreSQL URL (the commands that touch the database need it).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Whether the command touches neither a database nor the file system (it only prints),
    /// so a fuzz target may run it.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn is_offline(&self) -> bool {
        matches!(self.command, Command::Grants { .. })
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Apply the outbox base schema, then the service's migrations folder.
    Migrate {
        #[command(flatten)]
        folder: Folder,
    },
    /// Generate or check the migrations and contract lock derived from the event definitions.
    #[command(subcommand)]
    Migrations(Migrations),
    /// Counts per status, age of the oldest pending event, and the exhausted events.
    Status {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Outbox table (repeatable); default: `outbox` and every table the events name.
        #[arg(long = "table")]
        tables: Vec<String>,
        /// How many exhausted events to list per table (0 to 10000).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i64).range(0..=10_000))]
        limit: i64,
    },
    /// Check that the database keeps each table's invariants (every event has its delivery
    /// state; no delivery state without its event) and list the rows that break them.
    /// Exits 1 when anything is wrong.
    Doctor {
        /// Outbox table (repeatable); default: `outbox` and every table the events name.
        #[arg(long = "table")]
        tables: Vec<String>,
        /// How many rows of each kind to list per table (0 to 10000).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i64).range(0..=10_000))]
        limit: i64,
        /// Delete the queue rows whose event is gone (nothing can deliver them) and validate
        /// the foreign key that keeps new ones out.
        #[arg(long)]
        repair: bool,
        /// Give every event listed as never claimed its queue row, so the workers deliver it.
        #[arg(long)]
        requeue: bool,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Put exhausted events back to pending with fresh attempts.
    #[command(group(clap::ArgGroup::new("which").required(true).args(["event_id", "event_type"])))]
    Retry {
        /// The event id of one exhausted event.
        event_id: Option<Uuid>,
        /// Every exhausted event of this event type.
        #[arg(long = "type")]
        event_type: Option<String>,
        /// Outbox table to act on (repeatable); default: `outbox` and every table the events
        /// name. An event id is looked for in each; `--type` retries in each.
        #[arg(long = "table")]
        tables: Vec<String>,
    },
    /// Delete delivered events older than a duration (an event's age counts from its enqueue).
    Purge {
        /// Age like 7d, 12h, 30m (enqueued before now() minus this; a delivered event keeps no
        /// delivery time, so the retention counts from the enqueue).
        #[arg(long, value_parser = parse_duration)]
        older_than: Duration,
        /// Outbox table to purge (repeatable); default: `outbox` and every table the events
        /// name, each in turn.
        #[arg(long = "table")]
        tables: Vec<String>,
        /// Rows deleted per statement.
        #[arg(long, default_value_t = 1000)]
        batch: i64,
    },
    /// Serve the operator dashboard (a web page and its JSON endpoints) until Ctrl-C.
    #[cfg(feature = "dashboard")]
    Dashboard(crate::dashboard::DashboardArgs),
    /// Print least-privilege GRANT statements for an enqueuer role and a worker role.
    Grants {
        /// Role services connect as to enqueue.
        #[arg(long)]
        enqueuer: String,
        /// Role workers and this command connect as.
        #[arg(long)]
        worker: String,
        /// Outbox table (repeatable); default: `outbox` and every table the events name.
        #[arg(long = "table")]
        tables: Vec<String>,
        /// Role a consuming service connects as to use the inbox (repeatable; optional).
        #[arg(long = "inbox-consumer")]
        inbox_consumers: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum Migrations {
    /// Write a new migration and update outbox.lock when the events changed (writes nothing
    /// when they did not).
    Generate {
        #[command(flatten)]
        folder: Folder,
    },
    /// Exit 1 when the migrations or outbox.lock are out of date (for CI); writes nothing.
    Check {
        #[command(flatten)]
        folder: Folder,
    },
}

#[derive(Debug, Args)]
pub(crate) struct Folder {
    /// The service's migrations folder (default: the one the binary was configured with, else
    /// `migrations` in the package's directory under `cargo run`, in the current one otherwise).
    #[arg(long, env = "OUTBOX_MIGRATIONS_DIR")]
    pub dir: Option<PathBuf>,
}

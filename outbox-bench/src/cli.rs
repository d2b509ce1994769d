//! Command-line parameters. Every default is chosen so that a plain
//! `cargo run --release -p outbox-bench` finishes in about a minute and a half on 2 cores.

use clap::{Parser, ValueEnum};
use serde::Serialize;

/// One workload of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// The raw-SQL ceiling drains (delete and update on completion), 2 tasks, batch 100.
    Ceiling,
    /// Pre-insert `--events` events, then time their delivery by the worker.
    Drain,
    /// Business transactions with and without the typed enqueue (and the hand-written inserts).
    Enqueue,
    /// Commit-to-handler latency of an idle worker, one event every `--latency-interval-ms`.
    Latency,
    /// Sustained enqueue + delivery; dead tuples and table size sampled over time.
    Bloat,
    /// Per-aggregate ordered delivery: a chain of `--ordered-chain` events of one aggregate, and
    /// `--ordered-events` events over `--ordered-aggregates` aggregates, one worker with the
    /// builder's defaults, ordered and (for the ratio) unordered.
    Ordered,
    /// The tuned drain with tracing on (events enqueued in producer spans, delivery spans
    /// recorded and exported to memory by the SDK's batch processor) and off, interleaved.
    /// Needs `--features opentelemetry`.
    Traced,
    /// Drain `--broker-events` events into RabbitMQ (`--amqp-url`), one publish per delivery
    /// and in batches, next to the same drain into the no-op sink. Not in the default list: it
    /// needs a broker.
    Amqp,
    /// Drain `--broker-events` events into Kafka (`--kafka-brokers`), one produce per delivery
    /// and in batches, next to the same drain into the no-op sink. Not in the default list: it
    /// needs a broker.
    Kafka,
}

/// Throughput, enqueue overhead and latency of the outbox against a raw-SQL ceiling measured
/// in the same run. Creates (drops and recreates) the database `outbox_bench` on the server
/// found like the tests find theirs: `DATABASE_URL`, else postgres@127.0.0.1:5432.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "outbox-bench", version)]
pub struct Args {
    /// Events pre-inserted and delivered by each drain.
    #[arg(long, default_value_t = 50_000)]
    pub events: i64,
    /// Business transactions per enqueue variant.
    #[arg(long, default_value_t = 10_000)]
    pub transactions: i64,
    /// Client connections the enqueue workload spreads its transactions over.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Worker instances of the tuned drain setting (each with its own claimer and completer).
    /// The tuned defaults (2 x 800 / 400 / 400) were the best of `--sweep` on 2 shared cores:
    /// on a busy machine fewer, bigger statements win.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Deliveries in flight per worker in the tuned drain setting.
    #[arg(long, default_value_t = 800)]
    pub concurrency: usize,
    /// Events claimed per statement in the tuned drain setting.
    #[arg(long, default_value_t = 400)]
    pub batch_size: usize,
    /// Completions written per statement in the tuned drain setting.
    #[arg(long, default_value_t = 400)]
    pub completion_batch: usize,
    /// Prefetch bound of the tuned drain setting (its 800 slots per worker need none).
    #[arg(long, default_value_t = 0)]
    pub prefetch: usize,
    /// More drain settings to measure next to the defaults and the tuned one, each as
    /// `workers:concurrency:batch:prefetch:completion_batch` (repeatable); the latency workload
    /// runs with each of them too.
    #[arg(long = "setting", value_parser = crate::drain::DrainSetting::parse)]
    pub settings: Vec<crate::drain::DrainSetting>,
    /// The drains' sink names the one event it handles (`order.paid` v1), as a dispatcher does,
    /// so the workers claim through the filtered statements (`claim_batch_handled.sql`)
    /// instead of the ones for sinks that take every event.
    #[arg(long)]
    pub handled_sink: bool,
    /// Drop the queue invariants from the outbox tables after they are created (the trigger that
    /// gives every inserted event its queue row and the foreign key from a queue row to its
    /// event): the enqueue as it was before them, to measure what they cost.
    #[arg(long)]
    pub without_queue_invariants: bool,
    /// Serialized payload size in bytes (0: the bare `{"order_id": i}`).
    #[arg(long, default_value_t = 0)]
    pub payload_bytes: usize,
    /// Workloads to run, comma separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "ceiling,drain,enqueue,latency,bloat,ordered"
    )]
    pub workloads: Vec<Workload>,
    /// Repetitions of each drain and enqueue measurement; the table shows the median.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Also try a grid of drain settings (workers x concurrency x batch size) and report each.
    #[arg(long)]
    pub sweep: bool,
    /// Also try a grid of one-worker settings at the default concurrency (claim batch x
    /// prefetch x completion batch): how the builder's defaults were chosen.
    #[arg(long)]
    pub sweep_defaults: bool,
    /// Length of the latency workload, in seconds.
    #[arg(long, default_value_t = 10)]
    pub latency_secs: u64,
    /// Interval between two events of the latency workload, in milliseconds.
    #[arg(long, default_value_t = 10)]
    pub latency_interval_ms: u64,
    /// Length of the sustained (bloat) run, in seconds.
    #[arg(long, default_value_t = 20)]
    pub bloat_secs: u64,
    /// The full sustained run: 300 s, sampled every 30 s (overrides --bloat-secs).
    #[arg(long)]
    pub bloat_full: bool,
    /// Events per second enqueued during the sustained run.
    #[arg(long, default_value_t = 1000)]
    pub bloat_rate: u64,
    /// Retention of delivered events during the sustained run, in seconds (purged after);
    /// 604800 is the builder's default of 7 days.
    #[arg(long, default_value_t = 30)]
    pub bloat_retention_secs: u64,
    /// Connections enqueuing during the sustained run (one event per transaction each).
    #[arg(long, default_value_t = 4)]
    pub bloat_enqueuers: u64,
    /// The server's autovacuum during the sustained run: as configured, off, on, or one run
    /// each (switched with ALTER SYSTEM and a reload, set back after; needs a superuser).
    #[arg(long, value_enum, default_value = "server")]
    pub bloat_autovacuum: crate::bloat::Autovacuum,
    /// Events of the one aggregate of the ordered workload's chain.
    #[arg(long, default_value_t = 1000)]
    pub ordered_chain: i64,
    /// Events of the ordered workload's many-aggregate drain.
    #[arg(long, default_value_t = 10_000)]
    pub ordered_events: i64,
    /// Aggregates the many-aggregate drain spreads its events over.
    #[arg(long, default_value_t = 100)]
    pub ordered_aggregates: i64,
    /// Events of each broker drain.
    #[arg(long, default_value_t = 20_000)]
    pub broker_events: i64,
    /// Events per `deliver_batch` call of the broker drains in batch mode.
    #[arg(long, default_value_t = 100)]
    pub broker_batch: usize,
    /// The RabbitMQ of the `amqp` workload.
    #[arg(
        long,
        env = "AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub amqp_url: String,
    /// The Kafka brokers of the `kafka` workload (host:port, comma separated).
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    /// Partitions of the `kafka` workload's topic.
    #[arg(long, default_value_t = 6)]
    pub kafka_partitions: i32,
    /// Install a Prometheus recorder (the worker's histograms with the documented buckets, no
    /// HTTP listener) before any workload, as a service with an exporter runs: every metric the
    /// worker records then costs what it costs in production. Without it the `metrics` facade
    /// has no recorder and each record is a no-op.
    #[arg(long)]
    pub prometheus: bool,
    /// Print the results as one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

impl Args {
    /// Whether `workload` was asked for.
    pub fn wants(&self, workload: Workload) -> bool {
        self.workloads.contains(&workload)
    }

    /// Seconds of the sustained run and the sampling interval.
    pub fn bloat_plan(&self) -> (u64, u64) {
        if self.bloat_full {
            (300, 30)
        } else if self.bloat_secs >= 120 {
            (self.bloat_secs, 30)
        } else {
            (self.bloat_secs.max(1), (self.bloat_secs / 4).max(1))
        }
    }
}

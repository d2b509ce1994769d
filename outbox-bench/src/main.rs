//! `outbox-bench`: throughput, enqueue overhead, latency and table growth of the outbox,
//! each next to the raw-SQL ceiling measured in the same run on the same server.
//!
//! ```sh
//! cargo run --release -p outbox-bench                      # every workload, ~1.5 min on 2 cores
//! cargo run --release -p outbox-bench -- --runs 3 --bloat-full --json
//! cargo run --release -p outbox-bench -- --workloads ceiling,drain --sweep
//! ```
//!
//! It drops and recreates the database `outbox_bench` on the server that `DATABASE_URL` names
//! (else postgres@127.0.0.1:5432), without TLS unless `PGSSLMODE` asks for it (as the peer
//! harness connects; the table's header names the transport), applies the outbox migrations,
//! and runs:
//! - `ceiling`: the minimal SKIP LOCKED outbox by hand (2 tasks, claim 100, complete in one
//!   statement), completing by DELETE and by UPDATE;
//! - `drain`: N events pre-inserted with the typed enqueue, delivered by the worker to a no-op
//!   sink, with the builder's defaults and with the tuned setting (`--workers`, ...);
//! - `enqueue`: business transactions with and without the typed enqueue (with and without its
//!   NOTIFY), a hand-written INSERT of the same row, and the ceiling's minimal insert;
//! - `latency`: commit-to-handler-start of an idle worker;
//! - `bloat`: a sustained run sampling dead tuples and table size;
//! - `ordered`: per-aggregate ordered delivery, a chain of one aggregate and many aggregates,
//!   next to the unordered drain of the same events;
//! - `traced` (only with `--features opentelemetry`, and only when named in `--workloads`): the
//!   tuned drain with trace context through the outbox and span recording on, next to the same
//!   drain with it off.
//! - `amqp`, `kafka` (only when asked for): the tuned drain into RabbitMQ or Kafka, one publish
//!   per delivery and in batches, each next to the same drain into the no-op sink.
//!
//! Progress goes to stderr; the table (or with `--json` one JSON document) to stdout.

mod allocs;
mod bloat;
mod brokers;
mod ceiling;
mod cli;
mod cpu;
mod db;
mod drain;
mod enqueue;
mod event;
mod latency;
mod ordered;
mod report;
mod sink;
#[cfg(feature = "opentelemetry")]
mod traced;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use cli::{Args, Workload};
use db::BenchDb;
use drain::DrainSetting;
use event::PayloadShape;
use report::{Report, Row, join_notes, median_spread, runs_note, thousands};

/// Any failure of a workload.
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;
/// Result of a workload step.
pub type BenchResult<T> = Result<T, BenchError>;

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    init_tracing();
    if args.prometheus
        && let Err(e) = install_prometheus()
    {
        eprintln!("outbox-bench failed: installing the Prometheus recorder: {e}");
        return ExitCode::FAILURE;
    }
    match run(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("outbox-bench failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Log lines to stderr at `RUST_LOG` (default `warn`); with the `opentelemetry` feature, also
/// the span-recording layer of the `traced` workload (off until that workload runs).
fn init_tracing() {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        );
    let registry = tracing_subscriber::registry().with(logs);
    #[cfg(feature = "opentelemetry")]
    let registry = registry.with(traced::layer());
    registry.init();
}

/// A Prometheus recorder for this process, its histograms bucketed as docs/observability.md
/// shows; nothing scrapes it, the point is what recording costs the worker.
fn install_prometheus() -> BenchResult<()> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    use outbox_runtime::worker::metrics as m;
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), m::SECONDS_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full(m::DELIVERY_ATTEMPTS.into()),
            m::ATTEMPTS_BUCKETS,
        )?
        .install_recorder()?;
    Ok(())
}

async fn run(args: &Args) -> BenchResult<()> {
    let tuned = DrainSetting {
        workers: args.workers,
        concurrency: args.concurrency,
        batch_size: args.batch_size,
        prefetch: args.prefetch,
        completion_batch: args.completion_batch,
        delete_on_completion: false,
    };
    let pool_size = u32::try_from(args.workers.max(2) * 6 + args.clients + 8).unwrap_or(64);
    let db = BenchDb::recreate(pool_size).await?;
    if args.without_queue_invariants {
        db.drop_queue_invariants().await?;
    }
    let postgres = db.server_version().await?;
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let shape = PayloadShape::new(args.payload_bytes);
    sink::name_handled_events(args.handled_sink);
    let runs = args.runs.max(1);
    let mut rows = Vec::new();

    let drains = measure_drains(args, &db, &shape, tuned, runs).await?;
    rows.extend(drains);
    if args.wants(Workload::Traced) {
        rows.extend(measure_traced(args, &db, &shape, tuned, runs).await?);
    }
    if args.wants(Workload::Enqueue) {
        rows.extend(measure_enqueue(args, &db, &shape, runs).await?);
    }
    let mut latency_stats = None;
    if args.wants(Workload::Latency) {
        let interval = Duration::from_millis(args.latency_interval_ms.max(1));
        let latency_settings = std::iter::once(("defaults", DrainSetting::defaults()))
            .chain(args.settings.iter().map(|s| ("setting", *s)));
        for (name, setting) in latency_settings {
            progress(
                "latency",
                &format!("idle worker, {name}: {}", setting.label()),
            );
            let stats = latency::run(&db, setting, args.latency_secs, interval, &shape).await?;
            rows.push(Row {
                workload: "latency",
                setting: format!(
                    "p99, 1 event / {} ms for {} s, {name}: {}",
                    args.latency_interval_ms,
                    args.latency_secs,
                    setting.label()
                ),
                value: stats.p99_ms,
                unit: "ms",
                vs_ceiling: None,
                vs_baseline: None,
                notes: format!(
                    "p50 {:.2} ms, max {:.2} ms, handled {}/{}",
                    stats.p50_ms, stats.max_ms, stats.handled, stats.sent
                ),
            });
            latency_stats.get_or_insert(stats);
        }
    }
    if args.wants(Workload::Ordered) {
        rows.extend(measure_ordered(args, &db, runs).await?);
    }
    for broker in [Broker::Amqp, Broker::Kafka] {
        if args.wants(broker.workload()) {
            rows.extend(measure_broker(broker, args, &db, &shape, tuned, runs).await?);
        }
    }
    let mut bloat_runs = Vec::new();
    if args.wants(Workload::Bloat) {
        let (secs, every) = args.bloat_plan();
        let plan = bloat::BloatPlan {
            secs,
            every,
            rate: args.bloat_rate,
            enqueuers: args.bloat_enqueuers.max(1),
            retention: Duration::from_secs(args.bloat_retention_secs.max(1)),
        };
        for autovacuum in args.bloat_autovacuum.series() {
            let label = bloat::label(autovacuum);
            progress(
                "bloat",
                &format!(
                    "{secs} s at {} events/s from {} connections, retention {} s, autovacuum {label}, sample every {every} s",
                    plan.rate,
                    plan.enqueuers,
                    plan.retention.as_secs()
                ),
            );
            let change = match autovacuum {
                Some(on) => Some(bloat::switch_autovacuum(db.pool(), on).await?),
                None => None,
            };
            let run = bloat::run(&db, DrainSetting::defaults(), plan, label, &shape).await;
            if let Some(change) = change {
                change.undo(db.pool()).await?;
            }
            let run = run?;
            for s in &run.samples {
                rows.push(Row {
                    workload: "bloat",
                    setting: format!(
                        "autovacuum {label}, retention {} s, t={}s",
                        run.retention_secs, s.at_secs
                    ),
                    value: s.dead_tuples as f64,
                    unit: "dead tuples",
                    vs_ceiling: None,
                    vs_baseline: None,
                    notes: format!(
                        "size {:.1} MiB, live {}, backlog {}, delivered {}, autovacuums {}, leader vacuums {}",
                        s.total_bytes as f64 / 1_048_576.0,
                        s.live_tuples,
                        s.backlog,
                        s.delivered,
                        s.autovacuums,
                        s.vacuums
                    ),
                });
            }
            bloat_runs.push(run);
        }
    }

    if args.json {
        let report = Report {
            bench_version: env!("CARGO_PKG_VERSION"),
            postgres,
            cpus,
            args,
            rows: &rows,
            latency: latency_stats.as_ref(),
            bloat: &bloat_runs,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        report::print_table(&postgres, cpus, &rows);
    }
    Ok(())
}

fn progress(workload: &str, what: &str) {
    eprintln!("[{workload}] {what}");
}

/// The ceiling drains and the outbox drains, interleaved run by run so that drift of the
/// machine affects all of them alike.
async fn measure_drains(
    args: &Args,
    db: &BenchDb,
    shape: &PayloadShape,
    tuned: DrainSetting,
    runs: usize,
) -> BenchResult<Vec<Row>> {
    let n = args.events;
    let with_ceiling = args.wants(Workload::Ceiling);
    let mut settings = Vec::new();
    if args.wants(Workload::Drain) {
        settings.push(DrainSetting::defaults());
        settings.push(tuned);
        settings.push(tuned.deleting());
        settings.extend(args.settings.iter().copied());
        if args.sweep {
            settings.extend(drain::sweep_grid().into_iter().filter(|s| *s != tuned));
        }
        if args.sweep_defaults {
            let defaults = DrainSetting::defaults();
            settings.extend(
                drain::defaults_grid()
                    .into_iter()
                    .filter(|s| *s != defaults && !args.settings.contains(s)),
            );
        }
    }
    let completions = [ceiling::Completion::Delete, ceiling::Completion::Update];
    let mut ceiling_rates = vec![Vec::new(); completions.len()];
    let mut outbox_rates = vec![Vec::new(); settings.len()];
    // CPU per event of each run: (this process, the rest of the machine).
    let mut ceiling_cpu = vec![Vec::new(); completions.len()];
    let mut outbox_cpu = vec![Vec::new(); settings.len()];
    // Heap allocations per event of each run, where counted.
    let mut ceiling_allocs = vec![Vec::new(); completions.len()];
    let mut outbox_allocs = vec![Vec::new(); settings.len()];
    for run in 1..=runs {
        if with_ceiling {
            for (i, completion) in completions.iter().enumerate() {
                let d = drain::run_ceiling(db, n, *completion).await?;
                progress(
                    "ceiling",
                    &format!(
                        "run {run}: {} {} events/s in {:.2} s{}",
                        completion.label(),
                        thousands(d.rate),
                        d.secs,
                        cpu_progress(&d, "client")
                    ),
                );
                ceiling_rates[i].push(d.rate);
                ceiling_cpu[i].extend(d.cpu.map(|c| c.per_event(d.handled)));
                ceiling_allocs[i].extend(d.allocs_per_event());
            }
        }
        for (i, setting) in settings.iter().enumerate() {
            let d = drain::run_outbox(db, n, shape, *setting).await?;
            progress(
                "drain",
                &format!(
                    "run {run}: {} {} events/s ({} handler calls in {:.2} s){}",
                    setting.label(),
                    thousands(d.rate),
                    d.handled,
                    d.secs,
                    cpu_progress(&d, "worker")
                ),
            );
            outbox_rates[i].push(d.rate);
            outbox_cpu[i].extend(d.cpu.map(|c| c.per_event(d.handled)));
            outbox_allocs[i].extend(d.allocs_per_event());
        }
    }
    let ceiling_delete = with_ceiling.then(|| median_spread(&ceiling_rates[0]).0);
    let ceiling_update = with_ceiling.then(|| median_spread(&ceiling_rates[1]).0);
    let mut rows = Vec::new();
    for (((completion, rates), cpu), allocs) in completions
        .iter()
        .zip(&ceiling_rates)
        .zip(&ceiling_cpu)
        .zip(&ceiling_allocs)
    {
        if rates.is_empty() {
            continue;
        }
        let rate = median_spread(rates).0;
        rows.push(Row {
            workload: "ceiling",
            setting: format!("raw SQL drain, 2 tasks, batch 100, {}", completion.label()),
            value: rate,
            unit: "events/s",
            vs_ceiling: ceiling_delete.map(|c| rate / c),
            vs_baseline: None,
            notes: join_notes(
                &join_notes(&runs_note(rates), &cpu_note(cpu, "client")),
                &allocs_note(allocs),
            ),
        });
    }
    for (i, (((setting, rates), cpu), allocs)) in settings
        .iter()
        .zip(&outbox_rates)
        .zip(&outbox_cpu)
        .zip(&outbox_allocs)
        .enumerate()
    {
        let rate = median_spread(rates).0;
        let name = match i {
            0 => "defaults",
            1 => "tuned",
            2 => "tuned, retention 0",
            i if i < 3 + args.settings.len() => "setting",
            _ => "sweep",
        };
        let mut notes = runs_note(rates);
        if let Some(update) = ceiling_update {
            notes = join_notes(
                &notes,
                &format!("{:.2} of the update-on-completion ceiling", rate / update),
            );
        }
        notes = join_notes(&notes, &cpu_note(cpu, "worker"));
        notes = join_notes(&notes, &allocs_note(allocs));
        rows.push(Row {
            workload: "drain",
            setting: format!("{name}: {}", setting.label()),
            value: rate,
            unit: "events/s",
            vs_ceiling: ceiling_delete.map(|c| rate / c),
            vs_baseline: None,
            notes,
        });
    }
    Ok(rows)
}

/// The tuned drain with tracing off and on, interleaved run by run.
#[cfg(feature = "opentelemetry")]
async fn measure_traced(
    args: &Args,
    db: &BenchDb,
    shape: &PayloadShape,
    tuned: DrainSetting,
    runs: usize,
) -> BenchResult<Vec<Row>> {
    let mut rates = [Vec::new(), Vec::new()];
    let mut spans = 0;
    for run in 1..=runs {
        for (i, on) in [false, true].into_iter().enumerate() {
            let (d, recorded) = traced::run(db, args.events, shape, tuned, on).await?;
            progress(
                "traced",
                &format!(
                    "run {run}: tracing {} {} events/s in {:.2} s ({recorded} delivery spans continued a producer's trace)",
                    if on { "on" } else { "off" },
                    thousands(d.rate),
                    d.secs
                ),
            );
            rates[i].push(d.rate);
            if on {
                spans = recorded;
            }
        }
    }
    let off = median_spread(&rates[0]).0;
    let on = median_spread(&rates[1]).0;
    Ok(vec![
        Row {
            workload: "traced",
            setting: format!("tracing off: {}", tuned.label()),
            value: off,
            unit: "events/s",
            vs_ceiling: None,
            vs_baseline: Some(1.0),
            notes: runs_note(&rates[0]),
        },
        Row {
            workload: "traced",
            setting: format!("tracing on (feature `opentelemetry`): {}", tuned.label()),
            value: on,
            unit: "events/s",
            vs_ceiling: None,
            vs_baseline: Some(on / off),
            notes: join_notes(
                &runs_note(&rates[1]),
                &format!("{spans} delivery spans continued their producer's trace in the last run"),
            ),
        },
    ])
}

/// Without the `opentelemetry` feature the `traced` workload cannot run.
#[cfg(not(feature = "opentelemetry"))]
async fn measure_traced(
    _args: &Args,
    _db: &BenchDb,
    _shape: &PayloadShape,
    _tuned: DrainSetting,
    _runs: usize,
) -> BenchResult<Vec<Row>> {
    Err("the traced workload needs the opentelemetry feature: cargo run --release -p outbox-bench --features opentelemetry -- --workloads traced".into())
}

/// `, CPU µs/event: worker 4.1, rest of the machine 30.2` for a progress line, or nothing.
fn cpu_progress(drained: &drain::Drained, who: &str) -> String {
    let cpu = drained
        .cpu
        .map(|cpu| format!(", {}", cpu.note(drained.handled, who)))
        .unwrap_or_default();
    let allocs = drained
        .allocs_per_event()
        .map(|a| format!(", {}", allocs::per_event_note(a)))
        .unwrap_or_default();
    cpu + &allocs
}

/// The median of the runs' heap allocations per event, for the table, or nothing where none
/// were counted.
fn allocs_note(runs: &[f64]) -> String {
    if runs.is_empty() {
        return String::new();
    }
    allocs::per_event_note(median_spread(runs).0)
}

/// The medians of the runs' CPU per event, for the table, or nothing where none was measured.
fn cpu_note(runs: &[(f64, f64)], who: &str) -> String {
    if runs.is_empty() {
        return String::new();
    }
    let process: Vec<f64> = runs.iter().map(|r| r.0).collect();
    let rest: Vec<f64> = runs.iter().map(|r| r.1).collect();
    cpu::per_event_note(who, median_spread(&process).0, median_spread(&rest).0)
}

/// Every enqueue variant, interleaved run by run.
async fn measure_enqueue(
    args: &Args,
    db: &BenchDb,
    shape: &PayloadShape,
    runs: usize,
) -> BenchResult<Vec<Row>> {
    let variants = enqueue::Variant::ALL;
    let mut rates = vec![Vec::new(); variants.len()];
    let mut wal = vec![Vec::new(); variants.len()];
    for run in 1..=runs {
        for (i, variant) in variants.iter().enumerate() {
            let measured =
                enqueue::run(db, *variant, args.transactions, args.clients, shape).await?;
            progress(
                "enqueue",
                &format!(
                    "run {run}: {} {} tx/s, {:.0} WAL bytes/tx",
                    variant.label(),
                    thousands(measured.rate),
                    measured.wal_per_tx
                ),
            );
            rates[i].push(measured.rate);
            wal[i].push(measured.wal_per_tx);
        }
    }
    let medians: Vec<f64> = rates.iter().map(|r| median_spread(r).0).collect();
    let baseline = medians[0];
    let ceiling = medians[variants.len() - 1];
    Ok(variants
        .iter()
        .zip(&medians)
        .zip(&rates)
        .zip(&wal)
        .map(|(((variant, rate), all), wal)| Row {
            workload: "enqueue",
            setting: format!(
                "{}, {} tx over {} connections",
                variant.label(),
                args.transactions,
                args.clients
            ),
            value: *rate,
            unit: "tx/s",
            vs_ceiling: Some(rate / ceiling),
            vs_baseline: Some(rate / baseline),
            notes: join_notes(
                &runs_note(all),
                &format!("{:.0} WAL bytes/tx", median_spread(wal).0),
            ),
        })
        .collect())
}

/// Ordered drains (a chain of one aggregate, then many aggregates), each next to the unordered
/// drain of the same events, interleaved run by run.
async fn measure_ordered(args: &Args, db: &BenchDb, runs: usize) -> BenchResult<Vec<Row>> {
    let shapes = [
        (args.ordered_chain, 1),
        (args.ordered_events, args.ordered_aggregates.max(1)),
    ];
    let mut rows = Vec::new();
    for (n, aggregates) in shapes {
        let (mut ordered_rates, mut unordered_rates) = (Vec::new(), Vec::new());
        for run in 1..=runs {
            for ordered in [true, false] {
                let d = ordered::run(db, n, aggregates, ordered).await?;
                progress(
                    "ordered",
                    &format!(
                        "run {run}: {n} events over {aggregates} aggregate(s), {}: {} events/s in {:.2} s",
                        if ordered { "ordered" } else { "unordered" },
                        thousands(d.rate),
                        d.secs
                    ),
                );
                if ordered {
                    ordered_rates.push(d.rate);
                } else {
                    unordered_rates.push(d.rate);
                }
            }
        }
        let rate = median_spread(&ordered_rates).0;
        let unordered = median_spread(&unordered_rates).0;
        let what = if aggregates == 1 {
            format!("chain: {n} events of 1 aggregate")
        } else {
            format!("{n} events over {aggregates} aggregates")
        };
        let sep = if runs > 1 { "; " } else { "" };
        rows.push(Row {
            workload: "ordered",
            setting: format!("{what}, ordered worker, defaults"),
            value: rate,
            unit: "events/s",
            vs_ceiling: None,
            vs_baseline: Some(rate / unordered),
            notes: format!(
                "{}{sep}unordered drain of the same events: {} events/s; {:.2} ms per event of an aggregate",
                runs_note(&ordered_rates),
                thousands(unordered),
                1e3 * aggregates as f64 / rate
            ),
        });
    }
    Ok(rows)
}

/// A broker the drain can deliver to.
#[derive(Debug, Clone, Copy)]
enum Broker {
    Amqp,
    Kafka,
}

impl Broker {
    fn workload(self) -> Workload {
        match self {
            Broker::Amqp => Workload::Amqp,
            Broker::Kafka => Workload::Kafka,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Broker::Amqp => "RabbitMQ",
            Broker::Kafka => "Kafka",
        }
    }

    fn notes(self, args: &Args) -> String {
        match self {
            Broker::Amqp => "persistent messages, durable queue, publisher confirms".to_owned(),
            Broker::Kafka => format!(
                "{} partitions, acks=all, at {}",
                args.kafka_partitions, args.kafka_brokers
            ),
        }
    }

    async fn drain(
        self,
        args: &Args,
        db: &BenchDb,
        shape: &PayloadShape,
        setting: DrainSetting,
        batch: Option<usize>,
    ) -> BenchResult<drain::Drained> {
        let n = args.broker_events;
        match self {
            Broker::Amqp => brokers::run_amqp(db, &args.amqp_url, n, shape, setting, batch).await,
            Broker::Kafka => {
                brokers::run_kafka(
                    db,
                    &args.kafka_brokers,
                    n,
                    shape,
                    setting,
                    batch,
                    args.kafka_partitions,
                )
                .await
            }
        }
    }
}

/// Drains into a broker (one publish per delivery, then batches) and into the no-op sink with
/// the same worker setting, interleaved run by run; each broker row's ratio is to the no-op
/// drain's median.
async fn measure_broker(
    broker: Broker,
    args: &Args,
    db: &BenchDb,
    shape: &PayloadShape,
    setting: DrainSetting,
    runs: usize,
) -> BenchResult<Vec<Row>> {
    let n = args.broker_events;
    let workload = match broker {
        Broker::Amqp => "amqp",
        Broker::Kafka => "kafka",
    };
    let variants = [None, Some(args.broker_batch.max(1))];
    let label = |batch: &Option<usize>| {
        batch.map_or("one publish per delivery".to_owned(), |b| {
            format!("batches of {b}")
        })
    };
    // The first drain after the database was created runs on cold caches and statistics:
    // one untimed round of each so that no variant pays for it.
    progress(workload, "warm-up (not counted)");
    drain::run_outbox(db, n, shape, setting).await?;
    for batch in &variants {
        broker.drain(args, db, shape, setting, *batch).await?;
    }
    let mut noop = Vec::new();
    let mut rates = vec![Vec::new(); variants.len()];
    for run in 1..=runs {
        let d = drain::run_outbox(db, n, shape, setting).await?;
        progress(
            workload,
            &format!("run {run}: no-op sink {} events/s", thousands(d.rate)),
        );
        noop.push(d.rate);
        for (i, batch) in variants.iter().enumerate() {
            let d = broker.drain(args, db, shape, setting, *batch).await?;
            progress(
                workload,
                &format!(
                    "run {run}: {} {}: {} events/s ({} stored in {:.2} s)",
                    broker.name(),
                    label(batch),
                    thousands(d.rate),
                    d.handled,
                    d.secs
                ),
            );
            rates[i].push(d.rate);
        }
    }
    let baseline = median_spread(&noop).0;
    let mut rows = Vec::new();
    for (batch, all) in variants.iter().zip(&rates) {
        let rate = median_spread(all).0;
        let sep = if runs > 1 { "; " } else { "" };
        rows.push(Row {
            workload,
            setting: format!(
                "{n} events into {}, {}, {}",
                broker.name(),
                label(batch),
                setting.label()
            ),
            value: rate,
            unit: "events/s",
            vs_ceiling: None,
            vs_baseline: Some(rate / baseline),
            notes: format!(
                "{}{sep}no-op sink, same setting: {} events/s; {}",
                runs_note(all),
                thousands(baseline),
                broker.notes(args)
            ),
        });
    }
    Ok(rows)
}

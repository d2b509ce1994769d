//! The order service, end to end:
//!
//! ```text
//! cargo run --example order_service
//! cargo run --example order_service -- --dashboard   # then open the printed address
//! ```
//!
//! Confirming an order updates it with an optimistic version check and enqueues
//! `OrderConfirmed` in the same transaction. A worker publishes the events to a shipping service
//! (an HTTP receiver this example runs on loopback, deduplicating with the inbox) and, when a
//! NATS server answers on 127.0.0.1:4222 (or `--nats-url` / `NATS_URL` names one), to JetStream.
//! The shipping service loses its first responses on purpose, so the output shows redeliveries
//! being dropped as duplicates by both receivers. With NATS, a billing service then consumes the
//! stream into invoices through the inbox, twice (the second time replaying from the start).
//!
//! Needs only PostgreSQL, found like the tests find it (`DATABASE_URL`, else 127.0.0.1:5432,
//! else a throwaway server from the local PostgreSQL binaries). It works in a database of its
//! own, dropped at exit (`OUTBOX_KEEP_TEST_DB=1` keeps it).
//!
//! With `--dashboard` it then confirms two more orders while the shipping service is down (they
//! are exhausted after three attempts) and serves the operator dashboard on that database until
//! Ctrl-C, printing its address and an action token.
//!
//! Telemetry (see `telemetry.rs` and `docs/observability.md`): Prometheus text on
//! `GET /metrics` (`--metrics-addr`, and `--linger` to keep serving after the run); traces over
//! OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set; `--print-trace` prints the trace of the
//! first order, from the request that confirmed it to the receivers' inbox transactions.

mod app;
mod billing;
mod dashboard;
mod events;
mod orders;
mod receiver;
mod telemetry;

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use outbox_runtime::testing::TestDatabase;

#[derive(Debug, Parser)]
#[command(
    about = "The outbox order service example: confirm orders, publish them, show what each receiver saw"
)]
struct Args {
    /// Orders to place and confirm.
    #[arg(long, default_value_t = 5)]
    orders: usize,
    /// Publish to this NATS server (it must answer). Default: 127.0.0.1:4222 when it answers.
    #[arg(long, env = "NATS_URL")]
    nats_url: Option<String>,
    /// Do not use NATS even if a server answers.
    #[arg(long, conflicts_with = "nats_url")]
    no_nats: bool,
    /// Responses the shipping service loses on purpose (after applying the event).
    #[arg(long, default_value_t = 2)]
    lose_responses: u64,
    /// Keep the JetStream stream this run creates.
    #[arg(long)]
    keep_stream: bool,
    /// After the run, exhaust two events on purpose and serve the operator dashboard until
    /// Ctrl-C.
    #[arg(long)]
    dashboard: bool,
    /// Where the dashboard listens (loopback).
    #[arg(long, default_value = outbox_runtime::dashboard::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Serve Prometheus text on http://ADDR/metrics (port 0: any free port, printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    metrics_addr: SocketAddr,
    /// Keep serving /metrics this many seconds after the run (for a scrape).
    #[arg(long, default_value_t = 0)]
    linger: u64,
    /// Print the trace of the first order (spans kept in memory as well as exported).
    #[arg(long)]
    print_trace: bool,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let telemetry = match telemetry::init(args.print_trace) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("order_service: cannot set up telemetry: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let stop_metrics = tokio_util::sync::CancellationToken::new();
    let metrics_url = match telemetry
        .serve_metrics(args.metrics_addr, stop_metrics.clone())
        .await
    {
        Ok(addr) => format!("http://{addr}/metrics"),
        Err(e) => {
            eprintln!(
                "order_service: cannot serve /metrics on {}: {e}",
                args.metrics_addr
            );
            return std::process::ExitCode::FAILURE;
        }
    };
    println!(
        "telemetry: Prometheus text on {metrics_url}; traces {}",
        if telemetry.otlp {
            "exported over OTLP/HTTP (OTEL_EXPORTER_OTLP_ENDPOINT)"
        } else {
            "not exported (set OTEL_EXPORTER_OTLP_ENDPOINT)"
        }
    );
    let options = app::Options {
        orders: args.orders,
        nats: match (args.no_nats, args.nats_url) {
            (true, _) => app::NatsChoice::Off,
            (false, Some(url)) => app::NatsChoice::Url(url),
            (false, None) => app::NatsChoice::Probe,
        },
        lose_responses: args.lose_responses,
        keep_stream: args.keep_stream,
    };

    let db = TestDatabase::new().await;
    let server = db.connect_options();
    println!(
        "database: {} on {}:{} (created for this run, dropped at exit)",
        db.name(),
        server.get_host(),
        server.get_port()
    );
    let exit = match app::run(db.pool(), &options).await {
        Ok(report) => {
            println!("{report}");
            if args.dashboard {
                let shown = async {
                    dashboard::exhaust_while_shipping_is_down(db.pool()).await?;
                    dashboard::serve_until_ctrl_c(db.pool(), args.listen).await
                };
                if let Err(e) = shown.await {
                    eprintln!("order_service: dashboard: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            }
            if report.ok() {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("order_service: {e}");
            std::process::ExitCode::FAILURE
        }
    };
    // Scrape ourselves, as Prometheus would: the lines an alert on queue lag reads.
    match scrape(&metrics_url).await {
        Ok(text) => {
            println!("metrics: {metrics_url} (the delivery histograms' counts):");
            for line in text.lines().filter(|l| {
                l.starts_with("outbox_delivery_latency_seconds_count")
                    || l.starts_with("outbox_claim_wait_seconds_count")
                    || l.starts_with("outbox_delivery_attempts_sum")
            }) {
                println!("  {line}");
            }
        }
        Err(e) => eprintln!("order_service: scraping {metrics_url} failed: {e}"),
    }
    if args.print_trace {
        match telemetry.first_order_trace() {
            Some(tree) => print!("{tree}"),
            None => println!("no trace of a delivered order was recorded"),
        }
    }
    if args.linger > 0 {
        println!("serving {metrics_url} for {} s", args.linger);
        tokio::time::sleep(Duration::from_secs(args.linger)).await;
    }
    stop_metrics.cancel();
    telemetry.shutdown();
    exit
}

async fn scrape(url: &str) -> Result<String, reqwest::Error> {
    reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(5))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await
}

//! What both releases of the rolling-deploy example share (`examples/rolling_release_n.rs`,
//! `examples/rolling_release_n1.rs`): the command line, the billing service's event, the
//! recording of deliveries, and the worker and producer loops. Each release's binary brings
//! its own `rolling.order_placed` types, as two builds of one service would.

use std::future::Future;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use outbox_runtime::worker::Worker;
use outbox_runtime::{Delivery, Dispatcher, Event, HandlerError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// The billing service's event: the second service that shares the table.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "rolling.invoice_sent", version = 1)]
pub struct InvoiceSent {
    pub invoice: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Run a worker until SIGTERM.
    Worker,
    /// Write events until SIGTERM.
    Produce,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Service {
    /// Handles `rolling.order_placed` (the versions of this release).
    Orders,
    /// Handles `rolling.invoice_sent`.
    Billing,
}

#[derive(Debug, Parser)]
#[command(about = "One release of a service, for the rolling-deploy test")]
pub struct Args {
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,
    /// Worker or producer name (the worker's name is recorded with each delivery).
    #[arg(long)]
    pub name: String,
    #[arg(long, value_enum)]
    pub mode: Mode,
    /// Which service's handlers a worker runs.
    #[arg(long, value_enum, default_value = "orders")]
    pub service: Service,
    /// Producer: orders are spread over this many aggregates.
    #[arg(long, default_value_t = 20)]
    pub aggregates: i64,
    /// Producer: also write one invoice per order (the billing service's event).
    #[arg(long)]
    pub invoices: bool,
    /// Producer: pause between two transactions.
    #[arg(long, default_value_t = 5)]
    pub interval_ms: u64,
    /// Worker: each handler takes this long (deliveries are in flight when a worker is replaced).
    #[arg(long, default_value_t = 2)]
    pub handler_ms: u64,
    #[arg(long, default_value_t = 200)]
    pub maintenance_ms: u64,
}

/// Connect, then run the mode until SIGTERM; prints `ready` once running, `stopped` at the end.
/// `orders` builds this release's dispatcher for `rolling.order_placed`; `order` writes one
/// order of this release (aggregate, sequence number within this producer).
pub async fn main<F, Fut>(
    release: &str,
    orders: impl FnOnce(Recorder) -> Dispatcher,
    order: F,
) -> Result<(), Box<dyn std::error::Error>>
where
    F: Fn(PgPool, String, i64) -> Fut,
    Fut: Future<Output = outbox_runtime::error::Result<()>>,
{
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect(&args.database_url)
        .await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let recorder = Recorder {
        pool: pool.clone(),
        worker: format!("{release}/{}", args.name),
        delay: Duration::from_millis(args.handler_ms),
    };
    match args.mode {
        Mode::Worker => {
            let dispatcher = match args.service {
                Service::Orders => orders(recorder),
                Service::Billing => billing(recorder)?,
            };
            let worker = Worker::builder(pool.clone(), dispatcher)
                .name(args.name.clone())
                .ordered(true)
                .concurrency(8)
                .batch_size(16)
                .poll_interval(Duration::from_millis(100))
                .maintenance_interval(Duration::from_millis(args.maintenance_ms))
                .shutdown_deadline(Duration::from_secs(5))
                .start()
                .await?;
            println!("ready");
            term.recv().await;
            worker.shutdown().await;
            println!("delivered={}", worker.counters().delivered);
        }
        Mode::Produce => {
            println!("ready");
            let mut n = 0_i64;
            loop {
                tokio::select! {
                    _ = term.recv() => break,
                    () = tokio::time::sleep(Duration::from_millis(args.interval_ms)) => {}
                }
                n += 1;
                let aggregate = format!("order-{}", n % args.aggregates);
                order(pool.clone(), aggregate, n).await?;
                if args.invoices {
                    let mut tx = pool.begin().await?;
                    InvoiceSent { invoice: n }
                        .enqueue(&mut tx, &format!("{}-invoice-{n}", args.name))
                        .await?;
                    tx.commit().await?;
                }
            }
            println!("produced={n}");
        }
    }
    println!("stopped");
    Ok(())
}

/// Records every delivery in `rolling_received` (event id, type, stored version, worker; the
/// test creates the table before any process starts), after a short pause (the handler's work).
#[derive(Debug, Clone)]
pub struct Recorder {
    pool: PgPool,
    worker: String,
    delay: Duration,
}

impl Recorder {
    /// Record one delivery; a failure to record is a retryable failure of the delivery.
    pub async fn record(&self, ctx: &Delivery) -> Result<(), HandlerError> {
        tokio::time::sleep(self.delay).await;
        sqlx::query(
            "INSERT INTO rolling_received (event_id, event_type, stored_version, worker)
             VALUES ($1, $2, $3, $4)",
        )
        .bind(ctx.event_id())
        .bind(ctx.event_type())
        .bind(i32::try_from(ctx.stored_version()).unwrap_or(i32::MAX))
        .bind(&self.worker)
        .execute(&self.pool)
        .await
        .map_err(HandlerError::retry)?;
        Ok(())
    }
}

/// The billing service's dispatcher: invoices only.
fn billing(recorder: Recorder) -> outbox_runtime::error::Result<Dispatcher> {
    Dispatcher::builder()
        .handler(move |_event: InvoiceSent, ctx: Delivery| {
            let recorder = recorder.clone();
            async move { recorder.record(&ctx).await }
        })
        .build()
}

//! The example end to end, as a function the binary runs and a test calls: place and confirm
//! orders (each confirmation enqueues `OrderConfirmed` in its transaction), run a worker that
//! publishes every event to the shipping service over HTTP and, when a server is there, to NATS
//! JetStream, then report what each side recorded.

use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use outbox_runtime::Store;
use outbox_runtime::publish::FanOut;
use outbox_runtime::publish::http::{HttpConfig, HttpPublisher};
use outbox_runtime::publish::nats::{NatsConfig, NatsPublisher, without_credentials};
use outbox_runtime::worker::{RetryPolicy, Worker, WorkerCounters};
use sqlx::PgPool;

use crate::billing::{self, BillingCounts};
use crate::orders::{self, Confirmation};
use crate::receiver::{self, ReceiverCounts, ShippingReceiver};

/// The NATS server tried when none is named.
pub const LOCAL_NATS: &str = "nats://127.0.0.1:4222";

/// Where the service's generated outbox migration lives (`outbox migrations generate`).
const SERVICE_MIGRATIONS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/order_service/migrations"
);

/// The worker's lease; both publishers' timeouts are checked against it at start.
const LEASE: Duration = Duration::from_secs(15);
/// The HTTP publisher's request timeout. Short, so a lost response is retried quickly.
const HTTP_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest the example waits for the worker to deliver everything.
const DEADLINE: Duration = Duration::from_secs(60);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Whether to publish to NATS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NatsChoice {
    /// Use this server; fail when it does not answer.
    Url(String),
    /// Use [`LOCAL_NATS`] when something answers there, else go on without NATS.
    Probe,
    /// Do not use NATS.
    Off,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Orders to place and confirm.
    pub orders: usize,
    /// Whether to publish to NATS.
    pub nats: NatsChoice,
    /// How many responses the shipping service loses on purpose (after applying the event).
    pub lose_responses: u64,
    /// Keep the example's JetStream stream instead of deleting it at the end.
    pub keep_stream: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            orders: 5,
            nats: NatsChoice::Probe,
            lose_responses: 2,
            keep_stream: false,
        }
    }
}

/// How NATS took part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NatsReport {
    /// Published to this stream.
    Used {
        /// Server URL.
        url: String,
        /// The stream created for this run.
        stream: String,
        /// The subject the events went to.
        subject: String,
        /// Messages in the stream at the end.
        messages: u64,
        /// Publishes the stream dropped as duplicates (same `Nats-Msg-Id`).
        duplicates: u64,
        /// The billing service's first pass over the stream.
        billing: BillingCounts,
        /// Its replay from the start (a consumer that lost its position): all duplicates.
        replay: BillingCounts,
        /// Invoice rows written, and confirmed orders with exactly one invoice.
        invoices: i64,
        /// Confirmed orders with exactly one invoice.
        invoiced_once: i64,
    },
    /// Not used, and why.
    NotUsed(String),
}

/// What happened, from the database and from each receiver.
#[derive(Debug, Clone)]
pub struct Report {
    /// Files of the service migrations folder applied (`None`: the folder does not exist).
    pub service_migrations: Option<usize>,
    /// Where the shipping service listened.
    pub http_url: String,
    /// NATS's part.
    pub nats: NatsReport,
    /// Orders placed.
    pub placed: usize,
    /// Confirmations that committed (order changed and event enqueued).
    pub confirmed: usize,
    /// Confirmations rolled back because the version check matched no row.
    pub stale_rejected: usize,
    /// Events in the outbox.
    pub events: i64,
    /// ... of which delivered.
    pub delivered: i64,
    /// ... still pending or processing.
    pub undelivered: i64,
    /// ... exhausted.
    pub exhausted: i64,
    /// Delivery attempts in all, as the worker counted them (delivered, retried, exhausted, or
    /// refused as stale). The outbox cannot count them: a delivered event keeps no attempt count,
    /// its queue row is deleted by the completion.
    pub attempts: u64,
    /// What the worker counted.
    pub worker: WorkerCounters,
    /// What the shipping service counted.
    pub http: ReceiverCounts,
    /// Shipment rows written by the shipping service.
    pub shipments: i64,
    /// Confirmed orders with exactly one shipment.
    pub shipped_once: i64,
    /// Inbox rows of the shipping service.
    pub inbox_rows: i64,
}

impl Report {
    /// Every confirmed order was delivered to every receiver that took part, exactly once in
    /// effect.
    pub fn ok(&self) -> bool {
        let nats_ok = match &self.nats {
            NatsReport::Used {
                messages,
                replay,
                invoices,
                invoiced_once,
                ..
            } => {
                *messages == self.confirmed as u64
                    && *invoices == self.confirmed as i64
                    && *invoiced_once == self.confirmed as i64
                    && replay.applied == 0
            }
            NatsReport::NotUsed(_) => true,
        };
        self.delivered == self.confirmed as i64
            && self.events == self.confirmed as i64
            && self.undelivered == 0
            && self.exhausted == 0
            && self.shipments == self.confirmed as i64
            && self.shipped_once == self.confirmed as i64
            && nats_ok
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.service_migrations {
            Some(files) => writeln!(
                f,
                "schema:    base schema + {files} service migration file(s)"
            )?,
            None => writeln!(f, "schema:    base schema (no service migrations folder)")?,
        }
        writeln!(f, "receivers:")?;
        writeln!(
            f,
            "  http  {} (shipping service, inbox consumer \"{}\")",
            self.http_url,
            receiver::CONSUMER
        )?;
        match &self.nats {
            NatsReport::Used {
                url,
                stream,
                subject,
                ..
            } => writeln!(
                f,
                "  nats  {url}, stream {stream}, subject {subject} (read by the billing service, inbox consumer \"{}\")",
                billing::CONSUMER
            )?,
            NatsReport::NotUsed(why) => writeln!(f, "  nats  not used: {why}")?,
        }
        writeln!(
            f,
            "orders:    {} placed, {} confirmed, {} stale confirmation(s) rolled back (the version check matched no row; no event written)",
            self.placed, self.confirmed, self.stale_rejected
        )?;
        writeln!(
            f,
            "outbox:    {} events, {} delivered, {} undelivered, {} exhausted; {} attempts ({} retried)",
            self.events,
            self.delivered,
            self.undelivered,
            self.exhausted,
            self.attempts,
            self.worker.retried
        )?;
        writeln!(
            f,
            "http:      {} requests, {} applied, {} duplicate(s) dropped by the inbox ({} response(s) lost on purpose, retried with the same Idempotency-Key)",
            self.http.requests, self.http.applied, self.http.duplicates, self.http.lost_responses
        )?;
        if let NatsReport::Used {
            messages,
            duplicates,
            ..
        } = &self.nats
        {
            writeln!(
                f,
                "nats:      {messages} messages in the stream, {duplicates} duplicate publish(es) dropped by the duplicate window"
            )?;
        }
        if let NatsReport::Used {
            billing,
            replay,
            invoices,
            invoiced_once,
            ..
        } = &self.nats
        {
            writeln!(
                f,
                "billing:   {} messages consumed, {} invoices written; replayed from the start: {} received, {} duplicate(s) dropped by the inbox; {invoices} invoices, {invoiced_once} orders invoiced exactly once",
                billing.received, billing.applied, replay.received, replay.duplicates
            )?;
        }
        writeln!(
            f,
            "shipments: {} for {} confirmed orders; {} shipped exactly once; {} inbox rows",
            self.shipments, self.confirmed, self.shipped_once, self.inbox_rows
        )?;
        write!(f, "result:    {}", if self.ok() { "OK" } else { "FAILED" })
    }
}

/// Run the example on `pool` (a database with the base schema applied).
pub async fn run(pool: &PgPool, options: &Options) -> Result<Report, BoxError> {
    let service_migrations = apply_service_migrations(pool).await?;
    orders::create_schema(pool).await?;

    let shipping = ShippingReceiver::start(
        pool,
        options.lose_responses,
        HTTP_TIMEOUT + Duration::from_secs(1),
    )
    .await?;
    let http = HttpPublisher::new(
        &shipping.url(),
        HttpConfig {
            timeout: HTTP_TIMEOUT,
            ..HttpConfig::default()
        },
    )?;
    // Worker::start checks every member's timeout against LEASE (Sink::check_lease).
    let mut sink = FanOut::new().to("http", http);

    let nats = connect_nats(&options.nats).await?;
    let mut stream = None;
    let nats_not_used = match &nats {
        Some((url, publisher)) => {
            let name = format!(
                "ORDER_SERVICE_{}",
                publisher
                    .config()
                    .subject_prefix
                    .trim_start_matches("order_service_")
            )
            .to_uppercase();
            // Two minutes covers every retry of this run; a service sizes it to its backoff cap.
            publisher
                .ensure_stream(&name, Duration::from_secs(120))
                .await?;
            println!("nats: publishing to {url}, stream {name}");
            stream = Some(name);
            sink = sink.to("nats", publisher.clone());
            None
        }
        None => Some(match &options.nats {
            NatsChoice::Off => "switched off (--no-nats)".to_owned(),
            _ => format!(
                "nothing answers at {LOCAL_NATS}; start a server with `nats-server -js`, or pass --nats-url / NATS_URL"
            ),
        }),
    };
    println!("receivers: {}", sink.names().join(", "));

    let worker = Worker::builder(pool.clone(), sink)
        .lease(LEASE)
        .retry(RetryPolicy {
            base: Duration::from_millis(200),
            max: Duration::from_secs(2),
            jitter: true,
        })
        .poll_interval(Duration::from_millis(500))
        .start()
        .await?;

    // The service's side: place orders, confirm them. Each confirmation commits the order change
    // and its event together; the worker is woken by the commit's notification.
    let mut placed = Vec::with_capacity(options.orders);
    for n in 0..options.orders {
        placed.push(
            orders::place_order(pool, &format!("customer-{}", n + 1), 1000 * (n as i64 + 1))
                .await?,
        );
    }
    let mut confirmed = 0;
    for order in &placed {
        if let Confirmation::Confirmed { .. } = orders::confirm_order(pool, *order).await? {
            confirmed += 1;
        }
    }
    // A second session confirms the first order with the version it read before: stale.
    let mut stale_rejected = 0;
    if let Some(first) = placed.first() {
        match orders::confirm_order(pool, *first).await? {
            Confirmation::Stale => stale_rejected += 1,
            Confirmation::Confirmed { .. } => {
                return Err("a stale confirmation was accepted".into());
            }
        }
    }
    println!(
        "orders: {} placed, {confirmed} confirmed, {stale_rejected} stale confirmation rolled back",
        placed.len()
    );

    wait_until_settled(pool, confirmed as i64).await?;
    worker.shutdown().await;
    let worker_counts = worker.counters();

    let nats_report = match (&nats, &stream) {
        (Some((url, publisher)), Some(name)) => {
            let mut handle = publisher.jetstream().get_stream(name).await?;
            let messages = handle.info().await?.state.messages;
            // The billing service reads the stream, then reads it all again as a consumer that
            // lost its position would.
            billing::create_schema(pool).await?;
            let first = billing::consume_from_start(pool, &handle, messages).await?;
            let replay = billing::consume_from_start(pool, &handle, messages).await?;
            let (invoices, invoiced_once): (i64, i64) = sqlx::query_as(
                "SELECT (SELECT count(*) FROM invoices),
                        (SELECT count(*) FROM orders o WHERE o.status = 'confirmed'
                           AND (SELECT count(*) FROM invoices i WHERE i.order_id = o.id) = 1)",
            )
            .fetch_one(pool)
            .await?;
            if !options.keep_stream {
                publisher.jetstream().delete_stream(name).await?;
            }
            NatsReport::Used {
                url: url.clone(),
                stream: name.clone(),
                subject: publisher.subject_for("order.confirmed"),
                messages,
                duplicates: publisher.stats().duplicates,
                billing: first,
                replay,
                invoices,
                invoiced_once,
            }
        }
        _ => NatsReport::NotUsed(nats_not_used.unwrap_or_default()),
    };

    // Where the events stand, as `outbox status` reads it.
    let stats = Store::new(pool.clone()).stats().await?;
    let (delivered, undelivered, exhausted) = (
        stats.delivered,
        stats.pending + stats.processing,
        stats.exhausted,
    );
    let events = delivered + undelivered + exhausted;
    let attempts = worker_counts.delivered
        + worker_counts.retried
        + worker_counts.exhausted
        + worker_counts.stale_completions;
    let (shipments, shipped_once, inbox_rows): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM shipments),
                (SELECT count(*) FROM orders o WHERE o.status = 'confirmed'
                   AND (SELECT count(*) FROM shipments s WHERE s.order_id = o.id) = 1),
                (SELECT count(*) FROM outbox_inbox WHERE consumer = $1)",
    )
    .bind(receiver::CONSUMER)
    .fetch_one(pool)
    .await?;

    Ok(Report {
        service_migrations,
        http_url: shipping.url(),
        nats: nats_report,
        placed: placed.len(),
        confirmed,
        stale_rejected,
        events,
        delivered,
        undelivered,
        exhausted,
        attempts,
        worker: worker_counts,
        http: shipping.counts(),
        shipments,
        shipped_once,
        inbox_rows,
    })
}

/// Apply `examples/order_service/migrations` (the generated outbox migration and contract
/// registry rows) when the folder exists.
async fn apply_service_migrations(pool: &PgPool) -> Result<Option<usize>, BoxError> {
    let dir = Path::new(SERVICE_MIGRATIONS);
    if !dir.is_dir() {
        println!(
            "service migrations: examples/order_service/migrations does not exist; base schema only"
        );
        return Ok(None);
    }
    let migrator = sqlx::migrate::Migrator::new(dir).await?;
    migrator.run(pool).await?;
    let files = migrator.iter().count();
    println!("service migrations: {files} applied from examples/order_service/migrations");
    Ok(Some(files))
}

/// Connect to NATS as chosen. `None`: go on without it.
async fn connect_nats(choice: &NatsChoice) -> Result<Option<(String, NatsPublisher)>, BoxError> {
    let url = match choice {
        NatsChoice::Off => return Ok(None),
        NatsChoice::Url(url) => url.clone(),
        NatsChoice::Probe => LOCAL_NATS.to_owned(),
    };
    // A prefix of its own per run, so runs (and tests) never share a stream.
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let config = NatsConfig {
        subject_prefix: format!("order_service_{run}"),
        ack_timeout: Duration::from_secs(5),
        ..NatsConfig::default()
    };
    let probe = matches!(choice, NatsChoice::Probe);
    let attempt = async {
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(if probe { 1 } else { 5 }))
            .connect(url.as_str())
            .await?;
        NatsPublisher::new(client, config).map_err(BoxError::from)
    };
    match attempt.await {
        // Shown in the output: never a password or token.
        Ok(publisher) => Ok(Some((without_credentials(&url), publisher))),
        Err(_) if probe => Ok(None),
        Err(e) => Err(format!("cannot use NATS at {}: {e}; start a server with `nats-server -js`, or leave out --nats-url", without_credentials(&url)).into()),
    }
}

/// Wait until every event is delivered or exhausted, by the database's count.
async fn wait_until_settled(pool: &PgPool, expected: i64) -> Result<(), BoxError> {
    let store = Store::new(pool.clone());
    let started = Instant::now();
    loop {
        let stats = store.stats().await?;
        if stats.pending == 0
            && stats.processing == 0
            && stats.delivered + stats.exhausted >= expected
        {
            return Ok(());
        }
        if started.elapsed() > DEADLINE {
            return Err(format!(
                "events still undelivered after {DEADLINE:?}: {} pending, {} processing (run with RUST_LOG=info to see why)",
                stats.pending, stats.processing
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

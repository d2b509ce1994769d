//! `--dashboard`: after the run, leave something for an operator to find (two orders confirmed
//! while the shipping service was down, exhausted), then serve the operator dashboard on the
//! example's database until Ctrl-C.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use outbox_runtime::Event;
use outbox_runtime::Store;
use outbox_runtime::dashboard::{self, DashboardConfig};
use outbox_runtime::publish::FanOut;
use outbox_runtime::publish::http::{HttpConfig, HttpPublisher};
use outbox_runtime::store::EnqueueOptions;
use outbox_runtime::worker::{RetryPolicy, Worker};
use sqlx::PgPool;
use uuid::Uuid;

use crate::events::OrderConfirmed;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Events written while the shipping service is down.
const DOWN_EVENTS: i64 = 2;
/// Attempts each of them gets before it is exhausted.
const DOWN_ATTEMPTS: i32 = 3;

/// Enqueue [`DOWN_EVENTS`] confirmations and let a worker publish them to a shipping address
/// where nothing listens, until each has used its attempts up.
pub async fn exhaust_while_shipping_is_down(pool: &PgPool) -> Result<(), BoxError> {
    // A loopback port nothing listens on: bind one, then let it go.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let shipping = HttpPublisher::new(
        &format!("http://{closed}/shipments"),
        HttpConfig {
            timeout: Duration::from_secs(1),
            ..HttpConfig::default()
        },
    )?;
    let store = Store::new(pool.clone());
    let exhausted_before = store.stats().await?.exhausted;
    let options = EnqueueOptions {
        max_attempts: DOWN_ATTEMPTS,
        headers: Some(serde_json::json!({"note": "confirmed while the shipping service was down"})),
        ..EnqueueOptions::default()
    };
    let mut tx = pool.begin().await?;
    for n in 0..DOWN_EVENTS {
        let event = OrderConfirmed {
            order_id: Uuid::new_v4(),
            order_version: 2,
            customer: format!("customer-late-{}", n + 1),
            total_cents: 4200,
        };
        event
            .enqueue_with(&mut tx, &format!("confirm-order/late-{n}"), &options)
            .await?;
    }
    tx.commit().await?;
    let worker = Worker::builder(pool.clone(), FanOut::new().to("http", shipping))
        .name("shipping-down-worker")
        .lease(Duration::from_secs(15))
        .retry(RetryPolicy {
            base: Duration::from_millis(100),
            max: Duration::from_millis(300),
            jitter: false,
        })
        .poll_interval(Duration::from_millis(100))
        .start()
        .await?;
    let started = Instant::now();
    let outcome = loop {
        let exhausted = store.stats().await?.exhausted - exhausted_before;
        if exhausted >= DOWN_EVENTS {
            break Ok(());
        }
        if started.elapsed() > Duration::from_secs(60) {
            break Err(format!(
                "only {exhausted} of {DOWN_EVENTS} events to the unreachable shipping service were exhausted after 60 s"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    worker.shutdown().await;
    println!(
        "shipping down: {DOWN_EVENTS} more confirmations could not be delivered and are exhausted after {DOWN_ATTEMPTS} attempts"
    );
    outcome
}

/// Serve the dashboard on `listen` with a fresh action token until Ctrl-C (the page asks for
/// it before it shows anything).
pub async fn serve_until_ctrl_c(pool: &PgPool, listen: SocketAddr) -> Result<(), BoxError> {
    // 256 random bits: the dashboard refuses a token shorter than 32 characters or made by hand.
    let token = format!("{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple());
    let config = DashboardConfig::new().with_token(Some(token.clone()))?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e} (pass --listen 127.0.0.1:<port>)"))?;
    let address = listener.local_addr()?;
    println!("dashboard: http://{address}/");
    println!("           token (paste it into the page: it reads and runs retry, purge): {token}");
    println!("           Ctrl-C stops it (and drops the example's database)");
    dashboard::serve(listener, pool.clone(), config, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}

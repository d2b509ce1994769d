//! Shared by `tests/publish_*.rs`: a test event, claiming and settling it the way the worker
//! does (Store + Sink, no worker), reading the row back, a real HTTP receiver on loopback that
//! uses the inbox, and the NATS connection.
#![allow(dead_code)] // Each test file uses a different part of this module.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use outbox_runtime::contract::Contract;
use outbox_runtime::delivery::FailureKind;
use outbox_runtime::inbox::{self, ApplyOutcome};
use outbox_runtime::publish::Envelope;
use outbox_runtime::publish::http::{BatchItemResult, BatchResponse};
use outbox_runtime::store::{ClaimedEvent, EnqueueOptions, FailOutcome, Ownership};
use outbox_runtime::{Delivery, Event, HandlerError, Sink, Store};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The lease of test claims: long enough that no lease expires during a test.
pub const LEASE: Duration = Duration::from_secs(60);

/// The event the publisher tests send. Implemented by hand (not derived) so these tests only
/// depend on the `Event` trait; its aggregate version is also a constant (7, asserted in the
/// publishers' headers) that no payload field holds, which `#[derive(Event)]` cannot express.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderShipped {
    pub order_id: Uuid,
    pub total_cents: i64,
    /// Tells the batch receiver what to answer for this item (see [`Receiver`]).
    pub note: String,
}

impl Event for OrderShipped {
    const NAME: &'static str = "test.order_shipped";
    const VERSION: u32 = 3;
    const TABLE: &'static str = "outbox";
    const AGGREGATE_TYPE: Option<&'static str> = Some("order");
    type Current = OrderShipped;

    fn into_current(self) -> Self::Current {
        self
    }

    fn aggregate_id(&self) -> Option<String> {
        Some(self.order_id.to_string())
    }

    fn aggregate_version(&self) -> Option<i64> {
        Some(7)
    }

    fn contract() -> Contract {
        Contract {
            name: Self::NAME,
            version: Self::VERSION,
            type_name: "adapters_support::OrderShipped",
            shape: serde_json::json!({"type": "object"}),
        }
    }
}

/// A W3C trace context stored with test events; publishers must forward it.
pub const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Enqueue one event (with a `traceparent` header) in a committed transaction.
pub async fn enqueue(pool: &PgPool, note: &str, max_attempts: i32) -> (Uuid, OrderShipped) {
    let event = OrderShipped {
        order_id: Uuid::new_v4(),
        total_cents: 4200,
        note: note.to_owned(),
    };
    let options = EnqueueOptions {
        max_attempts,
        headers: Some(serde_json::json!({ "traceparent": TRACEPARENT })),
        ..EnqueueOptions::default()
    };
    let mut tx = pool.begin().await.unwrap();
    let id = event
        .enqueue_with(&mut tx, &format!("ship-{}", event.order_id), &options)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    (id, event)
}

/// Claim every ready event (expecting exactly `n`), as the worker's claimer does.
pub async fn claim(store: &Store, n: usize) -> Vec<(ClaimedEvent, Delivery)> {
    let claimed = store
        .claim_batch("publish-test", 100, LEASE, false)
        .await
        .unwrap();
    assert_eq!(claimed.len(), n, "expected {n} claimable events");
    claimed
        .into_iter()
        .map(|e| {
            let d = Delivery::new(&e, CancellationToken::new());
            (e, d)
        })
        .collect()
}

/// What settling one delivery outcome did to the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    Delivered,
    Rescheduled,
    Exhausted,
}

/// Record a delivery outcome as the worker does: complete on `Ok`, fail otherwise. A retry is
/// rescheduled after the delay the sink asked for, or at once (`zero_backoff`) so tests need
/// not wait for the worker's backoff.
pub async fn settle(
    store: &Store,
    event: &ClaimedEvent,
    outcome: &Result<(), HandlerError>,
) -> Settled {
    match outcome {
        Ok(()) => {
            assert_eq!(
                store.complete_if_owned(event.claim()).await.unwrap(),
                Ownership::Owned
            );
            Settled::Delivered
        }
        Err(e) => {
            let (after, permanent) = match e.kind {
                FailureKind::Retry { after } => (after.unwrap_or(Duration::ZERO), false),
                FailureKind::Permanent => (Duration::ZERO, true),
            };
            match store
                .fail_if_owned(event.claim(), &e.stored_reason(), after, permanent)
                .await
                .unwrap()
            {
                FailOutcome::Rescheduled => Settled::Rescheduled,
                FailOutcome::Exhausted => Settled::Exhausted,
                FailOutcome::Lost => panic!("the test's claim was lost"),
            }
        }
    }
}

/// Claim the one ready event, deliver it through `sink` and settle the outcome.
pub async fn attempt(store: &Store, sink: &dyn Sink) -> (Result<(), HandlerError>, Settled) {
    let (outcome, settled, _) = numbered_attempt(store, sink).await;
    (outcome, settled)
}

/// [`attempt`], also returning which attempt it was (as its claim charged it): once delivered,
/// the event keeps no queue row, so no attempts to read afterwards.
pub async fn numbered_attempt(
    store: &Store,
    sink: &dyn Sink,
) -> (Result<(), HandlerError>, Settled, i32) {
    let mut claimed = claim(store, 1).await;
    let (event, delivery) = claimed.pop().unwrap();
    let outcome = sink.deliver(&event, &delivery).await;
    let settled = settle(store, &event, &outcome).await;
    (outcome, settled, event.attempts)
}

/// Where an event stands: its queue row's status, or `delivered` when it has none.
pub async fn status(pool: &PgPool, event_id: Uuid) -> String {
    sqlx::query_scalar(
        "SELECT coalesce(q.status, 'delivered')
         FROM outbox AS e LEFT JOIN outbox_queue AS q ON q.id = e.id WHERE e.event_id = $1",
    )
    .bind(event_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The delivery state of an event that is not delivered (its queue row), as the database has
/// it. A delivered event keeps none: ask [`status`].
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Row {
    pub status: String,
    pub attempts: i32,
    pub handler_failures: i32,
    pub last_error: Option<String>,
    /// Whether the row is ready to claim now, by the database clock.
    pub ready: bool,
    /// How long after its last change the row becomes claimable, in milliseconds: the delay a
    /// failure scheduled (both times come from the failing statement's `now()`).
    pub scheduled_delay_ms: i64,
}

pub async fn row(pool: &PgPool, event_id: Uuid) -> Row {
    sqlx::query_as(
        "SELECT q.status, q.attempts, q.handler_failures, q.last_error, q.available_at <= now() AS ready, \
                (extract(epoch FROM q.available_at - q.updated_at) * 1000)::bigint AS scheduled_delay_ms \
         FROM outbox_queue AS q JOIN outbox AS e ON e.id = q.id WHERE e.event_id = $1",
    )
    .bind(event_id)
    .fetch_optional(pool)
    .await
    .unwrap()
    .unwrap_or_else(|| panic!("event {event_id} has no queue row (delivered, or never enqueued)"))
}

// --- The HTTP receiver -------------------------------------------------------------------

/// What the receiver does with the next request to `/events` (a script, consumed in order;
/// when it is empty, [`Step::Apply`]).
#[derive(Debug, Clone)]
pub enum Step {
    /// Apply the event through the inbox: 200 the first time, 409 for a known key.
    Apply,
    /// Apply it and commit, then hold the response for this long (beyond the client's
    /// timeout): the publisher never sees the answer. A lost response.
    ApplyThenStall(Duration),
    /// Answer with this status and a page listing the request's headers, the way a debugging
    /// receiver does: as `name: value` lines, as a percent-encoded query string, and base64
    /// encoded whole. Nothing is applied.
    EchoHeaders(u16),
    /// Answer with this status and body, without applying anything.
    Respond {
        status: u16,
        body: String,
        retry_after: Option<String>,
    },
}

impl Step {
    pub fn respond(status: u16, body: &str) -> Step {
        Step::Respond {
            status,
            body: body.to_owned(),
            retry_after: None,
        }
    }
}

/// One request the receiver saw.
#[derive(Debug, Clone)]
pub struct Seen {
    pub idempotency_key: Option<String>,
    pub headers: HeaderMap,
    pub envelope: Option<Envelope>,
    /// For `/batch`: the envelopes of the array.
    pub batch: Vec<Envelope>,
    /// What it answered (the status it sent, even if the client had given up).
    pub answered: u16,
}

/// A real HTTP receiver on 127.0.0.1 (axum), applying events through the inbox into its own
/// table `receiver_effects` of the test database: the receiver-side record every test checks.
///
/// - `POST /events`: one envelope; follows the script (see [`Step`]).
/// - `POST /batch`: an array; a scripted [`Step::Respond`] answers the whole request, otherwise per item, by the payload's `note`: `"reject"` -> 422 with an
///   error, `"busy"` -> 503 with `retry_after: 5`, `"omit"` -> no result, `"echo:<text>"` ->
///   422 with `<text>` as the error, otherwise applied (200, or 409 for a known key).
pub struct Receiver {
    pub addr: SocketAddr,
    state: Arc<ReceiverState>,
    stop: CancellationToken,
}

struct ReceiverState {
    pool: PgPool,
    script: Mutex<VecDeque<Step>>,
    seen: Mutex<Vec<Seen>>,
}

pub const RECEIVER_CONSUMER: &str = "test-receiver";

impl Receiver {
    /// Start a receiver on a free loopback port.
    pub async fn start(pool: &PgPool, script: Vec<Step>) -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(listener, pool, script).await
    }

    /// Start a receiver on a given loopback port (to bring a receiver back where it was down).
    pub async fn start_on(port: u16, pool: &PgPool, script: Vec<Step>) -> Receiver {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        Self::serve(listener, pool, script).await
    }

    async fn serve(
        listener: tokio::net::TcpListener,
        pool: &PgPool,
        script: Vec<Step>,
    ) -> Receiver {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS receiver_effects (event_id uuid NOT NULL, total_cents bigint NOT NULL)",
        )
        .execute(pool)
        .await
        .unwrap();
        let state = Arc::new(ReceiverState {
            pool: pool.clone(),
            script: Mutex::new(script.into()),
            seen: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/events", post(on_event))
            .route("/batch", post(on_batch))
            .with_state(state.clone());
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stopped.cancelled_owned())
                .await
                .unwrap();
        });
        Receiver { addr, state, stop }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Every request seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// How many times the effect of `event_id` was applied (from the receiver's own table).
    pub async fn effects(&self, event_id: Uuid) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM receiver_effects WHERE event_id = $1")
            .bind(event_id)
            .fetch_one(&self.state.pool)
            .await
            .unwrap()
    }

    /// Effects applied in all.
    pub async fn total_effects(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM receiver_effects")
            .fetch_one(&self.state.pool)
            .await
            .unwrap()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Apply one envelope through the inbox: Applied -> the effect row is written in the same
/// transaction.
async fn apply(pool: &PgPool, envelope: &Envelope) -> ApplyOutcome {
    let mut tx = pool.begin().await.unwrap();
    let outcome = inbox::apply_once(&mut tx, RECEIVER_CONSUMER, envelope.id)
        .await
        .unwrap();
    if outcome == ApplyOutcome::Applied {
        let total = envelope.payload["total_cents"].as_i64().unwrap_or(-1);
        sqlx::query("INSERT INTO receiver_effects (event_id, total_cents) VALUES ($1, $2)")
            .bind(envelope.id)
            .bind(total)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    outcome
}

/// [`apply`] on a task of its own: hyper drops a handler whose client went away (a timeout),
/// and the effect must still commit or roll back as a whole, not stop half-way.
async fn apply_detached(pool: &PgPool, envelope: &Envelope) -> ApplyOutcome {
    let (pool, envelope) = (pool.clone(), envelope.clone());
    tokio::spawn(async move { apply(&pool, &envelope).await })
        .await
        .unwrap()
}

fn applied_status(outcome: ApplyOutcome) -> StatusCode {
    match outcome {
        ApplyOutcome::Applied => StatusCode::OK,
        ApplyOutcome::Duplicate => StatusCode::CONFLICT,
    }
}

async fn on_event(
    State(state): State<Arc<ReceiverState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let envelope: Option<Envelope> = serde_json::from_slice(&body).ok();
    let step = state
        .script
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or(Step::Apply);
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let record = |answered: u16| {
        state.seen.lock().unwrap().push(Seen {
            idempotency_key: key.clone(),
            headers: headers.clone(),
            envelope: envelope.clone(),
            batch: Vec::new(),
            answered,
        });
    };
    let Some(env) = envelope.as_ref() else {
        record(400);
        return (StatusCode::BAD_REQUEST, "body is not an envelope").into_response();
    };
    match step {
        Step::Apply => {
            let status = applied_status(apply_detached(&state.pool, env).await);
            record(status.as_u16());
            status.into_response()
        }
        Step::ApplyThenStall(hold) => {
            let status = applied_status(apply_detached(&state.pool, env).await);
            record(status.as_u16());
            tokio::time::sleep(hold).await;
            status.into_response()
        }
        Step::EchoHeaders(status) => {
            record(status);
            (StatusCode::from_u16(status).unwrap(), echo_page(&headers)).into_response()
        }
        Step::Respond {
            status,
            body,
            retry_after,
        } => {
            record(status);
            let mut response = (StatusCode::from_u16(status).unwrap(), body).into_response();
            if let Some(after) = retry_after {
                response
                    .headers_mut()
                    .insert("retry-after", after.parse().unwrap());
            }
            response
        }
    }
}

/// The page of [`Step::EchoHeaders`].
fn echo_page(headers: &HeaderMap) -> String {
    let mut lines = String::new();
    let mut query = Vec::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        lines.push_str(&format!("{name}: {value}\n"));
        query.push(format!("{name}={}", encode(&value)));
    }
    format!(
        "request headers:\n{lines}as a query: ?{}\nencoded: {}\n",
        query.join("&"),
        base64(lines.as_bytes())
    )
}

/// Standard base64 with padding (the tests' own, to encode what a receiver echoes).
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

async fn on_batch(
    State(state): State<Arc<ReceiverState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Ok(batch) = serde_json::from_slice::<Vec<Envelope>>(&body) else {
        return (StatusCode::BAD_REQUEST, "body is not an array of envelopes").into_response();
    };
    // A scripted answer applies to the whole request (a receiver in maintenance, say).
    let step = state.script.lock().unwrap().pop_front();
    if let Some(Step::Respond {
        status,
        body,
        retry_after,
    }) = step
    {
        state.seen.lock().unwrap().push(Seen {
            idempotency_key: None,
            headers,
            envelope: None,
            batch,
            answered: status,
        });
        let mut response = (StatusCode::from_u16(status).unwrap(), body).into_response();
        if let Some(after) = retry_after {
            response
                .headers_mut()
                .insert("retry-after", after.parse().unwrap());
        }
        return response;
    }
    let mut results = Vec::new();
    for env in &batch {
        let result = match env.payload["note"].as_str().unwrap_or("") {
            "reject" => BatchItemResult {
                id: env.id,
                status: 422,
                retry_after: None,
                error: Some("total_cents must be positive".into()),
            },
            "busy" => BatchItemResult {
                id: env.id,
                status: 503,
                retry_after: Some(5),
                error: Some("busy".into()),
            },
            "omit" => continue,
            // A receiver whose item error repeats whatever the event carried after `echo:`.
            note if note.starts_with("echo:") => BatchItemResult {
                id: env.id,
                status: 422,
                retry_after: None,
                error: Some(note["echo:".len()..].to_owned()),
            },
            _ => {
                let status = applied_status(apply_detached(&state.pool, env).await);
                BatchItemResult {
                    id: env.id,
                    status: status.as_u16(),
                    retry_after: None,
                    error: None,
                }
            }
        };
        results.push(result);
    }
    state.seen.lock().unwrap().push(Seen {
        idempotency_key: None,
        headers,
        envelope: None,
        batch,
        answered: 200,
    });
    axum::Json(BatchResponse { results }).into_response()
}

/// Run a real worker over `sink` until every one of `ids` is exhausted (each enqueued with one
/// attempt), and return their `last_error`s.
pub async fn exhaust_with_a_worker(pool: &PgPool, sink: impl Sink, ids: &[Uuid]) -> Vec<String> {
    let worker = outbox_runtime::worker::Worker::builder(pool.clone(), sink)
        .lease(LEASE)
        .poll_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    wait_until(
        "every event exhausted by the worker",
        Duration::from_secs(30),
        || async {
            let mut all = true;
            for id in ids {
                all &= status(pool, *id).await == "exhausted";
            }
            all
        },
    )
    .await;
    worker.shutdown().await;
    let mut reasons = Vec::new();
    for id in ids {
        reasons.push(row(pool, *id).await.last_error.unwrap_or_default());
    }
    reasons
}

// --- Waiting and logs ----------------------------------------------------------------------

/// Wait until `check` holds, polling every 20 ms; panic saying `what` did not happen when it
/// still does not hold after `within` (a regression fails with a message, never hangs).
pub async fn wait_until<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let polling = async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    if tokio::time::timeout(within, polling).await.is_err() {
        panic!("{what}: not seen within {within:?}");
    }
}

/// Everything every thread of this test binary logged, as the `fmt` subscriber writes it: every
/// crate at DEBUG and up, this project at TRACE too. (async-nats's TRACE protocol dump shows
/// the CONNECT frame with the user name, password masked: a wire trace, beyond this project.)
/// Installed once per process as the global subscriber, so it also sees the worker's and the
/// receiver's tasks; tests look for values of their own.
pub fn captured_logs() -> &'static CapturedLogs {
    static LOGS: std::sync::OnceLock<CapturedLogs> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = CapturedLogs(Arc::new(Mutex::new(Vec::new())));
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "debug,outbox_runtime=trace",
            ))
            .with_ansi(false)
            .with_writer(logs.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in the publisher tests");
        logs
    })
}

/// A buffer the log subscriber writes into; see [`captured_logs`].
#[derive(Clone)]
pub struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl CapturedLogs {
    /// The log text so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CapturedLogs {
    type Writer = CapturedLogs;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Secrets a receiver URL carries, random per test, with characters that URLs percent-encode
/// (so the raw and the encoded spelling differ).
pub struct UrlSecrets {
    pub user: String,
    pub password: String,
    pub token: String,
}

impl UrlSecrets {
    pub fn new() -> UrlSecrets {
        let unique = Uuid::new_v4().simple().to_string();
        UrlSecrets {
            user: format!("svc{}", &unique[..10]),
            password: format!("pw:{}/x y@z", &unique[10..20]),
            token: format!("T0k/{}+=&", &unique[20..30]),
        }
    }

    /// `scheme://user:password@host_port/path?token=...`, each secret percent-encoded.
    pub fn url(&self, scheme: &str, host_port: &str, path: &str) -> String {
        format!(
            "{scheme}://{}:{}@{host_port}{path}?token={}",
            self.user,
            encode(&self.password),
            encode(&self.token)
        )
    }

    /// What a hostile receiver answers: the URL, and each secret raw and percent-encoded in
    /// upper- and lowercase hex, around a marker that is no secret (to find the body in logs).
    pub fn body(&self, url: &str, marker: &str) -> String {
        let mut body = format!("<html>{marker}: moved to <a href=\"{url}\">{url}</a>");
        for s in self.all() {
            body.push_str(&format!(" [{s}] [{}] [{}]", encode(s), encode_lower(s)));
        }
        body.push_str("</html>");
        body
    }

    fn all(&self) -> [&String; 3] {
        [&self.user, &self.password, &self.token]
    }

    /// Panic when `text` holds any secret, raw or percent-encoded.
    pub fn assert_absent(&self, text: &str, context: &str) {
        for s in self.all() {
            for spelling in [s.clone(), encode(s), encode_lower(s)] {
                assert!(
                    !text.contains(&spelling),
                    "{context} holds the secret {spelling:?}: {text}"
                );
            }
        }
    }
}

/// Every byte other than letters and digits as `%XX` (uppercase hex).
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// [`encode`] with lowercase hex digits.
pub fn encode_lower(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                char::from(b).to_string()
            } else {
                format!("%{b:02x}")
            }
        })
        .collect()
}

/// A loopback port nothing listens on (bound, then released).
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

// --- NATS -------------------------------------------------------------------------------

/// The NATS server of the tests: `NATS_URL`, or 127.0.0.1:4222. Panics with how to start one:
/// these tests never pass without a real server.
pub async fn nats() -> async_nats::Client {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let connect = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(3))
        .connect(&url);
    match tokio::time::timeout(Duration::from_secs(5), connect).await {
        Ok(Ok(client)) => client,
        Ok(Err(e)) => panic!(
            "the NATS tests need a JetStream-enabled NATS server at {url} and cannot connect: {e}. \
             Start one with `nats-server -js` (or set NATS_URL)"
        ),
        Err(_) => panic!(
            "the NATS tests need a JetStream-enabled NATS server at {url}, which did not answer within 5 s. \
             Start one with `nats-server -js` (or set NATS_URL)"
        ),
    }
}

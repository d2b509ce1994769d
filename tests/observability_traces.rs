//! One trace from the producer's span to the consumer's, through the outbox: a real PostgreSQL,
//! a real worker, and the real HTTP receiver and NATS server behind the publishers. Spans are
//! recorded by OpenTelemetry's in-memory exporter behind a `tracing-opentelemetry` layer (the
//! setup a service has, with OTLP swapped for memory).
//!
//! Every test names its producer span uniquely and follows that span's trace id, since the
//! tests of this binary share one global subscriber.

mod adapters_support;

use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use opentelemetry::trace::{SpanId, TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use outbox_runtime::inbox::{self, ApplyOutcome};
use outbox_runtime::publish::http::{HttpConfig, HttpPublisher};
use outbox_runtime::publish::nats::{NatsConfig, NatsPublisher};
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::worker::{Worker, WorkerHandle};
use outbox_runtime::{Delivery, Dispatcher, Event, HandlerError, Sink, handler};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

/// Longest wait for any one condition.
const DEADLINE: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "traced.order_placed", version = 1)]
pub struct OrderPlaced {
    #[outbox(aggregate_id)]
    pub order: String,
}

/// The consumer side of the dispatcher test: its own span, inside the delivery.
#[handler]
async fn on_order_placed(event: OrderPlaced, _ctx: Delivery) -> Result<(), HandlerError> {
    async {}
        .instrument(tracing::info_span!("handle_order_placed", order = %event.order))
        .await;
    Ok(())
}

/// The spans every test of this binary records.
fn spans() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    &EXPORTER
        .get_or_init(|| {
            let exporter = InMemorySpanExporter::default();
            let provider = SdkTracerProvider::builder()
                .with_simple_exporter(exporter.clone())
                .build();
            let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("outbox-tests"));
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
                .expect("no other global subscriber in this test binary");
            (exporter, provider)
        })
        .0
}

/// Every finished span of `trace`.
fn finished(trace: TraceId) -> Vec<SpanData> {
    spans()
        .get_finished_spans()
        .expect("reading the in-memory exporter")
        .into_iter()
        .filter(|s| s.span_context.trace_id() == trace)
        .collect()
}

/// Wait until a finished span of `trace` named `name` exists, and return it.
async fn wait_for_span(trace: TraceId, name: &str) -> SpanData {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(span) = finished(trace).into_iter().find(|s| s.name == name) {
            return span;
        }
        if tokio::time::Instant::now() > deadline {
            let seen: Vec<_> = finished(trace).into_iter().map(|s| s.name).collect();
            panic!("no span `{name}` in trace {trace} within {DEADLINE:?}; the trace has {seen:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Enqueue one `OrderPlaced` inside a producer span named `producer` (as a request handler
/// would), commit, end the span, and return its trace and span ids.
async fn produce(pool: &PgPool, producer: &'static str, order: &str) -> (TraceId, SpanId) {
    spans();
    let span = tracing::info_span!("producer", otel.name = producer);
    let ids = async {
        let cx = tracing::Span::current().context();
        let ids = (
            cx.span().span_context().trace_id(),
            cx.span().span_context().span_id(),
        );
        let mut tx = pool.begin().await.unwrap();
        OrderPlaced {
            order: order.to_owned(),
        }
        .enqueue(&mut tx, &format!("place/{order}"))
        .await
        .unwrap();
        tx.commit().await.unwrap();
        ids
    }
    .instrument(span)
    .await;
    assert_ne!(ids.0, TraceId::INVALID, "the producer span is recorded");
    // The producer span has ended: it is exported.
    wait_for_span(ids.0, producer).await;
    (ids.0, ids.1)
}

/// The stored headers of the one event of `order`.
async fn stored_headers(pool: &PgPool, order: &str) -> serde_json::Value {
    sqlx::query_scalar("SELECT headers FROM outbox WHERE aggregate_id = $1")
        .bind(order)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn worker(pool: &PgPool, sink: impl Sink) -> WorkerHandle {
    Worker::builder(pool.clone(), sink)
        .poll_interval(Duration::from_millis(100))
        .lease(Duration::from_secs(30))
        .start()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_handler_span_continues_the_producer_trace_through_a_real_worker() {
    let db = TestDatabase::new().await;
    let (trace, producer) = produce(db.pool(), "place_order_dispatcher", "o-dispatch").await;

    // The context is stored as W3C headers, in the enqueue (not by the store).
    let headers = stored_headers(db.pool(), "o-dispatch").await;
    let traceparent = headers["traceparent"].as_str().expect("traceparent stored");
    assert_eq!(traceparent, format!("00-{trace}-{producer}-01"));
    assert!(
        headers.get("baggage").is_none(),
        "baggage is not copied unless asked"
    );

    let dispatcher = Dispatcher::builder()
        .handler(on_order_placed)
        .build()
        .unwrap();
    let handle = worker(db.pool(), dispatcher).await;
    let handled = wait_for_span(trace, "handle_order_placed").await;
    let delivery = wait_for_span(trace, "outbox_delivery").await;
    handle.shutdown().await;

    assert_eq!(
        delivery.parent_span_id, producer,
        "the delivery span is a child of the producer's span"
    );
    assert_eq!(
        handled.parent_span_id,
        delivery.span_context.span_id(),
        "the handler's span is a child of the delivery span"
    );
}

#[tokio::test]
async fn a_caller_traceparent_is_kept_and_baggage_is_copied_only_when_asked() {
    use opentelemetry::KeyValue;
    use opentelemetry::baggage::BaggageExt;
    use outbox_runtime::store::EnqueueOptions;

    let db = TestDatabase::new().await;
    spans();
    let mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let span = tracing::info_span!("producer", otel.name = "place_order_options");
    async {
        let mut tx = db.pool().begin().await.unwrap();
        let given = EnqueueOptions {
            headers: Some(serde_json::json!({ "traceparent": mine })),
            ..EnqueueOptions::default()
        };
        OrderPlaced {
            order: "o-given".into(),
        }
        .enqueue_with(&mut tx, "place/o-given", &given)
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
    .instrument(span)
    .await;
    let given = stored_headers(db.pool(), "o-given").await;
    assert_eq!(given["traceparent"], mine, "the caller's traceparent wins");

    // Baggage that came with the request (extracted into the producer span's parent context,
    // as a service's HTTP layer does): copied only when asked.
    let span = tracing::info_span!("producer", otel.name = "place_order_baggage");
    span.set_parent(
        opentelemetry::Context::new().with_baggage(vec![KeyValue::new("tenant", "acme")]),
    )
    .unwrap();
    async {
        let mut tx = db.pool().begin().await.unwrap();
        OrderPlaced {
            order: "o-plain".into(),
        }
        .enqueue(&mut tx, "place/o-plain")
        .await
        .unwrap();
        let asked = EnqueueOptions {
            trace_baggage: true,
            ..EnqueueOptions::default()
        };
        OrderPlaced {
            order: "o-baggage".into(),
        }
        .enqueue_with(&mut tx, "place/o-baggage", &asked)
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
    .instrument(span)
    .await;
    let plain = stored_headers(db.pool(), "o-plain").await;
    assert!(plain["traceparent"].is_string(), "{plain}");
    assert!(plain.get("baggage").is_none(), "{plain}");
    let asked = stored_headers(db.pool(), "o-baggage").await;
    assert_eq!(asked["baggage"], "tenant=acme", "{asked}");
}

/// The `Producer` (the README's fast path) stores the trace context like `Event::enqueue`:
/// each of its events continues the producer span's trace, with `enqueue` and with
/// `enqueue_with` (whose options still choose the baggage), instead of every delivery attempt
/// starting a trace of its own.
#[tokio::test]
async fn a_producer_transaction_stores_the_trace_context_of_its_span() {
    use opentelemetry::KeyValue;
    use opentelemetry::baggage::BaggageExt;
    use outbox_runtime::Producer;
    use outbox_runtime::store::EnqueueOptions;

    let db = TestDatabase::new().await;
    spans();
    let producer = Producer::new(db.pool().clone());
    let span = tracing::info_span!("producer", otel.name = "place_order_producer");
    span.set_parent(
        opentelemetry::Context::new().with_baggage(vec![KeyValue::new("tenant", "acme")]),
    )
    .unwrap();
    let (trace, producer_span) = async {
        let cx = tracing::Span::current().context();
        let ids = (
            cx.span().span_context().trace_id(),
            cx.span().span_context().span_id(),
        );
        let mut tx = producer.begin().await.unwrap();
        tx.enqueue(
            &OrderPlaced {
                order: "o-producer".into(),
            },
            "place/o-producer",
        )
        .await
        .unwrap();
        let asked = EnqueueOptions {
            trace_baggage: true,
            ..EnqueueOptions::default()
        };
        tx.enqueue_with(
            &OrderPlaced {
                order: "o-producer-with".into(),
            },
            "place/o-producer-with",
            &asked,
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        ids
    }
    .instrument(span)
    .await;
    producer.close().await;
    assert_ne!(trace, TraceId::INVALID, "the producer span is recorded");
    let expected = format!("00-{trace}-{producer_span}-01");

    let plain = stored_headers(db.pool(), "o-producer").await;
    assert_eq!(
        plain["traceparent"], expected,
        "Producer::enqueue stored no trace context: {plain}"
    );
    assert!(plain.get("baggage").is_none(), "{plain}");
    let with = stored_headers(db.pool(), "o-producer-with").await;
    assert_eq!(
        with["traceparent"], expected,
        "Producer::enqueue_with stored no trace context: {with}"
    );
    assert_eq!(with["baggage"], "tenant=acme", "{with}");

    // The worker continues it: the delivery is a child of the producer's span.
    let handle = worker(
        db.pool(),
        Dispatcher::builder()
            .handler(on_order_placed)
            .build()
            .unwrap(),
    )
    .await;
    let delivery = wait_for_span(trace, "outbox_delivery").await;
    handle.shutdown().await;
    assert_eq!(delivery.parent_span_id, producer_span);
}

// --- HTTP --------------------------------------------------------------------------------

/// A receiver that continues the trace from the request's headers and applies the event
/// through the inbox inside its span.
async fn http_receiver(pool: PgPool) -> (String, CancellationToken) {
    async fn receive(
        State(pool): State<PgPool>,
        headers: HeaderMap,
        body: axum::body::Bytes,
    ) -> StatusCode {
        let span = tracing::info_span!("receive_http");
        let pairs = headers
            .iter()
            .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?)));
        assert!(
            inbox::continue_trace(&span, pairs),
            "the request carries a trace context"
        );
        async {
            let envelope: outbox_runtime::publish::Envelope =
                serde_json::from_slice(&body).unwrap();
            let mut tx = pool.begin().await.unwrap();
            let outcome = inbox::apply_once(&mut tx, "traces-test", envelope.id)
                .await
                .unwrap();
            tx.commit().await.unwrap();
            match outcome {
                ApplyOutcome::Applied => StatusCode::OK,
                ApplyOutcome::Duplicate => StatusCode::CONFLICT,
            }
        }
        .instrument(span)
        .await
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/events", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let app = Router::new()
        .route("/events", post(receive))
        .with_state(pool);
    let until = stop.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { until.cancelled().await })
            .await
            .unwrap();
    });
    (url, stop)
}

#[tokio::test]
async fn the_http_receiver_continues_the_trace_of_the_delivery() {
    let db = TestDatabase::new().await;
    let (url, stop) = http_receiver(db.pool().clone()).await;
    let publisher = HttpPublisher::new(
        &url,
        HttpConfig {
            timeout: Duration::from_secs(5),
            ..HttpConfig::default()
        },
    )
    .unwrap();
    let (trace, producer) = produce(db.pool(), "place_order_http", "o-http").await;
    let handle = worker(db.pool(), publisher).await;
    let received = wait_for_span(trace, "receive_http").await;
    let delivery = wait_for_span(trace, "outbox_delivery").await;
    handle.shutdown().await;
    stop.cancel();

    assert_eq!(delivery.parent_span_id, producer);
    assert_eq!(
        received.parent_span_id,
        delivery.span_context.span_id(),
        "the receiver's span is a child of the delivery that sent the request"
    );
    let applied: bool = inbox::is_applied(
        db.pool(),
        "traces-test",
        outbox_runtime::store::enqueue::event_id_for("outbox", "place/o-http"),
    )
    .await
    .unwrap();
    assert!(applied, "the receiver applied the event through the inbox");
}

// --- NATS --------------------------------------------------------------------------------

#[tokio::test]
async fn the_nats_consumer_continues_the_trace_of_the_delivery() {
    let db = TestDatabase::new().await;
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let publisher = NatsPublisher::new(
        adapters_support::nats().await,
        NatsConfig {
            subject_prefix: format!("t{unique}"),
            ack_timeout: Duration::from_secs(5),
            ..Default::default()
        },
    )
    .unwrap();
    let stream_name = format!("OUTBOX_TRACES_{}", unique.to_uppercase());
    publisher
        .ensure_stream(&stream_name, Duration::from_secs(120))
        .await
        .unwrap();
    let jetstream = publisher.jetstream().clone();

    let (trace, producer) = produce(db.pool(), "place_order_nats", "o-nats").await;
    let handle = worker(db.pool(), publisher).await;
    let delivery = wait_for_span(trace, "outbox_delivery").await;
    handle.shutdown().await;

    // The consumer reads the stored message and continues its trace.
    let stream = jetstream.get_stream(&stream_name).await.unwrap();
    let message = stream.get_raw_message(1).await.unwrap();
    let headers: Vec<(String, String)> = message
        .headers
        .iter()
        .flat_map(|(name, values)| {
            values
                .iter()
                .map(move |v| (name.to_string(), v.as_str().to_owned()))
        })
        .collect();
    let span = tracing::info_span!("receive_nats");
    assert!(inbox::continue_trace(
        &span,
        headers.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    ));
    drop(span.entered());
    let received = wait_for_span(trace, "receive_nats").await;
    let _ = jetstream.delete_stream(&stream_name).await;

    assert_eq!(delivery.parent_span_id, producer);
    assert_eq!(received.parent_span_id, delivery.span_context.span_id());
}

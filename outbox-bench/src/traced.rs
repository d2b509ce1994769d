//! The `traced` workload (feature `opentelemetry`): what trace context through the outbox costs
//! the drain. The same tuned drain runs with tracing off and on, interleaved run by run. On:
//! every event is enqueued in a producer span of its own (so it carries its own
//! `traceparent`), the worker's delivery spans continue those traces, and the spans are
//! recorded by a `tracing-opentelemetry` layer and handed to the SDK's batch processor, which
//! exports them to memory (no network: the cost measured is the service's, not a collector's).
//! Off: the layer is switched off by a filter, and the events carry no context.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::dynamic_filter_fn;
use tracing_subscriber::registry::LookupSpan;

use crate::BenchResult;
use crate::db::BenchDb;
use crate::drain::{self, DrainSetting, Drained};
use crate::event::PayloadShape;

/// Whether the OpenTelemetry layer records spans now.
static RECORDING: AtomicBool = AtomicBool::new(false);
/// The tracer provider behind the layer and the exporter it feeds.
static SPANS: OnceLock<(SdkTracerProvider, InMemorySpanExporter)> = OnceLock::new();

/// The OpenTelemetry layer of the bench's subscriber, recording only while a traced drain runs.
pub fn layer<S>() -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter.clone())
        .build();
    let tracer = provider.tracer("outbox-bench");
    let _ = SPANS.set((provider, exporter));
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        // Dynamic: asked at every span (a plain `filter_fn` caches its first answer per
        // callsite, which would keep the delivery span off after an untraced drain).
        .with_filter(dynamic_filter_fn(|_, _| RECORDING.load(Ordering::Relaxed)))
}

/// One drain of `n` events with `setting`, traced when `on`. Returns the drain and the number of
/// delivery spans the exporter received whose parent is a producer span.
pub async fn run(
    db: &BenchDb,
    n: i64,
    shape: &PayloadShape,
    setting: DrainSetting,
    on: bool,
) -> BenchResult<(Drained, usize)> {
    RECORDING.store(on, Ordering::Relaxed);
    let drained = drain::run_outbox_in_spans(db, n, shape, setting, on).await;
    RECORDING.store(false, Ordering::Relaxed);
    let mut spans = 0;
    if let Some((provider, exporter)) = SPANS.get() {
        let _ = provider.force_flush();
        // Delivery spans that continue a producer's trace: the proof that the feature ran.
        spans = exporter.get_finished_spans().map_or(0, |all| {
            all.iter()
                .filter(|s| s.name == "outbox_delivery" && s.parent_span_is_remote)
                .count()
        });
        exporter.reset();
    }
    Ok((drained?, spans))
}

//! What the example exports, set up the way a service would:
//!
//! - **Metrics**: the `metrics-exporter-prometheus` recorder, with the worker's histograms given
//!   buckets (so they render as Prometheus histograms, not summaries), served as Prometheus
//!   text on `GET /metrics` by a small axum server.
//! - **Traces**: a `tracing-opentelemetry` layer over an OpenTelemetry SDK tracer provider that
//!   exports over OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (the exporter reads the
//!   variable itself, e.g. `http://127.0.0.1:4318`), and, with `--print-trace`, also keeps the
//!   spans in memory so the example can print one order's trace.

use std::collections::HashMap;
use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use outbox_runtime::worker::metrics as outbox_metrics;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The exporters of one run.
pub struct Telemetry {
    prometheus: PrometheusHandle,
    provider: Option<SdkTracerProvider>,
    memory: Option<InMemorySpanExporter>,
    /// Whether spans go to an OTLP endpoint.
    pub otlp: bool,
}

/// Install the metrics recorder and the tracing subscriber (log lines to stderr at the
/// `RUST_LOG` level, default `warn`; spans at INFO to OpenTelemetry when an exporter is on).
pub fn init(print_trace: bool) -> Result<Telemetry, BoxError> {
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".into()),
            outbox_metrics::SECONDS_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full(outbox_metrics::DELIVERY_ATTEMPTS.into()),
            outbox_metrics::ATTEMPTS_BUCKETS,
        )?
        .install_recorder()?;

    let otlp = std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_some();
    let memory = print_trace.then(InMemorySpanExporter::default);
    let provider = if otlp || memory.is_some() {
        let mut builder = SdkTracerProvider::builder().with_resource(
            Resource::builder()
                .with_service_name("order_service")
                .build(),
        );
        if otlp {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .build()?;
            builder = builder.with_batch_exporter(exporter);
        }
        if let Some(memory) = &memory {
            builder = builder.with_simple_exporter(memory.clone());
        }
        Some(builder.build())
    } else {
        None
    };

    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        );
    let spans = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("order_service"))
            .with_filter(LevelFilter::INFO)
    });
    tracing_subscriber::registry()
        .with(logs)
        .with(spans)
        .try_init()?;
    Ok(Telemetry {
        prometheus,
        provider,
        memory,
        otlp,
    })
}

impl Telemetry {
    /// Serve `GET /metrics` on `addr` until `stop`; returns the bound address.
    pub async fn serve_metrics(
        &self,
        addr: SocketAddr,
        stop: CancellationToken,
    ) -> Result<SocketAddr, BoxError> {
        let handle = self.prometheus.clone();
        let app = Router::new().route(
            "/metrics",
            get(move || {
                let handle = handle.clone();
                async move { handle.render() }
            }),
        );
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "the /metrics server stopped");
            }
        });
        Ok(bound)
    }

    /// Send the spans still buffered and stop the exporters.
    pub fn shutdown(&self) {
        if let Some(provider) = &self.provider {
            if let Err(e) = provider.shutdown() {
                eprintln!("order_service: flushing traces failed: {e}");
            }
        }
    }

    /// The trace of the first order confirmed (the first producer span, `confirm_order`, whose
    /// event was delivered), as an indented tree of spans, when spans were kept in memory
    /// (`--print-trace`).
    pub fn first_order_trace(&self) -> Option<String> {
        let spans = self.memory.as_ref()?.get_finished_spans().ok()?;
        let delivered = |trace: TraceId| {
            spans
                .iter()
                .any(|s| s.name == "outbox_delivery" && s.span_context.trace_id() == trace)
        };
        let root = spans
            .iter()
            .filter(|s| s.name == "confirm_order" && delivered(s.span_context.trace_id()))
            .min_by_key(|s| s.start_time)?;
        let trace = root.span_context.trace_id();
        let in_trace: Vec<&SpanData> = spans
            .iter()
            .filter(|s| s.span_context.trace_id() == trace)
            .collect();
        let mut children: HashMap<SpanId, Vec<&SpanData>> = HashMap::new();
        for span in &in_trace {
            children.entry(span.parent_span_id).or_default().push(span);
        }
        for list in children.values_mut() {
            list.sort_by_key(|s| s.start_time);
        }
        let mut out = format!("trace {trace}\n");
        write_tree(&mut out, root, &children, 0, trace);
        Some(out)
    }
}

fn write_tree(
    out: &mut String,
    span: &SpanData,
    children: &HashMap<SpanId, Vec<&SpanData>>,
    depth: usize,
    trace: TraceId,
) {
    let took = span
        .end_time
        .duration_since(span.start_time)
        .unwrap_or_default();
    let attempt = span
        .attributes
        .iter()
        .find(|kv| kv.key.as_str() == "attempt")
        .map(|kv| format!(" attempt={}", kv.value))
        .unwrap_or_default();
    out.push_str(&format!(
        "{:indent$}{} ({:.1} ms){attempt}\n",
        "",
        span.name,
        took.as_secs_f64() * 1000.0,
        indent = depth * 2
    ));
    for child in children
        .get(&span.span_context.span_id())
        .into_iter()
        .flatten()
    {
        if child.span_context.trace_id() == trace {
            write_tree(out, child, children, depth + 1, trace);
        }
    }
}

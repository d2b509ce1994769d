//! W3C trace context through the outbox (feature `opentelemetry`): one trace from the request
//! that wrote an event to the consumer that received it.
//!
//! ```text
//! producer span ──enqueue──> headers {"traceparent", "tracestate"} (stored with the event)
//!      └─ outbox_delivery span (worker; a child of the producer's span, one per attempt)
//!            ├─ handler spans (the Dispatcher's handlers run inside it)
//!            └─ publisher: message headers traceparent/tracestate = this delivery span
//!                  └─ consumer span (continued with inbox::continue_trace)
//! ```
//!
//! - **Enqueue** ([`crate::Event::enqueue`], [`crate::Event::enqueue_with`], and a
//!   [`crate::Producer`] transaction's `enqueue` and `enqueue_with`, all through one typed
//!   enqueue function) writes the current
//!   context into the event's headers as W3C `traceparent` and `tracestate`: the current
//!   `tracing` span's OpenTelemetry context (through `tracing-opentelemetry`), or else
//!   OpenTelemetry's own current context. Headers the caller set win: an event whose headers
//!   already hold a `traceparent` is stored as given. Nothing is written when no span is
//!   recording (no OpenTelemetry layer or tracer, or the span is not valid). W3C `baggage` is
//!   copied only when [`crate::store::EnqueueOptions::trace_baggage`] asks for it: baggage
//!   often carries user data, and the outbox keeps headers for its retention period.
//! - **The worker's delivery span** (`outbox_delivery`) is a **child** of the stored context,
//!   not a new trace with a link: the delivery is the continuation of the business action,
//!   and a trace view that shows the order's HTTP call, its deliveries (one span per attempt,
//!   retries included) and the consumer's work under one trace id is what an on-call engineer
//!   follows. The gap between enqueue and delivery shows as the time between the spans. The
//!   one exception is a batch delivery (`outbox_delivery_batch`, a sink with a batch API): one
//!   span serves events of many traces, so it starts a trace of its own with a **link** to
//!   each event's context.
//! - **Publishers** (HTTP, NATS) send `traceparent`/`tracestate` of the delivery span as message
//!   headers, so the receiver's span is a child of the delivery. The envelope's `headers` keep
//!   the stored (producer's) values.
//! - **Consumers** continue the trace with [`crate::inbox::continue_trace`] (or read it with
//!   [`context_from_headers`]).
//!
//! The W3C format is written and read by `opentelemetry_sdk`'s propagators, never by hand.

use std::collections::HashMap;

use opentelemetry::Context;
use opentelemetry::baggage::BaggageExt;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The W3C trace context header naming the trace and the parent span.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C trace context header carrying vendor state.
pub const TRACESTATE: &str = "tracestate";
/// The W3C baggage header (copied only when asked for).
pub const BAGGAGE: &str = "baggage";

/// The context of the code running now: the current `tracing` span's OpenTelemetry context when
/// that span is recorded by a `tracing-opentelemetry` layer, else OpenTelemetry's current
/// context (code instrumented with the OpenTelemetry API directly).
pub fn current_context() -> Context {
    let from_tracing = tracing::Span::current().context();
    if from_tracing.span().span_context().is_valid() {
        from_tracing
    } else {
        Context::current()
    }
}

/// Stored headers with the current context added, or `None` when nothing is to be added: no
/// valid current span, the caller's headers already carry a `traceparent`, or they are not a
/// JSON object (enqueue then refuses them with its own error).
pub(crate) fn capture(
    headers: Option<&serde_json::Value>,
    with_baggage: bool,
) -> Option<serde_json::Value> {
    let mut object = match headers {
        None => serde_json::Map::new(),
        Some(serde_json::Value::Object(object)) => {
            if object.keys().any(|k| k.eq_ignore_ascii_case(TRACEPARENT)) {
                return None;
            }
            object.clone()
        }
        Some(_) => return None,
    };
    let cx = current_context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut injector = JsonHeaders(&mut object);
    TraceContextPropagator::new().inject_context(&cx, &mut injector);
    if with_baggage {
        // A `tracing` span's context holds the baggage of its parent context (for example
        // extracted from the incoming request); code using the OpenTelemetry API directly
        // keeps it on the current context.
        let baggage = if cx.baggage().is_empty() {
            Context::current()
        } else {
            cx
        };
        BaggagePropagator::new().inject_context(&baggage, &mut injector);
    }
    Some(serde_json::Value::Object(object))
}

/// The context carried by message headers (`traceparent`, `tracestate` and, when present,
/// `baggage`; names in any letter case). An empty context when there is none or it is
/// malformed.
pub fn context_from_headers<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>) -> Context {
    let pairs = Pairs(
        headers
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned()))
            .collect(),
    );
    let cx = TraceContextPropagator::new().extract(&pairs);
    BaggagePropagator::new().extract_with_context(&cx, &pairs)
}

/// The context stored in an event's headers (a JSON object, as in
/// [`crate::Delivery::headers`] or an [`crate::publish::Envelope`]'s `headers`).
pub fn context_from_stored(headers: &serde_json::Value) -> Context {
    let Some(object) = headers.as_object() else {
        return Context::new();
    };
    context_from_headers(
        object
            .iter()
            .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?))),
    )
}

/// Whether stored headers name a `traceparent` (checked before anything is parsed, so a
/// delivery without a context, or without a subscriber, costs a key scan).
fn has_traceparent(stored: &serde_json::Value) -> bool {
    stored
        .as_object()
        .is_some_and(|o| o.keys().any(|k| k.eq_ignore_ascii_case(TRACEPARENT)))
}

/// Make the (not yet entered) delivery `span` a child of the context stored with its event.
pub(crate) fn continue_delivery(span: &tracing::Span, stored: &serde_json::Value) {
    if span.is_disabled() || !has_traceparent(stored) {
        return;
    }
    let cx = context_from_stored(stored);
    if cx.span().span_context().is_valid() {
        set_parent(span, cx);
    }
}

/// Link the (not yet entered) batch `span` to the context stored with one of its events.
pub(crate) fn link_delivery(span: &tracing::Span, stored: &serde_json::Value) {
    if span.is_disabled() || !has_traceparent(stored) {
        return;
    }
    let cx = context_from_stored(stored);
    let linked = cx.span().span_context().clone();
    if linked.is_valid() {
        span.add_link(linked);
    }
}

/// Set `span`'s parent; nothing happens when no OpenTelemetry layer records it.
pub(crate) fn set_parent(span: &tracing::Span, cx: Context) -> bool {
    match span.set_parent(cx) {
        Ok(()) => true,
        Err(tracing_opentelemetry::SetParentError::LayerNotFound) => false,
        Err(e) => {
            tracing::debug!(error = %e, "could not continue the trace of an event");
            false
        }
    }
}

/// Replace the trace headers of an outgoing message by the current span's context (the
/// delivery span, whose parent is the producer's), when there is one. Baggage stays as stored.
pub(crate) fn forward_current(headers: &mut Vec<(String, String)>) {
    let cx = current_context();
    if !cx.span().span_context().is_valid() {
        return;
    }
    let mut fresh = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut fresh);
    headers.retain(|(name, _)| {
        !name.eq_ignore_ascii_case(TRACEPARENT) && !name.eq_ignore_ascii_case(TRACESTATE)
    });
    let mut fresh: Vec<(String, String)> =
        fresh.into_iter().filter(|(_, v)| !v.is_empty()).collect();
    fresh.sort();
    headers.extend(fresh);
}

/// Writes propagated fields into a JSON object of stored headers.
struct JsonHeaders<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl Injector for JsonHeaders<'_> {
    fn set(&mut self, key: &str, value: String) {
        // An empty `tracestate` says nothing; W3C allows leaving it out.
        if !value.is_empty() {
            self.0
                .insert(key.to_owned(), serde_json::Value::String(value));
        }
    }
}

/// Received headers, names lowercased.
struct Pairs(HashMap<String, String>);

impl Extractor for Pairs {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(&key.to_ascii_lowercase()).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

    fn remote() -> Context {
        Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        ))
    }

    #[test]
    fn stored_context_reads_back_in_any_letter_case() {
        let stored = serde_json::json!({
            "TraceParent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "tenant": "a",
        });
        let cx = context_from_stored(&stored);
        let read = cx.span().span_context().clone();
        assert!(read.is_valid());
        assert_eq!(read.trace_id(), remote().span().span_context().trace_id());
    }

    #[test]
    fn malformed_context_is_no_context() {
        for bad in [
            "00-zz-00f067aa0ba902b7-01",
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        ] {
            let cx = context_from_headers([(TRACEPARENT, bad)]);
            assert!(!cx.span().span_context().is_valid(), "{bad:?}");
        }
    }

    #[test]
    fn capture_keeps_a_traceparent_the_caller_set() {
        let _guard = remote().attach();
        let mine = serde_json::json!({"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"});
        assert_eq!(capture(Some(&mine), false), None);
        let captured = capture(None, false).expect("a current context is captured");
        assert_eq!(
            captured[TRACEPARENT],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        assert!(captured.get(BAGGAGE).is_none());
    }
}

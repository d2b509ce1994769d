//! The no-op handler every workload delivers to: it counts deliveries and, for the latency
//! workload, records when each order's handler started.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use futures::future::BoxFuture;
use outbox_runtime::sink::HandledEvents;
use outbox_runtime::store::ClaimedEvent;
use outbox_runtime::{Delivery, Event, HandlerError, Sink};

use crate::event::OrderPaid;

/// Set once from `--handled-sink` at start: every counting sink then names the bench's one
/// event as the events it handles.
static NAME_HANDLED_EVENTS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Make every counting sink of this run name the events it handles (`--handled-sink`).
pub fn name_handled_events(on: bool) {
    let _ = NAME_HANDLED_EVENTS.set(on);
}

use crate::event::order_id_of;

/// Counts deliveries; optionally stamps the handler start of each order id.
#[derive(Debug, Default)]
pub struct CountingSink {
    delivered: AtomicI64,
    started: Option<Mutex<HashMap<i64, Instant>>>,
}

impl CountingSink {
    /// A sink that only counts.
    pub fn counting() -> Self {
        CountingSink::default()
    }

    /// A sink that also records the first handler start per order id.
    pub fn stamping() -> Self {
        CountingSink {
            delivered: AtomicI64::new(0),
            started: Some(Mutex::new(HashMap::new())),
        }
    }

    /// Deliveries so far (redeliveries included).
    pub fn delivered(&self) -> i64 {
        self.delivered.load(Ordering::Relaxed)
    }

    /// The recorded handler starts (empty for a counting sink).
    pub fn starts(&self) -> HashMap<i64, Instant> {
        self.started
            .as_ref()
            .map(|m| {
                m.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone()
            })
            .unwrap_or_default()
    }
}

impl Sink for CountingSink {
    fn handled_events(&self) -> Option<HandledEvents> {
        NAME_HANDLED_EVENTS
            .get()
            .copied()
            .unwrap_or(false)
            .then(|| HandledEvents::new([(OrderPaid::NAME, OrderPaid::VERSION)]))
    }

    fn deliver<'a>(
        &'a self,
        event: &'a ClaimedEvent,
        _delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        // Stamp first: the latency is measured to the moment the handler starts.
        if let Some(started) = &self.started {
            let now = Instant::now();
            if let Some(id) = order_id_of(&event.payload) {
                started
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .entry(id)
                    .or_insert(now);
            }
        }
        self.delivered.fetch_add(1, Ordering::Relaxed);
        Box::pin(async { Ok(()) })
    }
}

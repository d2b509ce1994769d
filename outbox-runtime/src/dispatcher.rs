//! Routes a claimed row to the handler of its current event type, upcasting older versions.
//!
//! A [`Dispatcher`] is built from handlers, explicitly ([`Dispatcher::builder`]) or from every
//! `#[handler]` linked into the binary ([`Dispatcher::from_inventory`]). Both go through
//! [`DispatcherBuilder::build`], which resolves every stored version of each handled event to
//! the handler's type and rejects conflicts before anything is delivered.
//!
//! As a [`Sink`], the dispatcher names the (name, version) pairs it routes
//! ([`Sink::handled_events`]), so a worker claims only those and leaves every other event
//! pending for a worker that handles it. What it is handed it delivers or fails permanently,
//! so one bad row never blocks the queue: a payload that does not decode, a handler that
//! panics, and an unknown (name, version) (reached only by calling [`Dispatcher::dispatch`]
//! directly, or from a worker whose sink wraps the dispatcher without naming its events) all
//! return [`HandlerError::permanent`] with the reason.

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;

use crate::contract::{DecodeCurrent, EventRegistration};
use crate::delivery::{Delivery, HandlerError};
use crate::error::{Error, Result};
use crate::event::{CurrentEvent, Event};
use crate::sink::{HandledEvents, Sink};
use crate::store::ClaimedEvent;

/// A handler with its event type erased: takes a `Box<E>` (the current version).
type ErasedHandler = Arc<
    dyn Fn(Box<dyn Any + Send>, Delivery) -> BoxFuture<'static, Result<(), HandlerError>>
        + Send
        + Sync,
>;

/// One `#[handler]` linked into the binary, submitted through `inventory`.
pub struct HandlerRegistration {
    name: &'static str,
    register: fn(DispatcherBuilder) -> DispatcherBuilder,
}

impl HandlerRegistration {
    /// Used by `#[handler]`: `name` is the function's path, `register` adds it to a builder.
    pub const fn new(
        name: &'static str,
        register: fn(DispatcherBuilder) -> DispatcherBuilder,
    ) -> Self {
        HandlerRegistration { name, register }
    }

    /// The handler function's path.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

inventory::collect!(HandlerRegistration);

/// The handler of one event name, for its current type.
struct HandlerEntry {
    event_name: &'static str,
    event_type: TypeId,
    event_type_name: &'static str,
    handler_name: &'static str,
    handler: ErasedHandler,
}

/// One version that can be decoded and upcast.
#[derive(Clone, Copy)]
struct VersionEntry {
    name: &'static str,
    version: u32,
    type_id: TypeId,
    type_name: &'static str,
    current_type_id: TypeId,
    current_type_name: &'static str,
    decode_current: DecodeCurrent,
}

impl VersionEntry {
    fn of<E: Event>() -> Self {
        let registration = EventRegistration::of::<E>(std::any::type_name::<E>(), false);
        Self::from_registration(&registration)
    }

    fn from_registration(r: &EventRegistration) -> Self {
        VersionEntry {
            name: r.name,
            version: r.version,
            type_id: (r.type_id)(),
            type_name: r.type_name,
            current_type_id: (r.current_type_id)(),
            current_type_name: (r.current_type_name)(),
            decode_current: r.decode_current,
        }
    }
}

/// How a stored (name, version) is delivered.
struct Route {
    stored_type_name: &'static str,
    handler_name: &'static str,
    decode_current: DecodeCurrent,
    handler: ErasedHandler,
}

/// Collects handlers; [`DispatcherBuilder::build`] checks them and makes the [`Dispatcher`].
#[derive(Default)]
pub struct DispatcherBuilder {
    handlers: Vec<HandlerEntry>,
    versions: Vec<VersionEntry>,
}

impl DispatcherBuilder {
    /// Handle the current event type `E` with `handler`, for example a plain
    /// `async fn on_order_confirmed(event: OrderConfirmed, ctx: Delivery) -> Result<(), HandlerError>`
    /// or a closure. Older versions of `E` (types with `upcast` to it) are decoded and upcast
    /// before the handler sees them.
    pub fn handler<E, F, Fut>(self, handler: F) -> Self
    where
        E: CurrentEvent,
        F: Fn(E, Delivery) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        self.handler_named(std::any::type_name::<F>(), handler)
    }

    /// [`DispatcherBuilder::handler`] with the name used in error messages.
    pub fn handler_named<E, F, Fut>(mut self, handler_name: &'static str, handler: F) -> Self
    where
        E: CurrentEvent,
        F: Fn(E, Delivery) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        let erased: ErasedHandler =
            Arc::new(move |event: Box<dyn Any + Send>, delivery: Delivery| {
                match event.downcast::<E>() {
                    Ok(event) => handler(*event, delivery).boxed(),
                    // Routes only pair a decoder of `E::Current` with a handler of `E`.
                    Err(_) => futures::future::ready(Err(HandlerError::permanent(format!(
                        "dispatcher bug: a payload of another type reached the handler of `{}`",
                        std::any::type_name::<E>()
                    ))))
                    .boxed(),
                }
            });
        self.handlers.push(HandlerEntry {
            event_name: E::NAME,
            event_type: TypeId::of::<E>(),
            event_type_name: std::any::type_name::<E>(),
            handler_name,
            handler: erased,
        });
        self.versions.push(VersionEntry::of::<E>());
        self
    }

    /// Declare an older version explicitly. Not needed for types derived with `Event`, which
    /// register themselves, but it keeps a dispatcher independent of what the linker kept.
    pub fn version<V: Event>(mut self) -> Self {
        self.versions.push(VersionEntry::of::<V>());
        self
    }

    /// Add every `#[handler]` linked into the binary.
    pub fn with_inventory_handlers(self) -> Self {
        let mut registrations: Vec<&HandlerRegistration> =
            inventory::iter::<HandlerRegistration>.into_iter().collect();
        registrations.sort_by_key(|r| r.name);
        registrations
            .into_iter()
            .fold(self, |builder, r| (r.register)(builder))
    }

    /// Check the handlers and every version of their events, and build the dispatcher.
    ///
    /// Fails, naming the types involved, when two handlers handle one event, when two types
    /// claim the same (name, version) of a handled event, or when a version of a handled event
    /// does not upcast to the handler's type (two current versions: the older one must declare
    /// `upcast`). Events this dispatcher does not handle are not checked: a worker does not
    /// claim them (see [`Sink::handled_events`]).
    pub fn build(self) -> Result<Dispatcher> {
        let mut handlers: BTreeMap<&'static str, HandlerEntry> = BTreeMap::new();
        for entry in self.handlers {
            // `#[derive(Event)]` checks names at compile time; an `Event` written by hand
            // is checked here, before its name reaches a log line or a failure reason.
            crate::contract::validate_event_name(entry.event_name).map_err(|e| {
                Error::Dispatcher(format!(
                    "`{}` cannot be handled: {e}",
                    entry.event_type_name
                ))
            })?;
            if let Some(existing) = handlers.get(entry.event_name) {
                return Err(Error::Dispatcher(format!(
                    "event `{}` has two handlers, `{}` (for `{}`) and `{}` (for `{}`); keep one",
                    entry.event_name,
                    existing.handler_name,
                    existing.event_type_name,
                    entry.handler_name,
                    entry.event_type_name
                )));
            }
            handlers.insert(entry.event_name, entry);
        }

        // Every version the binary knows of each handled event: the explicit ones, and what
        // `#[derive(Event)]` registered.
        let linked = inventory::iter::<EventRegistration>
            .into_iter()
            .map(VersionEntry::from_registration);
        let mut versions: BTreeMap<(&'static str, u32), VersionEntry> = BTreeMap::new();
        for entry in self.versions.into_iter().chain(linked) {
            if !handlers.contains_key(entry.name) {
                continue;
            }
            match versions.get(&(entry.name, entry.version)) {
                Some(existing) if existing.type_id != entry.type_id => {
                    return Err(Error::Dispatcher(format!(
                        "`{}` and `{}` both claim event `{}` version {}: give one of them another version (or name)",
                        existing.type_name, entry.type_name, entry.name, entry.version
                    )));
                }
                Some(_) => {}
                None => {
                    versions.insert((entry.name, entry.version), entry);
                }
            }
        }

        let mut routes = HashMap::new();
        for ((name, version), entry) in versions {
            let handler = &handlers[name];
            if entry.current_type_id != handler.event_type {
                return Err(Error::Dispatcher(format!(
                    "event `{name}` version {version} (`{}`) becomes `{}`, but the handler `{}` handles `{}`: \
                     an event has one current version; make the older type declare `#[outbox(upcast = NewerType)]`",
                    entry.type_name,
                    entry.current_type_name,
                    handler.handler_name,
                    handler.event_type_name
                )));
            }
            routes.insert(
                (name.to_owned(), version),
                Route {
                    stored_type_name: entry.type_name,
                    handler_name: handler.handler_name,
                    decode_current: entry.decode_current,
                    handler: Arc::clone(&handler.handler),
                },
            );
        }
        Ok(Dispatcher { routes })
    }
}

/// Typed handlers keyed by stored (event name, version); implements [`Sink`].
pub struct Dispatcher {
    routes: HashMap<(String, u32), Route>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("routes", &self.routes())
            .finish()
    }
}

impl Dispatcher {
    /// Start an explicit list of handlers: `Dispatcher::builder().handler(on_x).build()?`.
    pub fn builder() -> DispatcherBuilder {
        DispatcherBuilder::default()
    }

    /// A dispatcher of every `#[handler]` linked into the binary.
    pub fn from_inventory() -> Result<Dispatcher> {
        Self::builder().with_inventory_handlers().build()
    }

    /// Every stored (name, version) this dispatcher delivers, sorted.
    pub fn routes(&self) -> Vec<(&str, u32)> {
        let mut routes: Vec<(&str, u32)> =
            self.routes.keys().map(|(n, v)| (n.as_str(), *v)).collect();
        routes.sort();
        routes
    }

    /// Whether a stored (name, version) has a route.
    pub fn handles(&self, name: &str, version: u32) -> bool {
        self.routes.contains_key(&(name.to_owned(), version))
    }

    /// Decode, upcast and hand one stored event to its handler. Every poison case is a
    /// permanent failure with its reason; only the handler itself can ask for a retry.
    pub async fn dispatch(
        &self,
        event: &ClaimedEvent,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        let version = u32::try_from(event.event_version).ok();
        let Some(route) = version.and_then(|v| self.routes.get(&(event.event_type.clone(), v)))
        else {
            return Err(self.unknown(event));
        };
        let payload = event.payload.clone();
        let delivery = delivery.clone();
        // The decode runs inside the guarded future too: a `Deserialize` impl can panic.
        let attempt = async move {
            let current = (route.decode_current)(payload).map_err(|e| {
                HandlerError::permanent(format!(
                    "payload of event `{}` version {} does not decode as `{}`: {e}",
                    event.event_type, event.event_version, route.stored_type_name
                ))
            })?;
            (route.handler)(current, delivery).await
        };
        match AssertUnwindSafe(attempt).catch_unwind().await {
            Ok(outcome) => outcome,
            Err(panic) => Err(HandlerError::permanent(format!(
                "handler `{}` panicked on event `{}` version {}: {}",
                route.handler_name,
                event.event_type,
                event.event_version,
                panic_message(&*panic)
            ))),
        }
    }

    fn unknown(&self, event: &ClaimedEvent) -> HandlerError {
        let mut known: Vec<u32> = self
            .routes
            .keys()
            .filter(|(n, _)| *n == event.event_type)
            .map(|(_, v)| *v)
            .collect();
        known.sort_unstable();
        // The stored name may be anything raw SQL wrote: escaped before it reaches the
        // failure reason and the log.
        let name = crate::contract::shown(&event.event_type);
        if known.is_empty() {
            HandlerError::permanent(format!(
                "no handler for event `{name}` (version {}): register one with `Dispatcher::builder().handler(..)` or `#[handler]`",
                event.event_version
            ))
        } else {
            HandlerError::permanent(format!(
                "event `{name}` version {} is unknown to this binary, which handles versions {:?}: \
                 deploy the type for that version (with `upcast`) before events of it are written",
                event.event_version, known
            ))
        }
    }
}

impl Sink for Dispatcher {
    fn deliver<'a>(
        &'a self,
        event: &'a ClaimedEvent,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        self.dispatch(event, delivery).boxed()
    }

    /// Every route: the worker claims only these, and leaves other types and versions pending
    /// for a worker that has a handler for them.
    fn handled_events(&self) -> Option<HandledEvents> {
        Some(HandledEvents::new(self.routes()))
    }
}

/// The text of a panic payload (`panic!("...")` gives a `&str` or a `String`).
fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

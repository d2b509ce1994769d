//! Derive and attribute macros of the outbox toolkit. Use them through `outbox-runtime`, which
//! re-exports them (`outbox_runtime::Event`, `outbox_runtime::handler`,
//! `outbox_runtime::catalogue`) and documents them.
//!
//! Each macro is parse -> validate -> expand over `proc_macro2`/`syn` values only, so the logic
//! is unit-tested without a compiler (`cargo test -p outbox-macros`); this file holds only the
//! entry points.

mod attr;
mod catalogue;
mod crate_path;
mod ctxt;
mod event;
mod event_name;
mod handler;
mod sql_ident;
mod symbol;

use proc_macro::TokenStream;

/// Implements `outbox_runtime::Event` for a struct with named fields (or an enum).
///
/// ```ignore
/// #[derive(Serialize, Deserialize, JsonSchema, outbox_runtime::Event)]
/// #[outbox(name = "order.confirmed", version = 2)]
/// pub struct OrderConfirmed {
///     #[outbox(aggregate_id)]
///     pub order_id: Uuid,
///     pub total_cents: i64,
/// }
/// ```
///
/// Type attributes, in `#[outbox(...)]`:
/// - `version = N` (required, `N >= 1`): bump it whenever the payload shape changes.
/// - `name = "..."`: the stored event name. Default: the type name in snake_case
///   (`OrderConfirmed` -> `order_confirmed`); an older version (`upcast = ...`) inherits the
///   name of its target. Checked at compile time: 1 to 128 characters of `[a-z0-9_-]` in parts
///   separated by single dots, each part starting with a letter or digit (`order.confirmed`).
/// - `table = "..."`: the outbox table (default `outbox`, or the upcast target's). Checked at
///   compile time: 1 to 43 characters of `[a-z0-9_]` (its longest index name must fit
///   PostgreSQL's 63), not starting with a digit and not ending in `_queue` (the suffix of its
///   queue table), and not a key word PostgreSQL reserves (`order`, `user`, `select`: refused by
///   a constant the expansion evaluates, since the runtime keeps their list).
/// - `upcast = NewerType`: this type is an older version of `NewerType`; requires
///   `impl From<ThisType> for NewerType`. Handlers only see the current version.
/// - `aggregate = "..."`: the aggregate type. Default: the aggregate id field's name without
///   `_id` (`order_id` -> `order`), else the event name up to its first `.`, else the name.
///   Checked like the event name.
/// - `crate = path`: where the runtime is (for re-exports). Default `::outbox_runtime`.
///
/// Field attributes: `#[outbox(aggregate_id)]` (any `Display` type; enables per-aggregate
/// ordering) and `#[outbox(aggregate_version)]` (an integer convertible to `i64`).
///
/// The type must also derive `serde::{Serialize, Deserialize}` and `schemars::JsonSchema` (the
/// contract's shape is its JSON Schema; nested types need `JsonSchema` too).
#[proc_macro_derive(Event, attributes(outbox))]
pub fn derive_event(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    event::derive(&input).into()
}

/// Registers an `async fn(event: E, ctx: Delivery) -> Result<(), HandlerError>` as the handler
/// of event `E` (its current version), for `Dispatcher::from_inventory()`. The function itself
/// is left unchanged and can still be called, or passed to `Dispatcher::builder().handler(..)`.
///
/// `#[handler(crate = path)]` names the runtime when it is re-exported.
#[proc_macro_attribute]
pub fn handler(args: TokenStream, item: TokenStream) -> TokenStream {
    handler::attribute(args.into(), item.into()).into()
}

/// On an inline module of event types: generates a trait with one method per current event
/// (named after the type in snake_case) and `fn dispatcher(impl Trait) -> Result<Dispatcher>`,
/// so a new event without a handler, or a stored version without an upcast path to a current
/// type, is a compile error.
///
/// The trait is named after the module (`mod events` -> `EventsHandler`) unless
/// `#[catalogue(handler = Name)]` says otherwise; `crate = path` names the runtime.
#[proc_macro_attribute]
pub fn catalogue(args: TokenStream, item: TokenStream) -> TokenStream {
    catalogue::attribute(args.into(), item.into()).into()
}

//! `#[derive(Event)]`: parse (`attr`, `ast`) -> validate -> expand.

mod ast;
mod attr;
pub(crate) mod expand;
pub(crate) mod naming;
mod validate;

pub(crate) use attr::Container as ContainerAttrs;

use proc_macro2::TokenStream;
use syn::DeriveInput;

use crate::crate_path;
use crate::ctxt::Ctxt;
use ast::{EventInput, Shape};
use expand::Model;

/// The whole derive: the impl, or the errors plus a harmless stub.
pub(crate) fn derive(input: &DeriveInput) -> TokenStream {
    let cx = Ctxt::new();
    let event = EventInput::from_ast(&cx, input);
    validate::check(&cx, &event);
    let krate = crate_path::or_default(event.attrs.krate.clone());
    match cx.check() {
        Ok(()) => expand::expand(&resolve(event, krate)),
        Err(err) => {
            let mut out = err.to_compile_error();
            let stub_compiles =
                input.generics.params.is_empty() && !matches!(event.shape, Shape::Union);
            if stub_compiles {
                out.extend(expand::fallback(&input.ident, &krate));
            }
            out
        }
    }
}

/// Apply the defaults to a validated input.
fn resolve<'a>(event: EventInput<'a>, krate: syn::Path) -> Model<'a> {
    let aggregate_id = event
        .fields()
        .iter()
        .find(|f| f.attrs.aggregate_id.is_some())
        .map(|f| (f.ident, f.ty));
    let aggregate_version = event
        .fields()
        .iter()
        .find(|f| f.attrs.aggregate_version.is_some())
        .map(|f| (f.ident, f.ty));
    let upcast = event.attrs.upcast.clone();
    // An older version inherits the name of the type it upcasts to, so `OrderConfirmedV1` needs
    // no `name = ...` to stay the same event as `OrderConfirmed`.
    let name = match (&event.attrs.name, &upcast) {
        (Some(name), _) => Some(name.value.clone()),
        (None, Some(_)) => None,
        (None, None) => Some(naming::default_event_name(event.ident)),
    };
    let aggregate_type = match (&event.attrs.aggregate, aggregate_id, &name) {
        (Some(explicit), _, _) => Some(explicit.value.clone()),
        (None, Some((field, _)), Some(name)) => Some(naming::default_aggregate_type(field, name)),
        (None, Some((field, _)), None) if field.to_string().ends_with("_id") && field != "_id" => {
            Some(naming::default_aggregate_type(field, ""))
        }
        _ => None,
    };
    Model {
        ident: event.ident,
        krate,
        name,
        version: event.attrs.version.as_ref().map(|v| v.value).unwrap_or(1),
        table: event
            .attrs
            .table
            .as_ref()
            .map(|t| (t.value.clone(), t.span())),
        upcast,
        aggregate_id,
        aggregate_version,
        aggregate_type,
    }
}

#[cfg(test)]
mod tests;

//! Cross-attribute rules of `#[derive(Event)]`, one function each. Rules about a single
//! attribute value (version 0, an unsafe table name) are checked while parsing (`attr.rs`).

use super::ast::{EventInput, Shape};
use super::naming;
use crate::ctxt::Ctxt;
use crate::event_name;

pub(crate) fn check(cx: &Ctxt, input: &EventInput) {
    check_version_given(cx, input);
    check_not_generic(cx, input);
    check_shape(cx, input);
    check_single_aggregate_field(cx, input);
    check_aggregate_needs_id(cx, input);
    check_default_names(cx, input);
}

/// The version is part of the contract; guessing it would make a later bump ambiguous.
fn check_version_given(cx: &Ctxt, input: &EventInput) {
    if input.attrs.version.is_none() {
        cx.error_spanned_by(
            input.ident,
            "missing event version: add `#[outbox(version = 1)]` (bump it whenever the payload shape changes)",
        );
    }
}

/// A contract is one concrete payload shape; a generic type would register one contract per
/// instantiation under a single (name, version).
fn check_not_generic(cx: &Ctxt, input: &EventInput) {
    if !input.generics.params.is_empty() || input.generics.where_clause.is_some() {
        cx.error_spanned_by(
            input.generics,
            "an event cannot be generic: its contract (name, version, shape) must be one concrete type; \
             define a struct per event, with concrete field types",
        );
    }
}

/// Named fields keep the payload a JSON object whose fields can evolve by name.
fn check_shape(cx: &Ctxt, input: &EventInput) {
    match &input.shape {
        Shape::Named(_) | Shape::Enum => {}
        Shape::Tuple(fields) => cx.error_spanned_by(
            fields,
            "an event cannot be a tuple struct: name its fields (`struct OrderConfirmed { order_id: Uuid }`) \
             so the payload is a JSON object that can evolve field by field",
        ),
        Shape::Unit => cx.error_spanned_by(
            input.ident,
            format!(
                "an event cannot be a unit struct: write `struct {} {{}}` for an event without fields",
                input.ident
            ),
        ),
        Shape::Union => cx.error_spanned_by(
            input.ident,
            "an event cannot be a union: use a struct with named fields or an enum",
        ),
    }
}

/// One row has one aggregate id and one aggregate version.
fn check_single_aggregate_field(cx: &Ctxt, input: &EventInput) {
    let mut first_id = None;
    let mut first_version = None;
    for field in input.fields() {
        if let Some(tokens) = &field.attrs.aggregate_id {
            match first_id {
                None => first_id = Some(field.ident),
                Some(first) => cx.error_spanned_by(
                    tokens,
                    format!(
                        "two `aggregate_id` fields (`{first}` and `{}`): an event belongs to one aggregate; \
                         keep `#[outbox(aggregate_id)]` on one field only",
                        field.ident
                    ),
                ),
            }
        }
        if let Some(tokens) = &field.attrs.aggregate_version {
            match first_version {
                None => first_version = Some(field.ident),
                Some(first) => cx.error_spanned_by(
                    tokens,
                    format!(
                        "two `aggregate_version` fields (`{first}` and `{}`): keep `#[outbox(aggregate_version)]` on one field only",
                        field.ident
                    ),
                ),
            }
        }
    }
}

/// An aggregate type or version without an aggregate id would describe no aggregate.
fn check_aggregate_needs_id(cx: &Ctxt, input: &EventInput) {
    let has_id = input
        .fields()
        .iter()
        .any(|f| f.attrs.aggregate_id.is_some());
    if has_id {
        return;
    }
    if let Some(aggregate) = &input.attrs.aggregate {
        cx.error_spanned_by(
            aggregate,
            "`aggregate` needs a field marked `#[outbox(aggregate_id)]`: mark the field that holds the aggregate's id",
        );
    }
    for field in input.fields() {
        if let Some(tokens) = &field.attrs.aggregate_version {
            cx.error_spanned_by(
                tokens,
                "`aggregate_version` needs a field marked `#[outbox(aggregate_id)]`: mark the field that holds the aggregate's id",
            );
        }
    }
}

/// A name the user did not write (the snake_case type name, or the aggregate id field without
/// `_id`) follows the same rule as one they did, which `attr.rs` checks: reported on the type or
/// the field it came from, with the attribute that overrides it.
fn check_default_names(cx: &Ctxt, input: &EventInput) {
    let default_name = (input.attrs.name.is_none() && input.attrs.upcast.is_none())
        .then(|| naming::default_event_name(input.ident));
    if let Some(name) = &default_name {
        if let Some(problem) = event_name::problem(name) {
            cx.error_spanned_by(
                input.ident,
                format!(
                    "the default event name \"{}\" (the type name in snake_case) is not valid: {problem}; \
                     give the name explicitly with `#[outbox(name = \"...\")]`, using {}",
                    event_name::shown(name),
                    event_name::RULE
                ),
            );
        }
    }
    if input.attrs.aggregate.is_some() {
        return;
    }
    let Some(field) = input
        .fields()
        .iter()
        .find(|f| f.attrs.aggregate_id.is_some())
    else {
        return;
    };
    // Only a type taken from the field can be invalid on its own: one taken from the event
    // name is its first part, valid whenever the name is (and the name is checked above).
    let aggregate = naming::default_aggregate_type(field.ident, "");
    if aggregate.is_empty() {
        return;
    }
    if let Some(problem) = event_name::problem(&aggregate) {
        cx.error_spanned_by(
            field.ident,
            format!(
                "the default aggregate type \"{}\" (this field's name without `_id`) is not valid: {problem}; \
                 give it explicitly with `#[outbox(aggregate = \"...\")]` on the type, using {}",
                event_name::shown(&aggregate),
                event_name::RULE
            ),
        );
    }
}

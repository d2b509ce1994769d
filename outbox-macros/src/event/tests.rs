//! The parse and validate layer of `#[derive(Event)]`, fed with `parse_quote!` inputs.

use syn::{DeriveInput, parse_quote};

use super::ast::EventInput;
use super::{resolve, validate};
use crate::ctxt::Ctxt;

/// The error messages the derive reports for `input` (empty when it is accepted).
fn errors(input: DeriveInput) -> Vec<String> {
    let cx = Ctxt::new();
    let event = EventInput::from_ast(&cx, &input);
    validate::check(&cx, &event);
    match cx.check() {
        Ok(()) => Vec::new(),
        Err(err) => err.into_iter().map(|e| e.to_string()).collect(),
    }
}

fn single_error(input: DeriveInput) -> String {
    let errors = errors(input);
    assert_eq!(errors.len(), 1, "expected one error, got {errors:?}");
    errors.into_iter().next().unwrap()
}

#[test]
fn a_complete_event_is_accepted_and_resolved() {
    let input: DeriveInput = parse_quote! {
        #[outbox(name = "order.confirmed", version = 2, table = "billing_outbox")]
        struct OrderConfirmed {
            #[outbox(aggregate_id)] order_id: Uuid,
            #[outbox(aggregate_version)] revision: i32,
            total_cents: i64,
        }
    };
    let cx = Ctxt::new();
    let event = EventInput::from_ast(&cx, &input);
    validate::check(&cx, &event);
    cx.check().expect("accepted");
    let model = resolve(event, crate::crate_path::default_path());
    assert_eq!(model.name.as_deref(), Some("order.confirmed"));
    assert_eq!(model.version, 2);
    assert_eq!(
        model.table.as_ref().map(|(table, _)| table.as_str()),
        Some("billing_outbox")
    );
    assert_eq!(
        model.aggregate_id.map(|(i, _)| i.to_string()).as_deref(),
        Some("order_id")
    );
    assert_eq!(model.aggregate_type.as_deref(), Some("order"));
    assert_eq!(
        model
            .aggregate_version
            .map(|(i, _)| i.to_string())
            .as_deref(),
        Some("revision")
    );
}

#[test]
fn defaults_come_from_the_type_and_an_upcast_inherits_the_name() {
    let current: DeriveInput = parse_quote! {
        #[outbox(version = 1)]
        struct InvoicePaid { #[outbox(aggregate_id)] id: String }
    };
    let cx = Ctxt::new();
    let model = resolve(
        EventInput::from_ast(&cx, &current),
        crate::crate_path::default_path(),
    );
    cx.check().unwrap();
    assert_eq!(model.name.as_deref(), Some("invoice_paid"));
    assert!(
        model.table.is_none(),
        "the expansion writes the default `outbox`"
    );
    assert_eq!(model.aggregate_type.as_deref(), Some("invoice_paid"));

    let older: DeriveInput = parse_quote! {
        #[outbox(version = 1, upcast = InvoicePaidV2)]
        struct InvoicePaidV1 { amount: i64 }
    };
    let cx = Ctxt::new();
    let model = resolve(
        EventInput::from_ast(&cx, &older),
        crate::crate_path::default_path(),
    );
    cx.check().unwrap();
    assert_eq!(model.name, None, "inherited from the upcast target");
    assert!(model.upcast.is_some());
}

#[test]
fn missing_version_says_how_to_add_it() {
    let msg = single_error(parse_quote! { struct OrderConfirmed { id: u64 } });
    assert!(
        msg.contains("missing event version: add `#[outbox(version = 1)]`"),
        "{msg}"
    );
}

#[test]
fn version_zero_points_to_version_one() {
    let msg = single_error(parse_quote! { #[outbox(version = 0)] struct E { id: u64 } });
    assert_eq!(
        msg,
        "`version` must be >= 1; the first version is `version = 1`"
    );
}

#[test]
fn unknown_and_duplicate_attributes_are_all_reported() {
    let errors = errors(parse_quote! {
        #[outbox(version = 1, version = 2)]
        #[outbox(colour = "blue")]
        struct E { id: u64 }
    });
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert_eq!(
        errors[0],
        "duplicate outbox attribute `version`: give it once"
    );
    assert!(
        errors[1].starts_with("unknown outbox attribute `colour`; expected `name`, `version`"),
        "{}",
        errors[1]
    );
}

#[test]
fn unsafe_table_names_are_rejected_at_compile_time() {
    for table in ["Outbox", "outbox; drop table orders", "1outbox", ""] {
        let input: DeriveInput =
            parse_quote! { #[outbox(version = 1, table = #table)] struct E { id: u64 } };
        let msg = single_error(input);
        assert!(msg.contains("is not a safe outbox table name"), "{msg}");
    }
}

#[test]
fn two_aggregate_ids_name_both_fields() {
    let msg = single_error(parse_quote! {
        #[outbox(version = 1)]
        struct E { #[outbox(aggregate_id)] a: u64, #[outbox(aggregate_id)] b: u64 }
    });
    assert!(
        msg.starts_with("two `aggregate_id` fields (`a` and `b`)"),
        "{msg}"
    );
}

#[test]
fn aggregate_without_id_field_is_rejected() {
    let msg = single_error(parse_quote! {
        #[outbox(version = 1, aggregate = "order")]
        struct E { a: u64 }
    });
    assert!(
        msg.starts_with("`aggregate` needs a field marked `#[outbox(aggregate_id)]`"),
        "{msg}"
    );
}

#[test]
fn tuple_unit_generic_and_union_shapes_are_rejected() {
    let tuple = single_error(parse_quote! { #[outbox(version = 1)] struct E(u64); });
    assert!(
        tuple.starts_with("an event cannot be a tuple struct"),
        "{tuple}"
    );
    let unit = single_error(parse_quote! { #[outbox(version = 1)] struct Flushed; });
    assert!(unit.contains("write `struct Flushed {}`"), "{unit}");
    let generic = single_error(parse_quote! { #[outbox(version = 1)] struct E<T> { t: T } });
    assert!(
        generic.starts_with("an event cannot be generic"),
        "{generic}"
    );
    let union = single_error(parse_quote! { #[outbox(version = 1)] union E { a: u32 } });
    assert!(union.starts_with("an event cannot be a union"), "{union}");
}

#[test]
fn enums_are_accepted_but_not_with_field_attributes() {
    assert!(
        errors(parse_quote! { #[outbox(version = 1)] enum Shipment { Sent { id: u64 }, Lost } })
            .is_empty()
    );
    let msg = single_error(parse_quote! {
        #[outbox(version = 1)] enum Shipment { Sent { #[outbox(aggregate_id)] id: u64 } }
    });
    assert!(
        msg.contains("not supported inside an enum payload"),
        "{msg}"
    );
}

#[test]
fn field_attributes_take_no_value_and_unknown_ones_are_named() {
    let errors = errors(parse_quote! {
        #[outbox(version = 1)]
        struct E { #[outbox(aggregate_id = true)] a: u64, #[outbox(key)] b: u64 }
    });
    assert_eq!(
        errors,
        [
            "`aggregate_id` takes no value: write `#[outbox(aggregate_id)]`",
            "unknown outbox field attribute `key`; expected `aggregate_id` or `aggregate_version`",
        ]
    );
}

#[test]
fn crate_path_is_read_as_a_path_or_a_string() {
    for input in [
        parse_quote! { #[outbox(version = 1, crate = my::reexport)] struct E { a: u64 } },
        parse_quote! { #[outbox(version = 1, crate = "my::reexport")] struct E { a: u64 } },
    ] {
        let input: DeriveInput = input;
        let cx = Ctxt::new();
        let event = EventInput::from_ast(&cx, &input);
        cx.check().unwrap();
        let krate = event.attrs.krate.expect("crate given");
        assert_eq!(quote::quote!(#krate).to_string(), "my :: reexport");
    }
}

#[test]
fn an_invalid_input_expands_to_the_error_plus_a_stub_impl() {
    let out =
        super::derive(&parse_quote! { #[outbox(version = 0)] struct E { a: u64 } }).to_string();
    assert!(out.contains("compile_error"), "{out}");
    assert!(out.contains("impl __outbox :: Event for E"), "{out}");
    assert!(
        !out.contains("inventory"),
        "a stub is never registered: {out}"
    );
}

#[test]
fn hostile_event_names_are_rejected_naming_the_allowed_set() {
    for name in [
        "x\nDROP TABLE victim; --",
        "a*/b",
        "it's",
        "Order.Confirmed",
        "order..confirmed",
        "",
        "a\u{2028}b",
    ] {
        let input: DeriveInput =
            parse_quote! { #[outbox(version = 1, name = #name)] struct E { id: u64 } };
        let msg = single_error(input);
        assert!(msg.contains("is not a valid event name: "), "{msg}");
        assert!(msg.contains("lowercase ASCII letters, digits"), "{msg}");
        assert!(
            !msg.contains('\n'),
            "the message shows the name escaped: {msg}"
        );
    }
    let long = "a".repeat(129);
    let msg =
        single_error(parse_quote! { #[outbox(version = 1, name = #long)] struct E { id: u64 } });
    assert!(msg.contains("it is 129 characters long"), "{msg}");
    assert!(msg.len() < 500, "a long name is cut in the message: {msg}");
}

#[test]
fn hostile_aggregate_types_are_rejected() {
    let msg = single_error(parse_quote! {
        #[outbox(version = 1, aggregate = "order\n; DROP TABLE victim")]
        struct E { #[outbox(aggregate_id)] id: u64 }
    });
    assert!(
        msg.starts_with("\"order\\n; DROP TABLE victim\" is not a valid aggregate type: it contains the character U+000A"),
        "{msg}"
    );
}

#[test]
fn default_names_follow_the_same_rule() {
    let msg = single_error(parse_quote! { #[outbox(version = 1)] struct Ärger { id: u64 } });
    assert!(
        msg.starts_with(
            "the default event name \"ärger\" (the type name in snake_case) is not valid"
        ),
        "{msg}"
    );
    assert!(msg.contains("`#[outbox(name = \"...\")]`"), "{msg}");
    // An explicit name fixes it; an older version inherits its name and is not checked here.
    assert!(
        errors(parse_quote! { #[outbox(version = 1, name = "anger")] struct Ärger { id: u64 } })
            .is_empty()
    );
    assert!(
        errors(parse_quote! { #[outbox(version = 1, upcast = Anger)] struct Ärger { id: u64 } })
            .is_empty()
    );

    let msg = single_error(parse_quote! {
        #[outbox(version = 1)] struct Placed { #[outbox(aggregate_id)] __id: u64 }
    });
    assert!(
        msg.starts_with("the default aggregate type \"_\" (this field's name without `_id`)"),
        "{msg}"
    );
    assert!(errors(parse_quote! {
        #[outbox(version = 1, aggregate = "order")] struct Placed { #[outbox(aggregate_id)] __id: u64 }
    })
    .is_empty());
    assert!(
        errors(parse_quote! {
            #[outbox(version = 1)] struct HTTPRequestSent { #[outbox(aggregate_id)] r#type_id: u64 }
        })
        .is_empty()
    );
}

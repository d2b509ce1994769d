//! The exhaustiveness rules of `#[catalogue]`, fed with `parse_quote!` modules.

use syn::{ItemMod, parse_quote};

use super::{ast, validate};
use crate::ctxt::Ctxt;

fn errors(module: ItemMod) -> Vec<String> {
    let items = module.content.expect("inline").1;
    let events = ast::events(&items);
    let cx = Ctxt::new();
    let _ = validate::check(&cx, &events);
    match cx.check() {
        Ok(()) => Vec::new(),
        Err(err) => err.into_iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn versions_chained_by_upcast_are_accepted() {
    let module: ItemMod = parse_quote! {
        mod events {
            #[derive(Event)] #[outbox(name = "order.confirmed", version = 3)] pub struct OrderConfirmed { a: u64 }
            #[derive(Event)] #[outbox(version = 2, upcast = OrderConfirmed)] pub struct OrderConfirmedV2 { a: u64 }
            #[derive(outbox_runtime::Event)] #[outbox(version = 1, upcast = OrderConfirmedV2)] pub struct OrderConfirmedV1 { a: u64 }
            #[derive(Event)] #[outbox(version = 1)] pub struct InvoicePaid { a: u64 }
            pub struct NotAnEvent;
        }
    };
    assert_eq!(errors(module.clone()), Vec::<String>::new());
    let items = module.content.unwrap().1;
    let events = ast::events(&items);
    let cx = Ctxt::new();
    let resolved = validate::check(&cx, &events);
    cx.check().unwrap();
    let mut seen: Vec<(String, u32, bool)> = resolved
        .iter()
        .map(|r| (r.name.clone(), r.event.version, r.is_current()))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("invoice_paid".to_owned(), 1, true),
            ("order.confirmed".to_owned(), 1, false),
            ("order.confirmed".to_owned(), 2, false),
            ("order.confirmed".to_owned(), 3, true),
        ]
    );
}

#[test]
fn two_current_versions_say_which_must_upcast() {
    let errors = errors(parse_quote! {
        mod events {
            #[derive(Event)] #[outbox(name = "order.confirmed", version = 1)] pub struct OrderConfirmedV1 { a: u64 }
            #[derive(Event)] #[outbox(name = "order.confirmed", version = 2)] pub struct OrderConfirmed { a: u64 }
        }
    });
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("version 1 must declare where it goes: add `#[outbox(upcast = OrderConfirmed)]` to `OrderConfirmedV1`"), "{}", errors[0]);
}

#[test]
fn an_upcast_leaving_the_catalogue_is_rejected() {
    let errors = errors(parse_quote! {
        mod events {
            #[derive(Event)] #[outbox(version = 1, upcast = super::Elsewhere)] pub struct OldThing { a: u64 }
        }
    });
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0]
            .contains("`OldThing` upcasts to `super::Elsewhere`, which is not in this catalogue"),
        "{}",
        errors[0]
    );
}

#[test]
fn a_version_gap_and_a_backwards_upcast_are_rejected() {
    let gap = errors(parse_quote! {
        mod events {
            #[derive(Event)] #[outbox(name = "x", version = 3)] pub struct X { a: u64 }
            #[derive(Event)] #[outbox(version = 1, upcast = X)] pub struct XV1 { a: u64 }
        }
    });
    assert_eq!(gap.len(), 1, "{gap:?}");
    assert!(
        gap[0].starts_with("event `x` has versions 1 and 3 but no version 2"),
        "{}",
        gap[0]
    );

    let backwards = errors(parse_quote! {
        mod events {
            #[derive(Event)] #[outbox(name = "x", version = 1)] pub struct X { a: u64 }
            #[derive(Event)] #[outbox(version = 2, upcast = X)] pub struct XV2 { a: u64 }
        }
    });
    assert!(
        backwards
            .iter()
            .any(|e| e.contains("upcast to a newer version")),
        "{backwards:?}"
    );
}

#[test]
fn the_same_version_twice_names_both_types() {
    let errors = errors(parse_quote! {
        mod events {
            #[derive(Event)] #[outbox(name = "x", version = 1)] pub struct A { a: u64 }
            #[derive(Event)] #[outbox(name = "x", version = 1)] pub struct B { a: u64 }
        }
    });
    assert!(
        errors
            .iter()
            .any(|e| e
                == "`A` and `B` are both event `x` version 1: give one of them another version"),
        "{errors:?}"
    );
}

#[test]
fn the_trait_has_one_method_per_current_event() {
    let module: proc_macro2::TokenStream = parse_quote! {
        mod events {
            #[derive(Event)] #[outbox(name = "x", version = 2)] pub struct OrderShipped { a: u64 }
            #[derive(Event)] #[outbox(version = 1, upcast = OrderShipped)] pub struct OrderShippedV1 { a: u64 }
        }
    };
    let out = super::attribute(proc_macro2::TokenStream::new(), module).to_string();
    assert!(out.contains("pub trait EventsHandler"), "{out}");
    assert!(out.contains("fn order_shipped"), "{out}");
    assert!(
        !out.contains("fn order_shipped_v1"),
        "older versions get no method: {out}"
    );
    assert!(out.contains("version :: < OrderShippedV1 >"), "{out}");
}

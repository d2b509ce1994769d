//! The signature rules of `#[handler]`, fed with `parse_quote!` signatures.

use syn::{Signature, parse_quote};

use super::validate;
use crate::ctxt::Ctxt;

fn errors(sig: Signature) -> Vec<String> {
    let cx = Ctxt::new();
    let _ = validate::check(&cx, &sig);
    match cx.check() {
        Ok(()) => Vec::new(),
        Err(err) => err.into_iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn the_documented_signature_is_accepted() {
    let sig: Signature = parse_quote! {
        async fn on_order_confirmed(event: OrderConfirmed, ctx: Delivery) -> Result<(), HandlerError>
    };
    let cx = Ctxt::new();
    let types = validate::check(&cx, &sig).expect("types");
    cx.check().unwrap();
    let event = types.event;
    assert_eq!(quote::quote!(#event).to_string(), "OrderConfirmed");
}

#[test]
fn a_plain_fn_is_told_to_be_async() {
    let errors = errors(parse_quote! { fn on_x(e: X, ctx: Delivery) -> Result<(), HandlerError> });
    assert_eq!(
        errors,
        ["a #[handler] must be an `async fn`: write `async fn on_x(...)`"]
    );
}

#[test]
fn a_missing_context_is_named() {
    let errors = errors(parse_quote! { async fn on_x(e: X) -> Result<(), HandlerError> });
    assert_eq!(errors.len(), 1);
    assert!(errors[0].contains("add `ctx: Delivery`"), "{errors:?}");
}

#[test]
fn a_missing_return_type_is_named() {
    let errors = errors(parse_quote! { async fn on_x(e: X, ctx: Delivery) });
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0]
            .starts_with("a #[handler] reports its outcome: add `-> Result<(), HandlerError>`"),
        "{errors:?}"
    );
}

#[test]
fn generics_methods_and_extra_arguments_are_rejected() {
    assert!(
        errors(parse_quote! { async fn on_x<T>(e: T, ctx: Delivery) -> R })[0]
            .starts_with("a #[handler] cannot be generic")
    );
    assert!(
        errors(parse_quote! { async fn on_x(&self, e: X) -> R })[0]
            .starts_with("a #[handler] is a free function")
    );
    assert!(
        errors(parse_quote! { async fn on_x(e: X, c: Delivery, n: u8) -> R })[0]
            .starts_with("a #[handler] takes exactly two")
    );
}

#[test]
fn a_bad_handler_is_emitted_unchanged_without_registration() {
    let item: proc_macro2::TokenStream =
        parse_quote! { fn on_x(e: X, ctx: Delivery) -> Result<(), HandlerError> { todo!() } };
    let out = super::attribute(proc_macro2::TokenStream::new(), item.clone()).to_string();
    assert!(out.starts_with(&item.to_string()), "{out}");
    assert!(
        out.contains("compile_error") && !out.contains("inventory"),
        "{out}"
    );
}

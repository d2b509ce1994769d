//! The handler trait and the dispatcher constructor appended to a catalogue module.

use heck::ToSnakeCase;
use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::{Ident, Path};

use super::validate::Resolved;

pub(crate) fn expand(
    krate: &Path,
    trait_ident: &Ident,
    module: &Ident,
    events: &[Resolved],
) -> TokenStream {
    let mut currents: Vec<&Resolved> = events.iter().filter(|r| r.is_current()).collect();
    currents.sort_by(|a, b| (&a.name, a.event.version).cmp(&(&b.name, b.event.version)));
    let older: Vec<&Resolved> = events.iter().filter(|r| !r.is_current()).collect();

    let methods = currents.iter().map(|r| {
        let ty = &r.event.ident;
        let method = method_ident(ty);
        let doc = format!(
            " Handles event `{}` (current version {}, type [`{}`]); older stored versions are upcast first.",
            r.name, r.event.version, ty
        );
        quote! {
            #[doc = #doc]
            fn #method(
                &self,
                event: #ty,
                ctx: #krate::Delivery,
            ) -> impl ::core::future::Future<Output = ::core::result::Result<(), #krate::HandlerError>> + ::core::marker::Send;
        }
    });
    let routes = currents.iter().map(|r| {
        let ty = &r.event.ident;
        let method = method_ident(ty);
        quote! {
            let builder = {
                let handler = ::std::sync::Arc::clone(&handler);
                builder.handler_named(
                    ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#trait_ident), "::", ::core::stringify!(#method)),
                    move |event: #ty, ctx: #krate::Delivery| {
                        let handler = ::std::sync::Arc::clone(&handler);
                        async move { handler.#method(event, ctx).await }
                    },
                )
            };
        }
    });
    let versions = older.iter().map(|r| {
        let ty = &r.event.ident;
        quote!(let builder = builder.version::<#ty>();)
    });
    // The macro's reading of the attributes must agree with what the derive generated.
    let agreements = events.iter().map(|r| {
        let ty = &r.event.ident;
        let (name, version) = (&r.name, r.event.version);
        quote! {
            const _: () = ::core::assert!(
                #krate::__private::const_str_eq(<#ty as #krate::Event>::NAME, #name)
                    && <#ty as #krate::Event>::VERSION == #version,
                "the catalogue and #[derive(Event)] disagree on an event's name or version"
            );
        }
    });
    let trait_doc = format!(
        " One method per current event of `mod {module}`: implement it, then build the dispatcher with \
         [`dispatcher`]. A new event in the catalogue is a compile error until it has its method."
    );
    quote! {
        #[doc = #trait_doc]
        pub trait #trait_ident: ::core::marker::Send + ::core::marker::Sync + 'static {
            #(#methods)*
        }

        /// A dispatcher routing every event of this catalogue, every stored version upcast to
        /// its current type, to `handler`.
        pub fn dispatcher<H: #trait_ident>(
            handler: H,
        ) -> ::core::result::Result<#krate::Dispatcher, #krate::Error> {
            let handler = ::std::sync::Arc::new(handler);
            let builder = #krate::Dispatcher::builder();
            #(#routes)*
            #(#versions)*
            let _ = &handler;
            builder.build()
        }

        #(#agreements)*
    }
}

/// `OrderConfirmed` -> `order_confirmed`.
pub(crate) fn method_ident(ty: &Ident) -> Ident {
    format_ident!("{}", ty.to_string().to_snake_case(), span = ty.span())
}

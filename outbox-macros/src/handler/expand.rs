//! The registration emitted after the untouched handler function.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, Path};

use super::validate::HandlerTypes;

pub(crate) fn registration(krate: &Path, ident: &Ident, types: &HandlerTypes) -> TokenStream {
    let HandlerTypes { event, ctx, output } = types;
    // The call is spanned on the event type: an event type that is not an event at all fails
    // a bound on the call itself, and is then reported on the type, not on `#[handler]`.
    let register = quote_spanned! {event.span()=> __outbox::__private::register_handler };
    quote! {
        #[doc(hidden)]
        #[allow(non_upper_case_globals, clippy::all)]
        const _: () = {
            use #krate as __outbox;

            const __HANDLER_NAME: &str = ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#ident));

            // The signature's own types are named here, so the compiler reports a wrong event,
            // context or return type on the user's tokens, once.
            fn __outbox_register(
                builder: __outbox::dispatcher::DispatcherBuilder,
            ) -> __outbox::dispatcher::DispatcherBuilder {
                #register::<#event, #ctx, #output, _, _>(builder, __HANDLER_NAME, #ident)
            }

            __outbox::__private::inventory::submit! {
                __outbox::dispatcher::HandlerRegistration::new(__HANDLER_NAME, __outbox_register)
            }
        };
    }
}

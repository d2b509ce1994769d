//! Writes the `Event` impl and the registration. Makes no decisions: everything it needs was
//! resolved and validated before.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, Path, Type};

/// Everything the generated code needs, resolved.
pub(crate) struct Model<'a> {
    pub(crate) ident: &'a Ident,
    pub(crate) krate: Path,
    /// `None`: inherited from the upcast target.
    pub(crate) name: Option<String>,
    pub(crate) version: u32,
    /// `None`: the upcast target's table, or `outbox`. With the span of its `table` key.
    pub(crate) table: Option<(String, proc_macro2::Span)>,
    pub(crate) upcast: Option<Path>,
    pub(crate) aggregate_id: Option<(&'a Ident, &'a Type)>,
    pub(crate) aggregate_version: Option<(&'a Ident, &'a Type)>,
    /// `None` with an aggregate id: inherited from the upcast target.
    pub(crate) aggregate_type: Option<String>,
}

pub(crate) fn expand(m: &Model) -> TokenStream {
    let ident = m.ident;
    let krate = &m.krate;
    let version = m.version;
    let event = quote!(__outbox::Event);

    let name = match (&m.name, &m.upcast) {
        (Some(name), _) => quote!(#name),
        (None, Some(target)) => quote!(<#target as #event>::NAME),
        (None, None) => unreachable!("the name is resolved for a current version"),
    };
    let table = match (&m.table, &m.upcast) {
        (Some((table, _)), _) => quote!(#table),
        (None, Some(target)) => quote!(<#target as #event>::TABLE),
        (None, None) => quote!("outbox"),
    };
    // Spanned on the `table` key: a reserved key word is reported there, at compile time (the
    // key words are listed once, in the runtime).
    let reserved_check = m.table.as_ref().map(|(table, span)| {
        quote_spanned! {*span=>
            const _: () = __outbox::__private::refuse_reserved_table_name(#table);
        }
    });
    let aggregate_type = match (m.aggregate_id, &m.aggregate_type, &m.upcast) {
        (None, _, _) => quote!(::core::option::Option::None),
        (Some(_), Some(t), _) => quote!(::core::option::Option::Some(#t)),
        (Some(_), None, Some(target)) => quote! {
            match <#target as #event>::AGGREGATE_TYPE {
                ::core::option::Option::Some(t) => ::core::option::Option::Some(t),
                ::core::option::Option::None => ::core::option::Option::Some(<#target as #event>::NAME),
            }
        },
        (Some(_), None, None) => {
            unreachable!("the aggregate type is resolved for a current version")
        }
    };
    let (current, into_current, upcast_check) = match &m.upcast {
        None => (quote!(Self), quote!(self), quote!()),
        Some(target) => {
            // Spanned on the `upcast = ...` path, so a missing `From` impl is reported there.
            let from = quote_spanned! {target.span()=>
                <#target as ::core::convert::From<#ident>>::from(self)
            };
            let check = quote_spanned! {target.span()=>
                const _: () = __outbox::__private::check_upcast(
                    <#ident as #event>::NAME,
                    <#ident as #event>::VERSION,
                    <#ident as #event>::TABLE,
                    <#target as #event>::NAME,
                    <#target as #event>::VERSION,
                    <#target as #event>::TABLE,
                );
            };
            (
                quote!(<#target as #event>::Current),
                quote!(<#target as #event>::into_current(#from)),
                check,
            )
        }
    };
    // Spanned on the field's type: a type without `Display` is reported there.
    let aggregate_id = match m.aggregate_id {
        Some((field, ty)) => {
            let read =
                quote_spanned! {ty.span()=> __outbox::__private::aggregate_id(&self.#field) };
            quote!(::core::option::Option::Some(#read))
        }
        None => quote!(::core::option::Option::None),
    };
    let aggregate_version = match m.aggregate_version {
        Some((field, ty)) => {
            let read =
                quote_spanned! {ty.span()=> __outbox::__private::aggregate_version(&self.#field) };
            quote!(::core::option::Option::Some(#read))
        }
        None => quote!(::core::option::Option::None),
    };
    // Spanned on the type name: a missing `JsonSchema` derive is reported on it.
    let contract = quote_spanned! {ident.span()=>
        __outbox::__private::contract_of::<#ident>(__TYPE_NAME)
    };
    let is_current = m.upcast.is_none();

    quote! {
        #[doc(hidden)]
        #[allow(non_upper_case_globals, unused_qualifications, clippy::all)]
        const _: () = {
            use #krate as __outbox;

            const __TYPE_NAME: &str = ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#ident));

            #[automatically_derived]
            impl #event for #ident {
                const NAME: &'static str = #name;
                const VERSION: u32 = #version;
                const TABLE: &'static str = #table;
                const AGGREGATE_TYPE: ::core::option::Option<&'static str> = #aggregate_type;

                type Current = #current;

                fn into_current(self) -> Self::Current {
                    #into_current
                }

                fn aggregate_id(&self) -> ::core::option::Option<::std::string::String> {
                    #aggregate_id
                }

                fn aggregate_version(&self) -> ::core::option::Option<i64> {
                    #aggregate_version
                }

                fn contract() -> __outbox::contract::Contract {
                    #contract
                }
            }

            #upcast_check
            #reserved_check

            __outbox::__private::inventory::submit! {
                __outbox::contract::EventRegistration::of::<#ident>(__TYPE_NAME, #is_current)
            }
        };
    }
}

/// Emitted next to the errors when the input is invalid: an `Event` impl whose bodies are never
/// run, so code using the type reports no second round of errors. Not emitted for shapes where
/// the impl itself could not compile (generic types, unions).
pub(crate) fn fallback(ident: &Ident, krate: &Path) -> TokenStream {
    quote! {
        #[doc(hidden)]
        const _: () = {
            use #krate as __outbox;
            impl __outbox::Event for #ident {
                const NAME: &'static str = "";
                const VERSION: u32 = 0;
                const TABLE: &'static str = "outbox";
                const AGGREGATE_TYPE: ::core::option::Option<&'static str> = ::core::option::Option::None;
                type Current = Self;
                fn into_current(self) -> Self { self }
                fn aggregate_id(&self) -> ::core::option::Option<::std::string::String> { ::core::unreachable!() }
                fn aggregate_version(&self) -> ::core::option::Option<i64> { ::core::unreachable!() }
                fn contract() -> __outbox::contract::Contract { ::core::unreachable!() }
            }
        };
    }
}

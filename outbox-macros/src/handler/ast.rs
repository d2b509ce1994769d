//! The handler function as the attribute sees it. The body is kept as raw tokens and never
//! parsed: the function is re-emitted exactly as written, so a half-typed body still gets
//! IDE help and the only errors reported are about the signature.

use proc_macro2::TokenStream;
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Signature, Visibility};

/// `#[attrs] vis sig { body }`, with the body unparsed.
pub(crate) struct MaybeItemFn {
    pub(crate) sig: Signature,
}

impl Parse for MaybeItemFn {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let _attrs = input.call(Attribute::parse_outer)?;
        let _vis: Visibility = input.parse()?;
        let sig: Signature = input.parse()?;
        let _body: TokenStream = input.parse()?;
        Ok(MaybeItemFn { sig })
    }
}

/// `#[handler(crate = path)]`.
pub(crate) struct HandlerArgs {
    pub(crate) krate: Option<syn::Path>,
}

impl HandlerArgs {
    pub(crate) fn parse(cx: &crate::ctxt::Ctxt, args: TokenStream) -> Self {
        use crate::symbol::CRATE;
        use syn::parse::Parser;
        let mut krate = crate::attr::Attr::none(cx, CRATE);
        let parser = syn::meta::parser(|meta| {
            if meta.path == CRATE {
                krate.set(&meta.path, meta.value()?.parse::<syn::Path>()?);
                Ok(())
            } else {
                Err(meta.error("unknown handler attribute; the only one is `crate = path` (where the runtime is re-exported)"))
            }
        });
        if let Err(err) = parser.parse2(args) {
            cx.syn_error(err);
        }
        HandlerArgs { krate: krate.get() }
    }
}

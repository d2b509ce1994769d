//! `#[catalogue]` on a module of event types: parse the module and the events' attributes
//! (`ast`) -> check that every stored version reaches one current type (`validate`) -> append a
//! handler trait and a dispatcher constructor (`expand`).

mod ast;
mod expand;
mod validate;

use heck::ToUpperCamelCase;
use proc_macro2::TokenStream;
use quote::{ToTokens, format_ident};
use syn::Item;

use crate::crate_path;
use crate::ctxt::Ctxt;

pub(crate) fn attribute(args: TokenStream, item: TokenStream) -> TokenStream {
    let cx = Ctxt::new();
    let args = ast::CatalogueArgs::parse(&cx, args);
    let mut module: syn::ItemMod = match syn::parse2(item.clone()) {
        Ok(module) => module,
        Err(_) => {
            cx.discard();
            let err = syn::Error::new_spanned(
                &item,
                "#[catalogue] goes on a module of event types: `#[catalogue] pub mod events { ... }`",
            );
            let mut out = item;
            out.extend(err.to_compile_error());
            return out;
        }
    };
    let Some((_, items)) = &mut module.content else {
        cx.error_spanned_by(
            &module,
            "#[catalogue] needs the module's items inline: write `mod events { ... }`, not `mod events;`",
        );
        let mut out = module.into_token_stream();
        out.extend(cx.check().err().map(|e| e.to_compile_error()));
        return out;
    };
    let krate = crate_path::or_default(args.krate);
    let trait_ident = args.handler.unwrap_or_else(|| {
        format_ident!("{}Handler", module.ident.to_string().to_upper_camel_case())
    });
    let events = ast::events(items);
    let resolved = validate::check(&cx, &events);
    // The trait and constructor are generated even when a rule failed, so code that implements
    // the trait reports no second round of errors.
    let generated = expand::expand(&krate, &trait_ident, &module.ident, &resolved);
    items.push(Item::Verbatim(generated));
    let mut out = module.into_token_stream();
    out.extend(cx.check().err().map(|e| e.to_compile_error()));
    out
}

#[cfg(test)]
mod tests;

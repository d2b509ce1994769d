//! `#[handler]`: parse the signature (`ast`) -> validate -> re-emit the function unchanged and
//! add its registration (`expand`).

mod ast;
mod expand;
mod validate;

use proc_macro2::TokenStream;

use crate::crate_path;
use crate::ctxt::Ctxt;

pub(crate) fn attribute(args: TokenStream, item: TokenStream) -> TokenStream {
    let cx = Ctxt::new();
    let args = ast::HandlerArgs::parse(&cx, args);
    let krate = crate_path::or_default(args.krate);
    // The function is always emitted as written: on error the user keeps a callable function
    // and sees only the error about its signature.
    let mut out = item.clone();
    let func: ast::MaybeItemFn = match syn::parse2(item) {
        Ok(func) => func,
        Err(err) => {
            cx.syn_error(syn::Error::new(
                err.span(),
                format!("#[handler] goes on an `async fn`: {err}"),
            ));
            out.extend(cx.check().err().map(|e| e.to_compile_error()));
            return out;
        }
    };
    let types = validate::check(&cx, &func.sig);
    match (cx.check(), types) {
        (Ok(()), Some(types)) => out.extend(expand::registration(&krate, &func.sig.ident, &types)),
        (Err(err), _) => out.extend(err.to_compile_error()),
        (Ok(()), None) => unreachable!("a signature without types reports an error"),
    }
    out
}

#[cfg(test)]
mod tests;

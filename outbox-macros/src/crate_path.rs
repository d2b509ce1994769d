//! Where generated code finds the runtime: `::outbox_runtime` unless `crate = path` says
//! otherwise (a re-export, a renamed dependency).

use proc_macro2::Span;
use syn::Path;

/// The default runtime path, `::outbox_runtime`.
pub(crate) fn default_path() -> Path {
    let ident = syn::Ident::new("outbox_runtime", Span::call_site());
    syn::parse_quote!(:: #ident)
}

/// The given `crate = path`, or the default.
pub(crate) fn or_default(path: Option<Path>) -> Path {
    path.unwrap_or_else(default_path)
}

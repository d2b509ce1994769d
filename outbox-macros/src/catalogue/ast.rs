//! The event types declared in a `#[catalogue]` module, read from their `#[outbox(...)]`
//! attributes with the same parser the derive uses.

use proc_macro2::TokenStream;
use syn::{Attribute, Ident, Item, Path};

use crate::ctxt::Ctxt;
use crate::event::{ContainerAttrs, naming};

/// One `#[derive(Event)]` type of the module.
pub(crate) struct CatalogueEvent {
    pub(crate) ident: Ident,
    /// The explicit name, or the snake_case default; `None` when inherited from the upcast target.
    pub(crate) explicit_name: Option<String>,
    pub(crate) version: u32,
    pub(crate) version_tokens: TokenStream,
    pub(crate) upcast: Option<Path>,
}

/// `#[catalogue(crate = path, handler = TraitName)]`.
pub(crate) struct CatalogueArgs {
    pub(crate) krate: Option<Path>,
    pub(crate) handler: Option<Ident>,
}

impl CatalogueArgs {
    pub(crate) fn parse(cx: &Ctxt, args: TokenStream) -> Self {
        use crate::symbol::{CRATE, HANDLER};
        use syn::parse::Parser;
        let mut krate = crate::attr::Attr::none(cx, CRATE);
        let mut handler = crate::attr::Attr::none(cx, HANDLER);
        let parser = syn::meta::parser(|meta| {
            if meta.path == CRATE {
                krate.set(&meta.path, meta.value()?.parse::<Path>()?);
            } else if meta.path == HANDLER {
                handler.set(&meta.path, meta.value()?.parse::<Ident>()?);
            } else {
                return Err(meta.error(
                    "unknown catalogue attribute; expected `handler = TraitName` (the generated trait) or `crate = path`",
                ));
            }
            Ok(())
        });
        if let Err(err) = parser.parse2(args) {
            cx.syn_error(err);
        }
        CatalogueArgs {
            krate: krate.get(),
            handler: handler.get(),
        }
    }
}

/// The event types among `items`. A type whose attributes are malformed is left out: the
/// derive on it reports the problem, and reporting it twice would only add noise.
pub(crate) fn events(items: &[Item]) -> Vec<CatalogueEvent> {
    items
        .iter()
        .filter_map(|item| match item {
            Item::Struct(s) => Some((&s.ident, &s.attrs)),
            Item::Enum(e) => Some((&e.ident, &e.attrs)),
            _ => None,
        })
        .filter(|(_, attrs)| derives_event(attrs))
        .filter_map(|(ident, attrs)| {
            let cx = Ctxt::new();
            let container = ContainerAttrs::from_attrs(&cx, attrs);
            let ok = !cx.has_errors();
            cx.discard();
            let version = container.version.filter(|_| ok)?;
            let upcast = container.upcast;
            let explicit_name = match (container.name, &upcast) {
                (Some(name), _) => Some(name.value),
                (None, Some(_)) => None,
                (None, None) => Some(naming::default_event_name(ident)),
            };
            Some(CatalogueEvent {
                ident: ident.clone(),
                explicit_name,
                version: version.value,
                version_tokens: version.tokens,
                upcast,
            })
        })
        .collect()
}

/// `#[derive(..., Event, ...)]`, under any path ending in `Event`.
fn derives_event(attrs: &[Attribute]) -> bool {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("derive"))
        .any(|a| {
            let mut found = false;
            let _ = a.parse_nested_meta(|meta| {
                if meta
                    .path
                    .segments
                    .last()
                    .is_some_and(|s| s.ident == "Event")
                {
                    found = true;
                }
                Ok(())
            });
            found
        })
}

//! Reading `#[outbox(...)]` on an event type and on its fields. None of these functions
//! return a `Result`: an unknown, malformed or duplicated attribute is reported to the `Ctxt`
//! and otherwise ignored, so the user sees every bad attribute in one compile. Rules that look
//! at one attribute alone are checked here; rules across attributes live in `validate.rs`.

use syn::meta::ParseNestedMeta;
use syn::{Attribute, LitInt, LitStr, Path};

use crate::attr::{Attr, Spanned};
use crate::ctxt::Ctxt;
use crate::event_name;
use crate::sql_ident::check_table_name;
use crate::symbol::*;

/// `#[outbox(...)]` on the event type.
pub(crate) struct Container {
    pub(crate) name: Option<Spanned<String>>,
    pub(crate) version: Option<Spanned<u32>>,
    pub(crate) table: Option<Spanned<String>>,
    pub(crate) aggregate: Option<Spanned<String>>,
    pub(crate) upcast: Option<Path>,
    pub(crate) krate: Option<Path>,
}

/// `#[outbox(...)]` on one field.
#[derive(Default)]
pub(crate) struct Field {
    /// The `aggregate_id` token, when given.
    pub(crate) aggregate_id: Option<proc_macro2::TokenStream>,
    /// The `aggregate_version` token, when given.
    pub(crate) aggregate_version: Option<proc_macro2::TokenStream>,
}

const CONTAINER_KEYS: &str = "`name`, `version`, `table`, `aggregate`, `upcast` or `crate`";

impl Container {
    pub(crate) fn from_attrs(cx: &Ctxt, attrs: &[Attribute]) -> Self {
        let mut name = Attr::none(cx, NAME);
        let mut version = Attr::none(cx, VERSION);
        let mut table = Attr::none(cx, TABLE);
        let mut aggregate = Attr::none(cx, AGGREGATE);
        let mut upcast = Attr::none(cx, UPCAST);
        let mut krate = Attr::none(cx, CRATE);

        for attr in attrs.iter().filter(|a| a.path() == OUTBOX) {
            let result = attr.parse_nested_meta(|meta| {
                if meta.path == NAME {
                    let lit: LitStr = meta.value()?.parse()?;
                    check_name(cx, &lit, "event name");
                    name.set(&meta.path, lit.value());
                } else if meta.path == VERSION {
                    let lit: LitInt = meta.value()?.parse()?;
                    // An invalid version still fills the slot, so it is not also reported missing.
                    match lit.base10_parse::<u32>() {
                        Ok(0) => cx.error_spanned_by(&lit, "`version` must be >= 1; the first version is `version = 1`"),
                        Ok(_) => {}
                        Err(_) => cx.error_spanned_by(&lit, "`version` must be a whole number from 1 to 4294967295"),
                    }
                    version.set(&meta.path, lit.base10_parse::<u32>().unwrap_or(0));
                } else if meta.path == TABLE {
                    let lit: LitStr = meta.value()?.parse()?;
                    match check_table_name(&lit.value()) {
                        Ok(()) => table.set(&meta.path, lit.value()),
                        Err(problem) => cx.error_spanned_by(&lit, problem.message(&lit.value())),
                    }
                } else if meta.path == AGGREGATE {
                    let lit: LitStr = meta.value()?.parse()?;
                    check_name(cx, &lit, "aggregate type");
                    aggregate.set(&meta.path, lit.value());
                } else if meta.path == UPCAST {
                    upcast.set(&meta.path, parse_path_value(&meta)?);
                } else if meta.path == CRATE {
                    krate.set(&meta.path, parse_path_value(&meta)?);
                } else if meta.path == AGGREGATE_ID || meta.path == AGGREGATE_VERSION {
                    return Err(meta.error(format!(
                        "`{}` goes on a field, not on the type: put `#[outbox({0})]` on the field that holds it",
                        path_text(&meta.path)
                    )));
                } else {
                    return Err(meta.error(format!(
                        "unknown outbox attribute `{}`; expected {CONTAINER_KEYS}",
                        path_text(&meta.path)
                    )));
                }
                Ok(())
            });
            if let Err(err) = result {
                cx.syn_error(err);
            }
        }

        Container {
            name: Spanned::from_attr(name),
            version: Spanned::from_attr(version),
            table: Spanned::from_attr(table),
            aggregate: Spanned::from_attr(aggregate),
            upcast: upcast.get(),
            krate: krate.get(),
        }
    }
}

impl Field {
    pub(crate) fn from_attrs(cx: &Ctxt, attrs: &[Attribute]) -> Self {
        let mut aggregate_id = Attr::none(cx, AGGREGATE_ID);
        let mut aggregate_version = Attr::none(cx, AGGREGATE_VERSION);
        for attr in attrs.iter().filter(|a| a.path() == OUTBOX) {
            let result = attr.parse_nested_meta(|meta| {
                let slot = if meta.path == AGGREGATE_ID {
                    &mut aggregate_id
                } else if meta.path == AGGREGATE_VERSION {
                    &mut aggregate_version
                } else {
                    return Err(meta.error(format!(
                        "unknown outbox field attribute `{}`; expected `aggregate_id` or `aggregate_version`",
                        path_text(&meta.path)
                    )));
                };
                if meta.input.peek(syn::Token![=]) {
                    return Err(meta.error(format!(
                        "`{}` takes no value: write `#[outbox({0})]`",
                        path_text(&meta.path)
                    )));
                }
                slot.set(&meta.path, ());
                Ok(())
            });
            if let Err(err) = result {
                cx.syn_error(err);
            }
        }
        Field {
            aggregate_id: aggregate_id.get_with_tokens().map(|(t, ())| t),
            aggregate_version: aggregate_version.get_with_tokens().map(|(t, ())| t),
        }
    }
}

/// Event names and aggregate types are embedded in generated migrations, the contract lock,
/// logs and NATS subjects: only names of the documented set are accepted (`event_name.rs`).
/// The value still fills its slot, so it is not also reported missing.
fn check_name(cx: &Ctxt, lit: &LitStr, what: &str) {
    if let Some(problem) = event_name::problem(&lit.value()) {
        cx.error_spanned_by(
            lit,
            format!(
                "\"{}\" is not a valid {what}: {problem}; use {}",
                event_name::shown(&lit.value()),
                event_name::RULE
            ),
        );
    }
}

/// `key = some::path`, or the string form `key = "some::path"` that serde accepts.
fn parse_path_value(meta: &ParseNestedMeta) -> syn::Result<Path> {
    let value = meta.value()?;
    if value.peek(LitStr) {
        let lit: LitStr = value.parse()?;
        lit.parse()
    } else {
        value.parse()
    }
}

fn path_text(path: &Path) -> String {
    quote::quote!(#path).to_string().replace(' ', "")
}

//! The catalogue's exhaustiveness rules: every stored version must reach exactly one current
//! type, through upcasts declared inside the catalogue. One function per rule.

use std::collections::BTreeMap;

use quote::ToTokens;

use super::ast::CatalogueEvent;
use crate::ctxt::Ctxt;

/// An event of the catalogue with its name resolved.
pub(crate) struct Resolved<'a> {
    pub(crate) event: &'a CatalogueEvent,
    pub(crate) name: String,
}

impl Resolved<'_> {
    pub(crate) fn is_current(&self) -> bool {
        self.event.upcast.is_none()
    }
}

pub(crate) fn check<'a>(cx: &Ctxt, events: &'a [CatalogueEvent]) -> Vec<Resolved<'a>> {
    let targets: Vec<Option<usize>> = events
        .iter()
        .map(|e| upcast_target(cx, events, e))
        .collect();
    let resolved: Vec<Resolved> = events
        .iter()
        .enumerate()
        .filter_map(|(i, event)| {
            Some(Resolved {
                event,
                name: resolve_name(events, &targets, i)?,
            })
        })
        .collect();
    for (i, event) in events.iter().enumerate() {
        if let Some(t) = targets[i] {
            check_upcast_is_newer_same_event(cx, event, &events[t], &resolved);
        }
    }
    let mut by_name: BTreeMap<&str, Vec<&Resolved>> = BTreeMap::new();
    for r in &resolved {
        by_name.entry(&r.name).or_default().push(r);
    }
    for (name, mut versions) in by_name {
        versions.sort_by_key(|r| r.event.version);
        check_unique_versions(cx, name, &versions);
        check_one_current(cx, name, &versions);
        check_no_version_gaps(cx, name, &versions);
    }
    resolved
}

/// An upcast that leaves the catalogue cannot be followed here, so the catalogue could not
/// promise that the stored version reaches a handled type.
fn upcast_target(cx: &Ctxt, events: &[CatalogueEvent], event: &CatalogueEvent) -> Option<usize> {
    let path = event.upcast.as_ref()?;
    let last = &path.segments.last()?.ident;
    let found = events.iter().position(|e| e.ident == *last);
    if found.is_none() {
        cx.error_spanned_by(
            path,
            format!(
                "`{}` upcasts to `{}`, which is not in this catalogue: declare `{}` in this module too, \
                 so every stored version has a path to a handled type",
                event.ident,
                path.to_token_stream().to_string().replace(' ', ""),
                last
            ),
        );
    }
    found
}

/// Follow upcasts to the first explicit name (an older version inherits its target's name).
fn resolve_name(
    events: &[CatalogueEvent],
    targets: &[Option<usize>],
    mut i: usize,
) -> Option<String> {
    for _ in 0..=events.len() {
        if let Some(name) = &events[i].explicit_name {
            return Some(name.clone());
        }
        i = targets[i]?;
    }
    None
}

/// An upcast moves a payload one step forward within one event.
fn check_upcast_is_newer_same_event(
    cx: &Ctxt,
    event: &CatalogueEvent,
    target: &CatalogueEvent,
    resolved: &[Resolved],
) {
    let path = event.upcast.as_ref().expect("has a target");
    let name_of = |e: &CatalogueEvent| {
        resolved
            .iter()
            .find(|r| r.event.ident == e.ident)
            .map(|r| r.name.clone())
    };
    if let (Some(own), Some(theirs)) = (name_of(event), name_of(target)) {
        if own != theirs {
            cx.error_spanned_by(
                path,
                format!(
                    "`{}` is event `{own}` but its upcast target `{}` is event `{theirs}`: an upcast stays within one event; \
                     give both the same `name`",
                    event.ident, target.ident
                ),
            );
        }
    }
    if target.version <= event.version {
        cx.error_spanned_by(
            path,
            format!(
                "`{}` is version {} but its upcast target `{}` is version {}: upcast to a newer version",
                event.ident, event.version, target.ident, target.version
            ),
        );
    }
}

/// A stored (name, version) must decode into exactly one type.
fn check_unique_versions(cx: &Ctxt, name: &str, versions: &[&Resolved]) {
    for pair in versions.windows(2) {
        if pair[0].event.version == pair[1].event.version {
            cx.error_spanned_by(
                &pair[1].event.version_tokens,
                format!(
                    "`{}` and `{}` are both event `{name}` version {}: give one of them another version",
                    pair[0].event.ident, pair[1].event.ident, pair[1].event.version
                ),
            );
        }
    }
}

/// Handlers see one current type per event; every older version must say where it goes.
fn check_one_current(cx: &Ctxt, name: &str, versions: &[&Resolved]) {
    let currents: Vec<&&Resolved> = versions.iter().filter(|r| r.is_current()).collect();
    let Some((newest, older)) = currents.split_last() else {
        return;
    };
    for old in older {
        cx.error_spanned_by(
            &old.event.ident,
            format!(
                "event `{name}` has two current versions, `{}` (version {}) and `{}` (version {}); \
                 version {} must declare where it goes: add `#[outbox(upcast = {})]` to `{}` and `impl From<{}> for {}`",
                old.event.ident,
                old.event.version,
                newest.event.ident,
                newest.event.version,
                old.event.version,
                newest.event.ident,
                old.event.ident,
                old.event.ident,
                newest.event.ident,
            ),
        );
    }
}

/// A missing version in the middle means rows of that version would have no type to decode
/// into. (Retiring the oldest versions is fine: the lowest version may be above 1.)
fn check_no_version_gaps(cx: &Ctxt, name: &str, versions: &[&Resolved]) {
    for pair in versions.windows(2) {
        let (low, high) = (pair[0].event.version, pair[1].event.version);
        if high > low + 1 {
            cx.error_spanned_by(
                &pair[1].event.version_tokens,
                format!(
                    "event `{name}` has versions {low} and {high} but no version {}: rows stored as version {} would have \
                     no type to decode into; declare the version {} type (with `upcast`), or number `{}` version {}",
                    low + 1,
                    low + 1,
                    low + 1,
                    pair[1].event.ident,
                    low + 1
                ),
            );
        }
    }
}

//! The names of every `#[outbox(...)]` attribute, in one place.

use std::fmt;

use syn::{Ident, Path};

#[derive(Copy, Clone)]
pub(crate) struct Symbol(pub(crate) &'static str);

pub(crate) const OUTBOX: Symbol = Symbol("outbox");
pub(crate) const NAME: Symbol = Symbol("name");
pub(crate) const VERSION: Symbol = Symbol("version");
pub(crate) const TABLE: Symbol = Symbol("table");
pub(crate) const CRATE: Symbol = Symbol("crate");
pub(crate) const UPCAST: Symbol = Symbol("upcast");
pub(crate) const AGGREGATE: Symbol = Symbol("aggregate");
pub(crate) const AGGREGATE_ID: Symbol = Symbol("aggregate_id");
pub(crate) const AGGREGATE_VERSION: Symbol = Symbol("aggregate_version");
pub(crate) const HANDLER: Symbol = Symbol("handler");

impl PartialEq<Symbol> for Ident {
    fn eq(&self, word: &Symbol) -> bool {
        self == word.0
    }
}

impl PartialEq<Symbol> for &Ident {
    fn eq(&self, word: &Symbol) -> bool {
        *self == word.0
    }
}

impl PartialEq<Symbol> for Path {
    fn eq(&self, word: &Symbol) -> bool {
        self.is_ident(word.0)
    }
}

impl PartialEq<Symbol> for &Path {
    fn eq(&self, word: &Symbol) -> bool {
        self.is_ident(word.0)
    }
}

impl fmt::Display for Symbol {
    fn fmt(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str(self.0)
    }
}

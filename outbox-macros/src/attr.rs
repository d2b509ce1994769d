//! Typed attribute slots shared by every macro: a value plus the tokens it came from, so a
//! later rule can point at exactly what the user wrote.

use proc_macro2::TokenStream;
use quote::ToTokens;

use crate::ctxt::Ctxt;
use crate::symbol::Symbol;

/// One `key = value` (or flag) attribute that may be given at most once.
pub(crate) struct Attr<'c, T> {
    cx: &'c Ctxt,
    name: Symbol,
    tokens: TokenStream,
    value: Option<T>,
}

impl<'c, T> Attr<'c, T> {
    pub(crate) fn none(cx: &'c Ctxt, name: Symbol) -> Self {
        Attr {
            cx,
            name,
            tokens: TokenStream::new(),
            value: None,
        }
    }

    /// Set the value; a second occurrence is reported on its own tokens.
    pub(crate) fn set<A: ToTokens>(&mut self, obj: A, value: T) {
        let tokens = obj.into_token_stream();
        if self.value.is_some() {
            self.cx.error_spanned_by(
                tokens,
                format!("duplicate outbox attribute `{}`: give it once", self.name),
            );
        } else {
            self.tokens = tokens;
            self.value = Some(value);
        }
    }

    /// The value and the tokens it was written with.
    pub(crate) fn get_with_tokens(self) -> Option<(TokenStream, T)> {
        let Attr { tokens, value, .. } = self;
        value.map(|v| (tokens, v))
    }

    pub(crate) fn get(self) -> Option<T> {
        self.value
    }
}

/// A value together with the tokens it was written with (for spans).
pub(crate) struct Spanned<T> {
    pub(crate) tokens: TokenStream,
    pub(crate) value: T,
}

impl<T> Spanned<T> {
    pub(crate) fn from_attr(attr: Attr<'_, T>) -> Option<Self> {
        attr.get_with_tokens()
            .map(|(tokens, value)| Spanned { tokens, value })
    }

    /// Where the attribute's key is written, for code that must report an error on it.
    pub(crate) fn span(&self) -> proc_macro2::Span {
        self.tokens
            .clone()
            .into_iter()
            .next()
            .map_or_else(proc_macro2::Span::call_site, |first| first.span())
    }
}

impl<T> ToTokens for Spanned<T> {
    fn to_tokens(&self, out: &mut TokenStream) {
        self.tokens.to_tokens(out);
    }
}

//! Error accumulation: every rule reports into one `Ctxt`, so one bad attribute never hides
//! another, and the user sees all of them in one compile.

use std::cell::RefCell;
use std::fmt::Display;

use quote::ToTokens;

/// Collects spanned errors; must be consumed with [`Ctxt::check`].
pub(crate) struct Ctxt {
    errors: RefCell<Option<Vec<syn::Error>>>,
}

impl Ctxt {
    pub(crate) fn new() -> Self {
        Ctxt {
            errors: RefCell::new(Some(Vec::new())),
        }
    }

    /// Report `msg` spanned on the tokens of `obj`.
    pub(crate) fn error_spanned_by<T: ToTokens, M: Display>(&self, obj: T, msg: M) {
        self.syn_error(syn::Error::new_spanned(obj.into_token_stream(), msg));
    }

    /// Report an error produced by syn (for example a malformed attribute).
    pub(crate) fn syn_error(&self, err: syn::Error) {
        self.errors
            .borrow_mut()
            .as_mut()
            .expect("Ctxt used after check")
            .push(err);
    }

    /// Whether an error was reported so far.
    pub(crate) fn has_errors(&self) -> bool {
        self.errors.borrow().as_ref().is_some_and(|e| !e.is_empty())
    }

    /// All errors combined into one, or `Ok` when there were none.
    pub(crate) fn check(self) -> syn::Result<()> {
        let errors = self.errors.borrow_mut().take().expect("Ctxt checked twice");
        let mut iter = errors.into_iter();
        let Some(mut combined) = iter.next() else {
            return Ok(());
        };
        for rest in iter {
            combined.combine(rest);
        }
        Err(combined)
    }

    /// Drop the collected errors on purpose (the catalogue re-reads attributes that the derive
    /// already reports on, and must not report them twice).
    pub(crate) fn discard(self) {
        self.errors.borrow_mut().take();
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if !std::thread::panicking() && self.errors.borrow().is_some() {
            panic!("forgot to check for errors");
        }
    }
}

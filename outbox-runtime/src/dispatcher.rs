//! Routes a claimed row to the handler of its current event type, upcasting older versions.
//! OWNER: issue 3.

/// Typed handlers keyed by event name; implements [`crate::Sink`].
pub struct Dispatcher {}

//! Derive and attribute macros of the outbox toolkit; use them through `outbox-runtime`.
//! OWNER: issue 3.

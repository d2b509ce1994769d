//! The WAL relay (issue 42, docs/relay.md): delivery of a table's events read from PostgreSQL's
//! write-ahead log through a logical replication slot, instead of a queue row per event.
//!
//! This is the first slice: the decoder of what the slot hands out and the check of the server
//! at start (its one read is in `store::relay_server`). Nothing here is wired into the worker
//! yet; the relay loop, the durable watermark and the hand-off of failures
//! to the queue table are designed in docs/relay.md and come next.
//!
//! - [`pgoutput`]: the binary messages of PostgreSQL's `pgoutput` plugin (protocol version 1),
//!   as `pg_logical_slot_{get,peek}_binary_changes` return them one per row, or as the
//!   streaming replication protocol carries them one per `XLogData`.
//! - [`inserts`]: turns a sequence of those messages into the inserted event rows, in commit
//!   order, each with its transaction's commit position.
//! - [`preflight`]: what the server and the role must allow before a relay starts, each
//!   problem named with the command that fixes it.

pub mod inserts;
pub mod pgoutput;
pub mod preflight;

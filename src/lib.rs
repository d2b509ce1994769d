//! Unpublished package owning the examples and integration tests of the outbox workspace.
//!
//! The guides under `docs/` are attached below so that `cargo test --doc` compiles their code
//! blocks: a guide whose example stops compiling fails the test suite instead of misleading a
//! reader. (Blocks marked `ignore` are fragments and are not compiled.)

#[doc = include_str!("../docs/publishers.md")]
mod publishers_guide {}

#[doc = include_str!("../docs/inbox.md")]
mod inbox_guide {}

// The guide shows a whole `src/bin/outbox.rs`, `fn main` included, on purpose.
#[allow(clippy::needless_doctest_main)]
#[doc = include_str!("../docs/migrations-and-cli.md")]
mod migrations_and_cli_guide {}

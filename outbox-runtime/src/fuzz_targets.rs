//! Fuzz targets for the inputs an attacker controls. Not public API: compiled for this crate's
//! own tests and with the `fuzzing` feature, which only the `fuzz/` crate enables.
//!
//! Each target is one function that takes any input and panics when an invariant breaks:
//!
//! | target | input | invariants |
//! | --- | --- | --- |
//! | [`check_payload`] | a payload's JSON text, as enqueue serializes it and as a worker reads it back | never panics; what enqueue refuses is a typed [`Error::PayloadRejected`](crate::Error::PayloadRejected) naming the part, and exactly that the worker refuses with a reason; what it accepts decodes to the same value, and its fingerprint survives a round trip through the canonical JSON |
//! | [`check_receiver_answer`] | an HTTP receiver's answer: status, headers, body (one event or a batch) | never panics; an event is delivered only when the receiver acknowledged it; a retry never waits longer than the cap; a reason never holds the URL's secrets nor more of the body than the limit |
//! | [`check_contract_lock`] | the text of `outbox.lock` | never panics; a refused lock is a typed error that names what is wrong; an accepted one is rewritten canonically and reads back the same |
//! | [`check_cli_args`] | the `outbox` command's arguments | never panics; a usage error is exit code 2 with a message; `--help`/`--version` exit 0; a command that only prints ends in 0 or 2 |
//!
//! The same functions run twice: as bounded property tests in `cargo test` (each module's
//! tests, inputs from proptest strategies that aim at the edges), and under libFuzzer from the
//! `fuzz/` crate (`cargo +nightly fuzz run <target>`, see `docs/proof.md`), which turns raw
//! bytes into the structured inputs with each module's `from_bytes`.

#[cfg(feature = "cli")]
mod cli_args;
mod contract_lock;
mod payload;
#[cfg(feature = "http")]
mod receiver_answer;

#[cfg(feature = "cli")]
pub use cli_args::{args_from_bytes, check_cli_args};
pub use contract_lock::check_contract_lock;
pub use payload::check_payload;
#[cfg(feature = "http")]
pub use receiver_answer::{ReceiverAnswer, check_receiver_answer};

/// Cases per property test: 512, or `PROPTEST_CASES` for a longer run on a stable toolchain
/// (`PROPTEST_CASES=100000 cargo test -p outbox-runtime --lib fuzz_targets`).
#[cfg(test)]
fn proptest_cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(512)
}

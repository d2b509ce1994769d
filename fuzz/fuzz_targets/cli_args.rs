//! Command-line arguments (NUL-separated) into the `outbox` command.
#![no_main]

use outbox_runtime::fuzz_targets::{args_from_bytes, check_cli_args};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    check_cli_args(&args_from_bytes(data));
});

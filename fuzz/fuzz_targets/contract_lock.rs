//! The contract lock file into the generator.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    outbox_runtime::fuzz_targets::check_contract_lock(data);
});

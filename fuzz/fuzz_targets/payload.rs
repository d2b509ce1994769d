//! Payload JSON into enqueue's check and a worker's decode.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    outbox_runtime::fuzz_targets::check_payload(data);
});

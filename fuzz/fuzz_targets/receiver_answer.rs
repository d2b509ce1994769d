//! HTTP receiver answers (status, headers, Retry-After, batch results) into the publisher's
//! outcome parser.
#![no_main]

use outbox_runtime::fuzz_targets::{ReceiverAnswer, check_receiver_answer};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    check_receiver_answer(&ReceiverAnswer::from_bytes(data));
});

//! Payload JSON into enqueue's check and a worker's decode.

use serde_json::Value;
use serde_json::value::RawValue;

use crate::error::{Error, PayloadPart};
use crate::payload_limits::{check_enqueue, decode_stored};
use crate::store::enqueue::{canonical_json, payload_fingerprint};

/// The event name the target enqueues under.
const EVENT: &str = "fuzz.payload";

/// Feed `data` to both sides of the payload contract:
///
/// - as a stored column a worker reads back (raw SQL may have written anything): the decode
///   gives a value or a reason that names the part, never a panic;
/// - as a payload and as headers a service enqueues (the value `data` parses to, serialized
///   again as enqueue does): enqueue refuses it with [`Error::PayloadRejected`] naming the
///   part and the event exactly when the worker's decode refuses it; otherwise the worker
///   decodes the same value, and the value's fingerprint is the fingerprint of its canonical
///   JSON read back (a retry that reads the payload back and enqueues it again is recognised).
///
/// # Panics
/// When one of those invariants does not hold.
pub fn check_payload(data: &[u8]) {
    // jsonb text and serde's output are UTF-8; anything else never reaches either side.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // A stored column, read as the worker reads it: raw JSON first (only the syntax), then the
    // shared check and the decode.
    if let Ok(raw) = serde_json::from_str::<Box<RawValue>>(text) {
        match decode_stored(PayloadPart::Headers, raw.get()) {
            Ok(value) => assert!(
                check_enqueue(EVENT, "{}", Some(&value)).is_ok(),
                "a worker decoded headers enqueue would refuse: {text:?}"
            ),
            Err(reason) => assert!(
                reason.starts_with("undecodable headers: "),
                "reason does not name the part: {reason}"
            ),
        }
    }
    let Ok(value) = serde_json::from_str::<Value>(text) else {
        return;
    };
    let serialized = serde_json::to_string(&value).expect("a JSON value serializes");
    let enqueued = check_enqueue(EVENT, &serialized, None);
    match decode_stored(PayloadPart::Payload, &serialized) {
        Ok(decoded) => {
            assert!(
                enqueued.is_ok(),
                "a worker decodes what enqueue refuses: {enqueued:?}"
            );
            assert_eq!(decoded, value, "the decode changed the value");
        }
        Err(reason) => {
            assert!(
                reason.starts_with("undecodable payload: "),
                "reason does not name the part: {reason}"
            );
            assert_rejected(&enqueued, PayloadPart::Payload, &reason);
        }
    }
    // The same value as headers: the same verdict, naming the headers.
    let as_headers = check_enqueue(EVENT, "{}", Some(&value));
    assert_eq!(
        as_headers.is_ok(),
        enqueued.is_ok(),
        "payload and headers disagree on {text:?}"
    );
    if enqueued.is_err() {
        assert_rejected(&as_headers, PayloadPart::Headers, "headers");
        return;
    }
    let canonical = canonical_json(&value);
    let reread: Value = serde_json::from_str(&canonical)
        .unwrap_or_else(|e| panic!("canonical JSON does not read back ({e}): {canonical}"));
    assert_eq!(
        canonical_json(&reread),
        canonical,
        "canonical JSON is not a fixed point"
    );
    assert_eq!(
        payload_fingerprint(EVENT, 1, &reread),
        payload_fingerprint(EVENT, 1, &value),
        "the fingerprint changed through the canonical JSON: {canonical}"
    );
}

fn assert_rejected(result: &crate::error::Result<()>, part: PayloadPart, context: &str) {
    match result {
        Err(
            error @ Error::PayloadRejected {
                event_type,
                part: refused,
                ..
            },
        ) => {
            assert_eq!(*refused, part, "{context}");
            assert_eq!(event_type, EVENT);
            let message = error.to_string();
            assert!(message.contains(EVENT), "{message}");
        }
        other => {
            panic!("enqueue should refuse the {part} a worker cannot decode ({context}): {other:?}")
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::check_payload;
    use crate::payload_limits::MAX_JSON_DEPTH;

    /// JSON texts aimed at the edges: nesting around the depth limit, strings with brackets,
    /// escapes and U+0000, numbers of every form, duplicate keys.
    fn json_texts() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>()
                .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
                .prop_map(|f| f.to_string()),
            "-?[0-9]{1,3}(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,3})?",
            "\"([\\[\\]{}a-z\u{0}\u{e9}\u{1F600}]|\\\\u0000|\\\\\\\\|\\\\\"|\\\\n){0,6}\"",
        ];
        leaf.prop_recursive(8, 64, 3, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                proptest::collection::vec(("\"[a-z\u{0}]{0,2}\"", inner), 0..3).prop_map(|pairs| {
                    let fields: Vec<String> =
                        pairs.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
                    format!("{{{}}}", fields.join(","))
                }),
            ]
        })
    }

    /// Wrap `text` in `depth` arrays or objects (a nesting that crosses the limit).
    fn nested(text: &str, depth: usize, object: bool) -> String {
        if object {
            format!("{}{text}{}", "{\"k\":".repeat(depth), "}".repeat(depth))
        } else {
            format!("{}{text}{}", "[".repeat(depth), "]".repeat(depth))
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::fuzz_targets::proptest_cases()))]

        #[test]
        fn any_json_payload_keeps_the_contract(
            text in json_texts(),
            depth in (MAX_JSON_DEPTH - 4)..(MAX_JSON_DEPTH + 4),
            object: bool,
            wrap: bool,
        ) {
            let text = if wrap { nested(&text, depth, object) } else { text };
            check_payload(text.as_bytes());
        }

        #[test]
        fn any_bytes_keep_the_contract(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            check_payload(&data);
        }
    }

    #[test]
    fn the_limit_and_nul_characters_are_exercised() {
        // The edges the strategies aim at, by hand: these reach the refusing branches.
        for text in [
            nested("1", MAX_JSON_DEPTH, false),
            nested("1", MAX_JSON_DEPTH + 1, false),
            nested("1", MAX_JSON_DEPTH + 1, true),
            "{\"a\":\"\\u0000\"}".to_owned(),
            "{\"\\u0000\":1}".to_owned(),
            "[1.0, -0.0, 1e300, 18446744073709551615]".to_owned(),
            // Read back one unit in the last place off before serde_json's `float_roundtrip`.
            "[{\"\":0.56e47}, 5.599999999999999e46]".to_owned(),
        ] {
            check_payload(text.as_bytes());
        }
    }
}

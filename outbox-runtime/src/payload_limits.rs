//! What a stored payload (and its headers) may be, checked by one set of functions on both sides:
//! enqueue refuses what a worker could not decode, and a worker decodes every claimed row through
//! the same check, so the two can never disagree about a row.
//!
//! A payload may be any JSON value that
//! - nests arrays and objects at most [`MAX_JSON_DEPTH`] levels deep, and
//! - contains no U+0000 character in any string or key (PostgreSQL's `jsonb` cannot store it;
//!   an insert carrying one fails and aborts the caller's transaction, so enqueue refuses it
//!   first).
//!
//! Headers follow the same rules. Size has its own, configurable limit
//! (`EnqueueOptions::max_payload_bytes`).

use serde_json::Value;

use crate::error::{Error, PayloadPart, PayloadProblem, Result};

/// The deepest nesting of arrays and objects a payload or its headers may have: a scalar is at
/// depth 0, `{"a": 1}` at depth 1, `{"a": [1]}` at depth 2.
///
/// Enqueue refuses deeper values ([`Error::PayloadRejected`]) and a worker exhausts a stored row
/// that is deeper (written by raw SQL) with that reason, without touching the other rows of its
/// batch. 64 is well inside what `serde_json` decodes without running into its own recursion
/// limit of 128, and it is the default maximum depth of common JSON readers (.NET's
/// `System.Text.Json`), so a receiver that parses what a publisher forwards does not refuse it.
pub const MAX_JSON_DEPTH: usize = 64;

/// Check a JSON text (already valid JSON: serialized by `serde_json`, or read from `jsonb`).
/// Iterative, so a hostile depth cannot overflow the stack.
pub(crate) fn check_text(json: &str) -> std::result::Result<(), PayloadProblem> {
    let bytes = json.as_bytes();
    let mut depth = 0usize;
    let mut in_string = false;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            match b {
                b'\\' => {
                    if bytes.get(i + 1) == Some(&b'u') && bytes.get(i + 2..i + 6) == Some(b"0000") {
                        return Err(PayloadProblem::NulCharacter);
                    }
                    // The escaped character is never a quote that ends the string.
                    i += 1;
                }
                b'"' => in_string = false,
                0 => return Err(PayloadProblem::NulCharacter),
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'[' | b'{' => {
                    depth += 1;
                    if depth > MAX_JSON_DEPTH {
                        return Err(PayloadProblem::TooDeep {
                            limit: MAX_JSON_DEPTH,
                        });
                    }
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        i += 1;
    }
    Ok(())
}

/// Check a JSON value built in memory (headers). Iterative, like [`check_text`], and agrees with
/// it on every value (see the tests).
pub(crate) fn check_value(value: &Value) -> std::result::Result<(), PayloadProblem> {
    let mut stack: Vec<(&Value, usize)> = vec![(value, 0)];
    while let Some((value, depth)) = stack.pop() {
        match value {
            Value::String(s) if s.contains('\0') => return Err(PayloadProblem::NulCharacter),
            Value::Array(items) => {
                if depth + 1 > MAX_JSON_DEPTH {
                    return Err(PayloadProblem::TooDeep {
                        limit: MAX_JSON_DEPTH,
                    });
                }
                stack.extend(items.iter().map(|item| (item, depth + 1)));
            }
            Value::Object(map) => {
                if depth + 1 > MAX_JSON_DEPTH {
                    return Err(PayloadProblem::TooDeep {
                        limit: MAX_JSON_DEPTH,
                    });
                }
                if map.keys().any(|k| k.contains('\0')) {
                    return Err(PayloadProblem::NulCharacter);
                }
                stack.extend(map.values().map(|item| (item, depth + 1)));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Enqueue's check of a serialized payload and the optional headers.
pub(crate) fn check_enqueue(
    event_type: &str,
    payload: &str,
    headers: Option<&Value>,
) -> Result<()> {
    let rejected = |part, problem| Error::PayloadRejected {
        event_type: event_type.to_owned(),
        part,
        problem,
    };
    check_text(payload).map_err(|problem| rejected(PayloadPart::Payload, problem))?;
    if let Some(headers) = headers {
        check_value(headers).map_err(|problem| rejected(PayloadPart::Headers, problem))?;
    }
    Ok(())
}

/// A worker's decode of one stored JSON column: the same check as enqueue, then `serde_json`.
/// The error is the reason stored with the exhausted row.
pub(crate) fn decode_stored(part: PayloadPart, json: &str) -> std::result::Result<Value, String> {
    check_text(json).map_err(|problem| format!("undecodable {part}: {problem}"))?;
    serde_json::from_str(json).map_err(|e| format!("undecodable {part}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nested(depth: usize, open: &str, close: &str) -> String {
        format!("{}1{}", open.repeat(depth), close.repeat(depth))
    }

    #[test]
    fn depth_at_the_limit_passes_and_one_more_is_refused_by_both_checks() {
        for (open, close) in [("[", "]"), ("{\"k\":", "}")] {
            let ok = nested(MAX_JSON_DEPTH, open, close);
            let deep = nested(MAX_JSON_DEPTH + 1, open, close);
            assert_eq!(check_text(&ok), Ok(()));
            let value: Value = serde_json::from_str(&ok).unwrap();
            assert_eq!(check_value(&value), Ok(()));
            let too_deep = Err(PayloadProblem::TooDeep {
                limit: MAX_JSON_DEPTH,
            });
            assert_eq!(check_text(&deep), too_deep);
            let value: Value = serde_json::from_str(&deep).unwrap();
            assert_eq!(check_value(&value), too_deep);
            assert!(decode_stored(PayloadPart::Payload, &ok).is_ok());
            assert!(decode_stored(PayloadPart::Payload, &deep).is_err());
        }
    }

    #[test]
    fn brackets_and_escapes_inside_strings_do_not_count() {
        let text = format!(
            r#"{{"a\"[{{": "{}\\", "b": ["]]]\u0001"]}}"#,
            "[".repeat(200)
        );
        assert_eq!(check_text(&text), Ok(()));
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(check_value(&value), Ok(()));
    }

    #[test]
    fn a_nul_character_is_refused_in_values_and_keys() {
        for value in [
            json!({"a": "x\u{0}y"}),
            json!({"k\u{0}": 1}),
            json!(["\u{0}"]),
        ] {
            let text = serde_json::to_string(&value).unwrap();
            assert_eq!(
                check_text(&text),
                Err(PayloadProblem::NulCharacter),
                "{text}"
            );
            assert_eq!(check_value(&value), Err(PayloadProblem::NulCharacter));
        }
        // An escaped backslash followed by "u0000" is text, not a NUL.
        let text = serde_json::to_string(&json!({"a": "\\u0000"})).unwrap();
        assert_eq!(check_text(&text), Ok(()));
    }

    #[test]
    fn the_limit_is_within_what_serde_json_decodes() {
        let text = nested(MAX_JSON_DEPTH, "[", "]");
        serde_json::from_str::<Value>(&text).expect("serde_json decodes the deepest allowed value");
    }

    #[test]
    fn enqueue_names_the_part_that_is_refused() {
        let deep = nested(MAX_JSON_DEPTH + 1, "[", "]");
        let err = check_enqueue("order.placed", &deep, None).unwrap_err();
        assert!(matches!(
            err,
            Error::PayloadRejected {
                part: PayloadPart::Payload,
                ..
            }
        ));
        let headers: Value = serde_json::from_str(&deep).unwrap();
        let err = check_enqueue("order.placed", "{}", Some(&headers)).unwrap_err();
        assert!(matches!(
            err,
            Error::PayloadRejected {
                part: PayloadPart::Headers,
                ..
            }
        ));
        let message = err.to_string();
        assert!(
            message.contains("64") && message.contains("order.placed"),
            "{message}"
        );
    }

    /// Arbitrary JSON values, nested up to a little past the limit, with strings that hold
    /// brackets, quotes, escapes and U+0000.
    fn json_values() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "[\\[\\]{}\"\\\\a-z\u{0}]{0,6}".prop_map(Value::String),
        ];
        leaf.prop_recursive(MAX_JSON_DEPTH as u32 + 4, 256, 3, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z\\[{\"\u{0}]{0,3}", inner, 0..3)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A chain of `depth` single-element arrays around `inner`.
    fn wrapped(depth: usize, inner: Value) -> Value {
        (0..depth).fold(inner, |v, _| Value::Array(vec![v]))
    }

    proptest::proptest! {
        /// The enqueue check (on the serialized text) and the worker's decode agree on every
        /// value: what enqueue accepts, a worker decodes to the same value; what it refuses, a
        /// worker refuses for the same reason. One limit, both sides.
        #[test]
        fn enqueue_and_decode_agree_on_arbitrary_json(value in json_values(), extra in 0usize..70) {
            let value = wrapped(extra, value);
            let text = serde_json::to_string(&value).unwrap();
            let by_text = check_text(&text);
            // Both refuse or both accept (a value with two problems may be named by either).
            proptest::prop_assert_eq!(by_text.is_ok(), check_value(&value).is_ok(), "{:?}", by_text);
            match decode_stored(PayloadPart::Payload, &text) {
                Ok(decoded) => {
                    proptest::prop_assert!(by_text.is_ok());
                    proptest::prop_assert_eq!(decoded, value);
                }
                Err(reason) => {
                    proptest::prop_assert!(by_text.is_err(), "decode refused what enqueue accepts: {}", reason);
                    proptest::prop_assert!(reason.starts_with("undecodable payload: "), "{}", reason);
                }
            }
        }

        /// Arbitrary text (not necessarily JSON) never panics the worker's decode; it is either
        /// a value or a reason.
        #[test]
        fn arbitrary_stored_text_decodes_or_gives_a_reason(text in "\\PC{0,40}|[\\[\\]{}\"\\\\0-9,:]{0,200}") {
            if let Err(reason) = decode_stored(PayloadPart::Headers, &text) {
                proptest::prop_assert!(reason.starts_with("undecodable headers: "), "{}", reason);
            }
        }
    }
}

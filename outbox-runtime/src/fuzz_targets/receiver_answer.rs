//! Receiver answers into the HTTP publisher's outcome parser.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use uuid::Uuid;

use crate::delivery::{FailureKind, HandlerError};
use crate::publish::http::{HttpConfig, HttpPublisher};

/// The receiver URL: its password and its query value must never show in a reason.
const URL: &str = "http://fuzz:pa55w0rd-x@127.0.0.1:9/hook?token=t0k3n-y";
/// The URL's secrets, as they appear in it.
const SECRETS: [&str; 2] = ["pa55w0rd-x", "t0k3n-y"];
/// The longest `Retry-After` honoured.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// How much of a body a reason keeps (small, so that cuts happen often).
const MAX_REASON_BYTES: usize = 48;
/// The most events in one batch request.
const MAX_EVENTS: usize = 8;

/// One answer of a receiver, as the HTTP client hands it over.
#[derive(Debug, Clone)]
pub struct ReceiverAnswer {
    /// The response's status (any number: the target maps it into 100..=999, as the client
    /// only hands over those).
    pub status: u16,
    /// Header lines as the receiver sent them; the target keeps those the HTTP client would
    /// accept.
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
    /// The body as far as it was read.
    pub body: Vec<u8>,
    /// Whether the receiver sent more than was read.
    pub truncated: bool,
    /// How many events the request carried (batch mode), 1 to 8: event `i` has the id
    /// `00000000-0000-0000-0000-00000000000i` (counting from 1).
    pub events: usize,
    /// Statuses configured as delivered besides 2xx.
    pub delivered_statuses: Vec<u16>,
}

impl ReceiverAnswer {
    /// Read an answer from fuzzer bytes: 2 bytes of status, a flag byte (bit 0: truncated,
    /// bits 1-3: events - 1, bits 4-5: how many delivered statuses follow, 2 bytes each),
    /// then text: `Name: value` header lines up to an empty line, then the body.
    pub fn from_bytes(data: &[u8]) -> ReceiverAnswer {
        let byte = |i: usize| data.get(i).copied().unwrap_or(0);
        let word = |i: usize| u16::from_be_bytes([byte(i), byte(i + 1)]);
        let flags = byte(2);
        let statuses = usize::from((flags >> 4) & 3);
        let delivered_statuses = (0..statuses).map(|k| word(3 + 2 * k)).collect();
        let rest = data.get(3 + 2 * statuses..).unwrap_or_default();
        let (head, body) = match rest.windows(2).position(|w| w == b"\n\n") {
            Some(i) => (&rest[..i], &rest[i + 2..]),
            None => (&[][..], rest),
        };
        let headers = head
            .split(|b| *b == b'\n')
            .filter_map(|line| {
                let colon = line.iter().position(|b| *b == b':')?;
                let value = &line[colon + 1..];
                let value = value.strip_prefix(b" ").unwrap_or(value);
                Some((line[..colon].to_vec(), value.to_vec()))
            })
            .collect();
        ReceiverAnswer {
            status: word(0),
            headers,
            body: body.to_vec(),
            truncated: flags & 1 == 1,
            events: usize::from((flags >> 1) & 7) + 1,
            delivered_statuses,
        }
    }
}

/// The id of event `i` (from 0) of a request.
pub(crate) fn event_id(i: usize) -> Uuid {
    Uuid::from_u128(i as u128 + 1)
}

/// Feed `answer` to the HTTP publisher's outcome parser, as the answer to one event and as the
/// answer to a batch request, and check:
///
/// - an event is delivered only when the receiver acknowledged it: a delivered status for the
///   whole request, or (batch, 2xx) a result for the event's id with a delivered status in a
///   body that was read whole;
/// - an event whose only result in a well-formed batch answer has a delivered status is
///   delivered (what the receiver acknowledged is not sent again for nothing);
/// - every other outcome is a failure whose `Retry-After` is at most the cap, that is a retry
///   exactly for 408, 425, 429 and 5xx, and whose stored reason holds neither of the URL's
///   secrets nor more of the receiver's text than the limit.
///
/// # Panics
/// When one of those invariants does not hold.
pub fn check_receiver_answer(answer: &ReceiverAnswer) {
    let config = HttpConfig {
        delivered_statuses: answer.delivered_statuses.clone(),
        max_reason_bytes: MAX_REASON_BYTES,
        max_retry_after: MAX_RETRY_AFTER,
        batch: Some(MAX_EVENTS),
        ..HttpConfig::default()
    };
    let publisher = HttpPublisher::new(URL, config).expect("the target's URL is valid");
    let delivered =
        |status: u16| (200..300).contains(&status) || answer.delivered_statuses.contains(&status);
    // The client only hands over statuses of three digits and headers it could parse.
    let status = 100 + answer.status % 900;
    let mut headers = HeaderMap::new();
    for (name, value) in &answer.headers {
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            headers.append(name, value);
        }
    }

    // One event per request.
    let single = publisher.single_outcome(
        event_id(0),
        status,
        &headers,
        &answer.body,
        answer.truncated,
    );
    match &single {
        Ok(()) => assert!(delivered(status), "HTTP {status} taken as delivered"),
        Err(failure) => {
            assert!(!delivered(status), "HTTP {status} not taken as delivered");
            check_failure(failure, Some(status));
        }
    }

    // A batch request.
    let events = answer.events.clamp(1, MAX_EVENTS);
    let ids: Vec<Uuid> = (0..events).map(event_id).collect();
    let outcomes = publisher.batch_outcomes(&ids, status, &headers, &answer.body, answer.truncated);
    assert_eq!(outcomes.len(), ids.len(), "one outcome per event");
    let whole = (200..300).contains(&status);
    let results = if whole && !answer.truncated {
        acknowledged_items(&answer.body)
    } else {
        None
    };
    let typed = serde_json::from_slice::<crate::publish::http::BatchResponse>(&answer.body);
    for (id, outcome) in ids.iter().zip(&outcomes) {
        let items: Vec<u64> = results
            .iter()
            .flatten()
            .filter(|(item_id, _)| item_id == id)
            .map(|(_, item_status)| *item_status)
            .collect();
        let acknowledged = if whole {
            items
                .iter()
                .any(|s| u16::try_from(*s).is_ok_and(&delivered))
        } else {
            delivered(status)
        };
        match outcome {
            Ok(()) => assert!(
                acknowledged,
                "event {id} delivered, but the receiver did not acknowledge it (HTTP {status}): {:?}",
                String::from_utf8_lossy(&answer.body)
            ),
            Err(failure) => {
                let all_acknowledge = !items.is_empty()
                    && items
                        .iter()
                        .all(|s| u16::try_from(*s).is_ok_and(&delivered));
                assert!(
                    !(whole && typed.is_ok() && !answer.truncated && all_acknowledge),
                    "event {id} acknowledged but not delivered: {failure:?}"
                );
                assert!(
                    whole || !delivered(status),
                    "HTTP {status} acknowledges all"
                );
                check_failure(failure, None);
            }
        }
    }
}

/// The (id, status) of every item of a `{"results": [...]}` document, read without the
/// publisher's types: `None` when the body is not such a document.
fn acknowledged_items(body: &[u8]) -> Option<Vec<(Uuid, u64)>> {
    let document: serde_json::Value = serde_json::from_slice(body).ok()?;
    let results = document.get("results")?.as_array()?;
    Some(
        results
            .iter()
            .filter_map(|item| {
                let id = Uuid::parse_str(item.get("id")?.as_str()?).ok()?;
                Some((id, item.get("status")?.as_u64()?))
            })
            .collect(),
    )
}

/// The invariants of every failure. `status`: the status that decided it, when known.
fn check_failure(failure: &HandlerError, status: Option<u16>) {
    let reason = failure.stored_reason();
    for secret in SECRETS {
        assert!(!reason.contains(secret), "a secret in the reason: {reason}");
    }
    if let Some(detail) = &failure.detail {
        assert!(
            detail.len() <= MAX_REASON_BYTES + " [truncated]".len(),
            "{} bytes of the receiver's text kept: {detail:?}",
            detail.len()
        );
    }
    match failure.kind {
        FailureKind::Retry { after } => {
            assert!(
                after.is_none_or(|after| after <= MAX_RETRY_AFTER),
                "asked to wait {after:?}"
            );
            if let Some(status) = status {
                assert!(
                    matches!(status, 408 | 425 | 429 | 500..=599),
                    "HTTP {status} retried"
                );
            }
        }
        FailureKind::Permanent => {
            if let Some(status) = status {
                assert!(
                    !matches!(status, 408 | 425 | 429 | 500..=599),
                    "HTTP {status} made permanent"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;

    fn statuses() -> impl Strategy<Value = u16> {
        prop_oneof![
            proptest::sample::select(vec![
                100u16, 200, 204, 207, 299, 301, 302, 400, 404, 408, 409, 410, 422, 425, 429, 500,
                502, 503, 599, 600, 999
            ]),
            any::<u16>(),
        ]
    }

    fn header_lines() -> impl Strategy<Value = Vec<(Vec<u8>, Vec<u8>)>> {
        let retry_after = "[0-9]{1,25}|[ -~]{0,30}|(Mon|Sun), [0-9]{1,2} (Jan|Dec) [0-9]{1,6} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT";
        let date =
            "(Mon|Sun), [0-9]{1,2} (Jan|Dec) [0-9]{1,6} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT|[ -~]{0,30}";
        let line = prop_oneof![
            retry_after.prop_map(|v| (b"Retry-After".to_vec(), v.into_bytes())),
            date.prop_map(|v| (b"Date".to_vec(), v.into_bytes())),
            (
                "[A-Za-z-]{1,12}",
                proptest::collection::vec(any::<u8>(), 0..20)
            )
                .prop_map(|(n, v)| (n.into_bytes(), v)),
        ];
        proptest::collection::vec(line, 0..4)
    }

    /// Text a receiver might put in an error: the URL's secrets, whole or cut, multi-byte
    /// characters, anything.
    fn receiver_text() -> impl Strategy<Value = String> {
        prop_oneof![
            "(pa55w0rd-x|t0k3n-y|pa55|t0k|pa55w0rd%2Dx|é|😀|[ -~]){0,30}",
            "\\PC{0,80}",
        ]
    }

    /// A batch document: results for some of the events (by index; out of range indexes are
    /// ids the request did not carry), with statuses, delays and errors of every kind.
    fn batch_body() -> impl Strategy<Value = Vec<u8>> {
        let item = (
            0usize..10,
            prop_oneof![
                statuses().prop_map(Value::from),
                Just(json!(70000)),
                Just(json!("200")),
                Just(json!(200.0))
            ],
            proptest::option::of(prop_oneof![
                any::<u64>().prop_map(Value::from),
                Just(json!(-1))
            ]),
            proptest::option::of(receiver_text()),
        )
            .prop_map(|(index, status, retry_after, error)| {
                let mut item = json!({"id": event_id(index).to_string(), "status": status});
                if let Some(after) = retry_after {
                    item["retry_after"] = after;
                }
                if let Some(error) = error {
                    item["error"] = Value::String(error);
                }
                item
            });
        (
            proptest::collection::vec(item, 0..10),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(items, extra_field, cut)| {
                let mut document = json!({"results": items});
                if extra_field {
                    document["more"] = json!(1);
                }
                let mut bytes = serde_json::to_vec(&document).unwrap();
                if cut {
                    bytes.truncate(bytes.len() / 2);
                }
                bytes
            })
    }

    fn answers() -> impl Strategy<Value = ReceiverAnswer> {
        (
            statuses(),
            header_lines(),
            prop_oneof![
                batch_body(),
                receiver_text().prop_map(String::into_bytes),
                proptest::collection::vec(any::<u8>(), 0..100),
            ],
            any::<bool>(),
            1usize..=MAX_EVENTS,
            proptest::collection::vec(statuses(), 0..3),
        )
            .prop_map(
                |(status, headers, body, truncated, events, delivered_statuses)| {
                    ReceiverAnswer {
                        // The target maps the status with `100 + status % 900`: undo it for the
                        // statuses chosen on purpose.
                        status: status.wrapping_sub(100),
                        headers,
                        body,
                        truncated,
                        events,
                        delivered_statuses,
                    }
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::fuzz_targets::proptest_cases()))]

        #[test]
        fn any_receiver_answer_keeps_the_contract(answer in answers()) {
            check_receiver_answer(&answer);
        }

        #[test]
        fn any_bytes_keep_the_contract(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            check_receiver_answer(&ReceiverAnswer::from_bytes(&data));
        }
    }

    #[test]
    fn a_batch_answer_delivers_only_what_it_acknowledges() {
        // The invariant the target guards, on one answer by hand: event 1 acknowledged, event 2
        // refused, event 3 missing.
        let body = json!({"results": [
            {"id": event_id(0).to_string(), "status": 200},
            {"id": event_id(1).to_string(), "status": 422, "error": "bad pa55w0rd-x"},
        ]});
        let answer = ReceiverAnswer {
            status: 100, // 200 after the target's mapping
            headers: Vec::new(),
            body: serde_json::to_vec(&body).unwrap(),
            truncated: false,
            events: 3,
            delivered_statuses: Vec::new(),
        };
        check_receiver_answer(&answer);
        let publisher = HttpPublisher::new(URL, HttpConfig::default()).unwrap();
        let ids: Vec<Uuid> = (0..3).map(event_id).collect();
        let outcomes = publisher.batch_outcomes(&ids, 200, &HeaderMap::new(), &answer.body, false);
        assert!(outcomes[0].is_ok());
        let refused = outcomes[1].as_ref().unwrap_err();
        assert!(refused.is_permanent());
        assert!(
            refused.stored_reason().ends_with("bad [redacted]"),
            "{refused:?}"
        );
        assert!(!outcomes[2].as_ref().unwrap_err().is_permanent());
    }

    #[test]
    fn from_bytes_reads_status_flags_headers_and_body() {
        let mut data = vec![0x01, 0x2c, 0b0001_0101, 0x01, 0x99];
        data.extend_from_slice(b"Retry-After: 5\nX: y\n\nbody");
        let answer = ReceiverAnswer::from_bytes(&data);
        assert_eq!(answer.status, 300);
        assert!(answer.truncated);
        assert_eq!(answer.events, 3);
        assert_eq!(answer.delivered_statuses, vec![0x0199]);
        assert_eq!(
            answer.headers,
            vec![
                (b"Retry-After".to_vec(), b"5".to_vec()),
                (b"X".to_vec(), b"y".to_vec())
            ]
        );
        assert_eq!(answer.body, b"body");
    }
}

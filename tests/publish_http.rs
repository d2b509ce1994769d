//! The HTTP publisher against a real receiver on loopback (axum, using the inbox). Events are
//! claimed with the Store and settled as the worker settles them; every test checks both the
//! outbox row and what the receiver recorded.

mod adapters_support;

use std::time::Duration;

use adapters_support::{
    LEASE, OrderShipped, Receiver, Settled, Step, TRACEPARENT, UrlSecrets, attempt, base64,
    captured_logs, claim, closed_port, enqueue, exhaust_with_a_worker, numbered_attempt, row,
    status, wait_until,
};
use outbox_runtime::delivery::FailureKind;
use outbox_runtime::inbox::{self, ApplyOutcome};
use outbox_runtime::publish::Envelope;
use outbox_runtime::publish::http::{HttpConfig, HttpPublisher, RequestHeader};
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::{Delivery, Sink, Store};
use tokio_util::sync::CancellationToken;

fn publisher(url: &str, timeout: Duration) -> HttpPublisher {
    let publisher = HttpPublisher::new(
        url,
        HttpConfig {
            timeout,
            ..HttpConfig::default()
        },
    )
    .unwrap();
    publisher
        .check_lease(LEASE)
        .expect("the test lease outlasts the request timeout");
    publisher
}

fn header<'a>(seen: &'a adapters_support::Seen, name: &str) -> Option<&'a str> {
    seen.headers.get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn delivers_the_envelope_with_the_stable_key_and_metadata_headers() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let receiver = Receiver::start(db.pool(), vec![]).await;
    let sink = publisher(&receiver.url("/events"), Duration::from_secs(5));
    let (event_id, event) = enqueue(db.pool(), "first", 10).await;

    let (outcome, settled) = attempt(&store, &sink).await;

    assert_eq!(outcome, Ok(()));
    assert_eq!(settled, Settled::Delivered);
    assert_eq!(status(db.pool(), event_id).await, "delivered");
    let seen = receiver.seen();
    assert_eq!(seen.len(), 1);
    let request = &seen[0];
    assert_eq!(
        request.idempotency_key.as_deref(),
        Some(event_id.to_string().as_str())
    );
    assert_eq!(header(request, "content-type"), Some("application/json"));
    assert_eq!(
        header(request, "outbox-event-id"),
        Some(event_id.to_string().as_str())
    );
    assert_eq!(
        header(request, "outbox-event-type"),
        Some("test.order_shipped")
    );
    assert_eq!(header(request, "outbox-event-version"), Some("3"));
    assert_eq!(header(request, "outbox-attempt"), Some("1"));
    assert_eq!(header(request, "outbox-aggregate-type"), Some("order"));
    assert_eq!(
        header(request, "outbox-aggregate-id"),
        Some(event.order_id.to_string().as_str())
    );
    assert_eq!(header(request, "outbox-aggregate-version"), Some("7"));
    assert_eq!(header(request, "traceparent"), Some(TRACEPARENT));
    let envelope: &Envelope = request.envelope.as_ref().unwrap();
    assert_eq!(envelope.id, event_id);
    assert_eq!(envelope.event_type, "test.order_shipped");
    assert_eq!(envelope.version, 3);
    assert_eq!(
        envelope.aggregate.as_ref().map(|a| a.id.clone()),
        Some(event.order_id.to_string())
    );
    assert_eq!(
        serde_json::from_value::<OrderShipped>(envelope.payload.clone()).unwrap(),
        event
    );
    assert_eq!(receiver.effects(event_id).await, 1);
}

/// The receiver applies the event, then its answer never reaches the publisher (held beyond the
/// client's timeout). The retry carries the same key; the receiver's inbox recognises it.
#[tokio::test]
async fn a_lost_response_is_retried_with_the_same_key_and_applied_once() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let receiver = Receiver::start(
        db.pool(),
        vec![Step::ApplyThenStall(Duration::from_secs(3))],
    )
    .await;
    let sink = publisher(&receiver.url("/events"), Duration::from_millis(500));
    let (event_id, _) = enqueue(db.pool(), "lost", 10).await;

    let (first, settled) = attempt(&store, &sink).await;
    let err = first.unwrap_err();
    assert_eq!(err.kind, FailureKind::Retry { after: None });
    assert!(
        err.stored_reason().contains("no response from")
            && err.stored_reason().contains("same Idempotency-Key"),
        "{err}"
    );
    assert_eq!(settled, Settled::Rescheduled);
    // The receiver records a request once its effect committed.
    wait_until(
        "the receiver recorded the request",
        Duration::from_secs(10),
        || async { !receiver.seen().is_empty() },
    )
    .await;
    let after_first = row(db.pool(), event_id).await;
    assert_eq!(
        (after_first.status.as_str(), after_first.handler_failures),
        ("pending", 1)
    );
    assert_eq!(
        receiver.effects(event_id).await,
        1,
        "the receiver applied it although the publisher timed out"
    );

    let (second, settled, number) = numbered_attempt(&store, &sink).await;
    assert_eq!(second, Ok(()), "409 for a known key counts as delivered");
    assert_eq!((settled, number), (Settled::Delivered, 2));

    let seen = receiver.seen();
    assert_eq!(seen.len(), 2);
    let key = event_id.to_string();
    assert!(
        seen.iter()
            .all(|s| s.idempotency_key.as_deref() == Some(key.as_str())),
        "same key on both attempts"
    );
    assert_eq!(header(&seen[0], "outbox-attempt"), Some("1"));
    assert_eq!(header(&seen[1], "outbox-attempt"), Some("2"));
    assert_eq!(seen[1].answered, 409, "the receiver recognised the key");
    assert_eq!(
        receiver.effects(event_id).await,
        1,
        "one effect for two deliveries"
    );
    assert_eq!(status(db.pool(), event_id).await, "delivered");
}

#[tokio::test]
async fn a_500_then_200_ends_delivered_after_two_attempts() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let receiver = Receiver::start(
        db.pool(),
        vec![Step::respond(500, "database unavailable"), Step::Apply],
    )
    .await;
    let sink = publisher(&receiver.url("/events"), Duration::from_secs(5));
    let (event_id, _) = enqueue(db.pool(), "flaky", 10).await;

    let (first, settled) = attempt(&store, &sink).await;
    let err = first.unwrap_err();
    assert!(!err.is_permanent());
    assert!(
        err.stored_reason()
            .contains("HTTP 500 Internal Server Error")
            && err.stored_reason().contains("database unavailable"),
        "{err}"
    );
    assert_eq!(settled, Settled::Rescheduled);
    assert_eq!(receiver.effects(event_id).await, 0);
    let waiting = row(db.pool(), event_id).await;
    assert_eq!(
        (
            waiting.status.as_str(),
            waiting.attempts,
            waiting.handler_failures
        ),
        ("pending", 1, 1)
    );

    let (second, settled, number) = numbered_attempt(&store, &sink).await;
    assert_eq!(second, Ok(()));
    assert_eq!((settled, number), (Settled::Delivered, 2));
    assert_eq!(status(db.pool(), event_id).await, "delivered");
    let answered: Vec<u16> = receiver.seen().iter().map(|s| s.answered).collect();
    assert_eq!(answered, vec![500, 200]);
    assert_eq!(receiver.effects(event_id).await, 1);
}

#[tokio::test]
async fn a_400_ends_exhausted_with_the_bounded_body_as_reason() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let body = format!(
        "invalid total_cents: must be positive. {}",
        "details ".repeat(1000)
    );
    let receiver = Receiver::start(db.pool(), vec![Step::respond(400, &body)]).await;
    let sink = publisher(&receiver.url("/events"), Duration::from_secs(5));
    let (event_id, _) = enqueue(db.pool(), "bad", 10).await;

    let (outcome, settled) = attempt(&store, &sink).await;

    assert!(outcome.unwrap_err().is_permanent());
    assert_eq!(settled, Settled::Exhausted);
    let exhausted = row(db.pool(), event_id).await;
    assert_eq!(exhausted.status, "exhausted");
    assert_eq!(exhausted.attempts, 1, "a permanent failure is not retried");
    let reason = exhausted.last_error.unwrap();
    assert!(
        reason.starts_with("HTTP 400 Bad Request from http://127.0.0.1:"),
        "{reason}"
    );
    assert!(
        reason.contains("invalid total_cents: must be positive"),
        "{reason}"
    );
    assert!(
        reason.ends_with("[truncated]") && reason.len() < 2048 + 200,
        "bounded: {} bytes",
        reason.len()
    );
    claim(&store, 0).await;
    assert_eq!(receiver.seen().len(), 1);
    assert_eq!(receiver.effects(event_id).await, 0);
}

#[tokio::test]
async fn an_unreachable_receiver_retries_and_never_loses_the_event() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let port = closed_port();
    // Credentials and a token in the URL must never reach the stored reason.
    let url = format!("http://user:secret@127.0.0.1:{port}/events?token=abc");
    let sink = publisher(&url, Duration::from_secs(2));
    let (event_id, _) = enqueue(db.pool(), "patient", 10).await;

    for n in 1..=3 {
        let (outcome, settled) = attempt(&store, &sink).await;
        let err = outcome.unwrap_err();
        assert!(!err.is_permanent());
        assert!(
            err.stored_reason()
                .contains("cannot connect to http://127.0.0.1:"),
            "{err}"
        );
        assert!(
            !err.stored_reason().contains("secret") && !err.stored_reason().contains("token"),
            "{err}"
        );
        assert_eq!(settled, Settled::Rescheduled);
        let r = row(db.pool(), event_id).await;
        assert_eq!(
            (r.status.as_str(), r.attempts, r.handler_failures, r.ready),
            ("pending", n, n, true)
        );
    }

    // The receiver comes up where it was expected: the event is still there and gets through.
    let receiver = Receiver::start_on(port, db.pool(), vec![]).await;
    assert_eq!(receiver.total_effects().await, 0);
    let (outcome, settled, number) = numbered_attempt(&store, &sink).await;
    assert_eq!(outcome, Ok(()));
    assert_eq!((settled, number), (Settled::Delivered, 4));
    assert_eq!(status(db.pool(), event_id).await, "delivered");
    assert_eq!(receiver.seen().len(), 1);
    assert_eq!(receiver.effects(event_id).await, 1);
}

#[tokio::test]
async fn a_429_is_retried_no_earlier_than_its_retry_after() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let too_many = Step::Respond {
        status: 429,
        body: "slow down".into(),
        retry_after: Some("1".into()),
    };
    let receiver = Receiver::start(db.pool(), vec![too_many]).await;
    let sink = publisher(&receiver.url("/events"), Duration::from_secs(5));
    let (event_id, _) = enqueue(db.pool(), "throttled", 10).await;

    let (outcome, settled) = attempt(&store, &sink).await;
    assert_eq!(
        outcome.unwrap_err().kind,
        FailureKind::Retry {
            after: Some(Duration::from_secs(1))
        }
    );
    assert_eq!(settled, Settled::Rescheduled);
    let waiting = row(db.pool(), event_id).await;
    assert_eq!(waiting.status, "pending");
    assert_eq!(
        waiting.scheduled_delay_ms, 1000,
        "not claimable before Retry-After"
    );

    // Once the database clock passes Retry-After, the event is claimable and delivered.
    wait_until(
        "the event claimable after Retry-After",
        Duration::from_secs(10),
        || async { row(db.pool(), event_id).await.ready },
    )
    .await;
    let (outcome, settled) = attempt(&store, &sink).await;
    assert_eq!(outcome, Ok(()));
    assert_eq!(settled, Settled::Delivered);
    let answered: Vec<u16> = receiver.seen().iter().map(|s| s.answered).collect();
    assert_eq!(answered, vec![429, 200]);
    assert_eq!(receiver.effects(event_id).await, 1);
}

#[tokio::test]
async fn statuses_outside_the_delivered_set_are_failures() {
    // With 409 removed from the delivered set, a receiver's "already processed" is a permanent
    // failure: the set is the publisher's documented contract with its receiver.
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let receiver = Receiver::start(db.pool(), vec![Step::respond(409, "conflict")]).await;
    let config = HttpConfig {
        delivered_statuses: vec![],
        ..HttpConfig::default()
    };
    let sink = HttpPublisher::new(&receiver.url("/events"), config).unwrap();
    let (event_id, _) = enqueue(db.pool(), "strict", 10).await;

    let (outcome, settled) = attempt(&store, &sink).await;

    assert!(
        outcome
            .unwrap_err()
            .stored_reason()
            .contains("HTTP 409 Conflict")
    );
    assert_eq!(settled, Settled::Exhausted);
    assert_eq!(receiver.seen()[0].answered, 409);
    assert_eq!(receiver.effects(event_id).await, 0);
}

/// A receiver that applies the event and then closes the connection without answering (it
/// crashed mid-response, a proxy cut it): a raw TCP server, since a well-behaved HTTP server
/// always answers. The second connection gets a real answer.
#[tokio::test]
async fn a_connection_dropped_after_the_effect_is_retried_and_applied_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    // Reuse the receiver's table and inbox consumer, without its HTTP server.
    let recorder = Receiver::start(db.pool(), vec![]).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let pool = db.pool().clone();
    let server = tokio::spawn(async move {
        let mut keys = Vec::new();
        for connection in 0..2 {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            // Read the headers, then Content-Length bytes of body.
            let (head_end, length) = loop {
                let n = socket.read(&mut buf).await.unwrap();
                assert!(n > 0, "the client closed before the end of the headers");
                request.extend_from_slice(&buf[..n]);
                if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&request[..end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map(|v| v.trim().parse().unwrap())
                        .unwrap();
                    break (end + 4, length);
                }
            };
            while request.len() < head_end + length {
                let n = socket.read(&mut buf).await.unwrap();
                assert!(n > 0, "the client closed before the end of the body");
                request.extend_from_slice(&buf[..n]);
            }
            let head = String::from_utf8_lossy(&request[..head_end]).to_ascii_lowercase();
            keys.push(
                head.lines()
                    .find_map(|l| l.strip_prefix("idempotency-key:"))
                    .map(|v| v.trim().to_owned()),
            );
            let envelope: Envelope =
                serde_json::from_slice(&request[head_end..head_end + length]).unwrap();
            let mut tx = pool.begin().await.unwrap();
            let outcome =
                inbox::apply_once(&mut tx, adapters_support::RECEIVER_CONSUMER, envelope.id)
                    .await
                    .unwrap();
            if outcome == ApplyOutcome::Applied {
                sqlx::query("INSERT INTO receiver_effects (event_id, total_cents) VALUES ($1, 0)")
                    .bind(envelope.id)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
            }
            tx.commit().await.unwrap();
            if connection == 0 {
                drop(socket); // applied, and no answer at all
            } else {
                let status = if outcome == ApplyOutcome::Applied {
                    "200 OK"
                } else {
                    "409 Conflict"
                };
                let answer =
                    format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                socket.write_all(answer.as_bytes()).await.unwrap();
                socket.shutdown().await.unwrap();
            }
        }
        keys
    });
    let sink = publisher(&format!("http://{addr}/events"), Duration::from_secs(5));
    let (event_id, _) = enqueue(db.pool(), "cut", 10).await;

    let (first, settled) = attempt(&store, &sink).await;
    let err = first.unwrap_err();
    assert!(!err.is_permanent(), "{err}");
    assert!(
        err.stored_reason()
            .contains("the receiver may have applied the event"),
        "{err}"
    );
    assert_eq!(settled, Settled::Rescheduled);
    let waiting = row(db.pool(), event_id).await;
    assert_eq!(
        (
            waiting.status.as_str(),
            waiting.attempts,
            waiting.handler_failures
        ),
        ("pending", 1, 1)
    );
    let (second, settled, number) = numbered_attempt(&store, &sink).await;
    assert_eq!(second, Ok(()), "409 for the known key");
    assert_eq!((settled, number), (Settled::Delivered, 2));

    let keys = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the hand-written server saw both connections")
        .unwrap();
    let key = event_id.to_string();
    assert_eq!(keys, vec![Some(key.clone()), Some(key)]);
    assert_eq!(recorder.effects(event_id).await, 1);
    assert_eq!(status(db.pool(), event_id).await, "delivered");
}

/// When the worker loses the lease (or shutdown's deadline passes) it cancels the delivery's
/// `lease_lost` token: a request not yet sent is not sent, one in flight is abandoned.
#[tokio::test]
async fn a_lost_lease_abandons_the_request() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let receiver = Receiver::start(
        db.pool(),
        vec![Step::ApplyThenStall(Duration::from_secs(3))],
    )
    .await;
    let sink = publisher(&receiver.url("/events"), Duration::from_secs(10));
    let (event_id, _) = enqueue(db.pool(), "orphaned", 10).await;

    // Lost before sending: nothing is sent.
    let (event, _) = claim(&store, 1).await.pop().unwrap();
    let lost = CancellationToken::new();
    lost.cancel();
    let outcome = sink.deliver(&event, &Delivery::new(&event, lost)).await;
    assert!(
        outcome
            .as_ref()
            .unwrap_err()
            .stored_reason()
            .contains("the lease was lost"),
        "{outcome:?}"
    );
    assert!(
        receiver.seen().is_empty(),
        "no request after the lease was lost"
    );
    assert_eq!(
        adapters_support::settle(&store, &event, &outcome).await,
        Settled::Rescheduled
    );

    // Lost while the receiver holds the request: abandoned (the receiver would answer 200 after 3 s).
    let (event, _) = claim(&store, 1).await.pop().unwrap();
    let lost = CancellationToken::new();
    let delivery = Delivery::new(&event, lost.clone());
    let cancel_when_seen = async {
        wait_until(
            "the receiver holding the request",
            Duration::from_secs(10),
            || async { !receiver.seen().is_empty() },
        )
        .await;
        lost.cancel();
    };
    let (outcome, ()) = tokio::join!(sink.deliver(&event, &delivery), cancel_when_seen);
    assert!(
        outcome
            .as_ref()
            .unwrap_err()
            .stored_reason()
            .contains("the lease was lost"),
        "{outcome:?}"
    );
    assert_eq!(
        adapters_support::settle(&store, &event, &outcome).await,
        Settled::Rescheduled
    );
    assert_eq!(
        receiver.effects(event_id).await,
        1,
        "the receiver applied it before the answer was abandoned"
    );

    // The next attempt finds the key known.
    let (outcome, settled) = attempt(&store, &sink).await;
    assert_eq!(outcome, Ok(()));
    assert_eq!(settled, Settled::Delivered);
    assert_eq!(
        receiver
            .seen()
            .iter()
            .map(|s| s.answered)
            .collect::<Vec<_>>(),
        vec![200, 409]
    );
    assert_eq!(receiver.effects(event_id).await, 1);
}

/// A receiver that answers 3xx, 4xx and 5xx with a page repeating the target URL and each of
/// its secrets (raw and percent-encoded): neither `last_error`, nor the publisher's `Debug`,
/// nor any log line holds a secret; the body's harmless part is kept (bounded) and logged at
/// DEBUG.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_pages_repeating_the_url_leak_no_credentials() {
    let logs = captured_logs();
    let db = TestDatabase::new().await;
    let secrets = UrlSecrets::new();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], closed_port()));
    let url = secrets.url("http", &addr.to_string(), "/events");
    let marker = format!("page-{}", uuid::Uuid::new_v4().simple());
    let body = secrets.body(&url, &marker);
    let script = [302, 404, 503]
        .into_iter()
        .map(|status| Step::respond(status, &body))
        .collect();
    let receiver = Receiver::start_on(addr.port(), db.pool(), script).await;
    let sink = publisher(&url, Duration::from_secs(5));
    let shown = format!("{sink:?}");
    secrets.assert_absent(&shown, "Debug of the publisher");
    assert!(shown.contains(&format!("http://{addr}/events")), "{shown}");

    let mut ids = Vec::new();
    for note in ["a", "b", "c"] {
        ids.push(enqueue(db.pool(), note, 1).await.0);
    }
    let reasons = exhaust_with_a_worker(db.pool(), sink, &ids).await;

    let mut statuses: Vec<u16> = receiver.seen().iter().map(|s| s.answered).collect();
    statuses.sort_unstable();
    assert_eq!(statuses, vec![302, 404, 503]);
    for status in [
        "HTTP 302 Found",
        "HTTP 404 Not Found",
        "HTTP 503 Service Unavailable",
    ] {
        assert!(
            reasons.iter().any(|r| r.starts_with(status)),
            "{status} in {reasons:?}"
        );
    }
    for reason in &reasons {
        secrets.assert_absent(reason, "last_error");
        assert!(
            reason.contains(&marker) && reason.contains("[redacted]"),
            "the body's harmless part is kept: {reason}"
        );
        assert!(
            reason.len() <= 2048 + 200,
            "bounded: {} bytes",
            reason.len()
        );
    }
    let text = logs.text();
    secrets.assert_absent(&text, "the log");
    assert!(
        text.lines()
            .any(|l| l.contains("DEBUG") && l.contains(&marker)),
        "the receiver's body is logged at DEBUG"
    );
    // One record per timestamped line (a body's line breaks continue its record): no record
    // above DEBUG repeats the body, not even the worker's "delivery failed" line.
    let mut records: Vec<String> = Vec::new();
    for line in text.lines() {
        let starts_record = line.len() > 4 && line[..4].chars().all(|c| c.is_ascii_digit());
        match records.last_mut() {
            Some(record) if !starts_record => {
                record.push('\n');
                record.push_str(line);
            }
            _ => records.push(line.to_owned()),
        }
    }
    let loud: Vec<&String> = records
        .iter()
        .filter(|r| r.contains(&marker))
        .filter(|r| {
            [" INFO ", " WARN ", " ERROR "]
                .iter()
                .any(|level| r.contains(level))
        })
        .collect();
    assert!(
        loud.is_empty(),
        "the receiver's body reached a log record above DEBUG: {loud:?}"
    );
}

/// Every spelling of `secret` a receiver's page could hold: raw, percent-encoded (either hex
/// case) and base64-encoded.
fn spellings(secret: &str) -> [String; 4] {
    [
        secret.to_owned(),
        adapters_support::encode(secret),
        adapters_support::encode_lower(secret),
        base64(secret.as_bytes()).trim_end_matches('=').to_owned(),
    ]
}

/// Panic when `text` holds any spelling of any of `secrets`.
fn assert_none_of(secrets: &[&str], text: &str, context: &str) {
    for secret in secrets {
        for spelling in spellings(secret) {
            assert!(
                !text.contains(&spelling),
                "{context} holds {spelling:?} (a spelling of {secret:?}): {text}"
            );
        }
    }
}

/// The `Authorization: Basic base64(user:password)` the HTTP client sends for a URL with
/// userinfo, echoed by a receiver in its error page (as sent, percent-encoded in a query string,
/// and inside a base64-encoded header dump): `last_error` and the log hold neither the header
/// nor the credentials it carries, decoded or encoded; the rest of the page is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_echoing_the_authorization_header_leaks_no_credentials() {
    let logs = captured_logs();
    let db = TestDatabase::new().await;
    let secrets = UrlSecrets::new();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], closed_port()));
    let url = secrets.url("http", &addr.to_string(), "/events");
    let receiver = Receiver::start_on(addr.port(), db.pool(), vec![Step::EchoHeaders(400)]).await;
    let sink = publisher(&url, Duration::from_secs(5));
    let (event_id, _) = enqueue(db.pool(), "echo", 1).await;

    let reasons = exhaust_with_a_worker(db.pool(), sink, &[event_id]).await;

    let seen = receiver.seen();
    let sent = header(&seen[0], "authorization").expect("the client sent Basic credentials");
    let token = sent.strip_prefix("Basic ").expect("a Basic credential");
    let credentials = format!("{}:{}", secrets.user, secrets.password);
    assert_eq!(
        token,
        base64(credentials.as_bytes()),
        "what the client sends"
    );
    let secret_texts = [sent, token, &credentials, &secrets.password];
    let reason = &reasons[0];
    assert!(reason.starts_with("HTTP 400 Bad Request"), "{reason}");
    assert!(
        reason.contains("request headers:") && reason.contains(&event_id.to_string()),
        "the rest of the page is kept: {reason}"
    );
    assert_none_of(&secret_texts, reason, "last_error");
    secrets.assert_absent(reason, "last_error");
    assert_none_of(&secret_texts, &logs.text(), "the log");
}

/// Headers configured on the publisher: a secret one (an API key) never shows in `Debug`, in
/// `last_error` or in the log, in any spelling, when a receiver echoes it; a plain one (a
/// tenant) is shown and kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_echoing_a_secret_header_leaks_it_nowhere() {
    let logs = captured_logs();
    let db = TestDatabase::new().await;
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let key = format!("key/{}+=%", &unique[..16]);
    let tenant = format!("tenant-{}", &unique[16..24]);
    let receiver = Receiver::start(db.pool(), vec![Step::EchoHeaders(422)]).await;
    let sink = HttpPublisher::new(
        &receiver.url("/events"),
        HttpConfig {
            headers: vec![
                RequestHeader::secret("X-Api-Key", &key),
                RequestHeader::new("X-Tenant", &tenant),
            ],
            ..HttpConfig::default()
        },
    )
    .unwrap();
    let shown = format!("{sink:?}");
    assert_none_of(&[&key], &shown, "Debug of the publisher");
    assert!(shown.contains(&tenant), "{shown}");
    let (event_id, _) = enqueue(db.pool(), "echo", 1).await;

    let reasons = exhaust_with_a_worker(db.pool(), sink, &[event_id]).await;

    let seen = receiver.seen();
    assert_eq!(
        header(&seen[0], "x-api-key"),
        Some(key.as_str()),
        "the key was sent"
    );
    assert_eq!(header(&seen[0], "x-tenant"), Some(tenant.as_str()));
    let reason = &reasons[0];
    assert!(
        reason.starts_with("HTTP 422 Unprocessable Entity"),
        "{reason}"
    );
    assert!(
        reason.contains(&tenant),
        "the plain header is kept: {reason}"
    );
    assert_none_of(&[&key], reason, "last_error");
    assert_none_of(&[&key], &logs.text(), "the log");
}

/// The body is cut to `max_reason_bytes` after redaction: a secret across the cut is replaced
/// whole, never kept in part.
#[tokio::test]
async fn a_secret_across_the_reason_limit_is_not_kept_in_part() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let secrets = UrlSecrets::new();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], closed_port()));
    let url = secrets.url("http", &addr.to_string(), "/events");
    // The password starts 4 bytes before the limit.
    let body = format!("{}{}", "x".repeat(60), secrets.password);
    let _receiver =
        Receiver::start_on(addr.port(), db.pool(), vec![Step::respond(422, &body)]).await;
    let sink = HttpPublisher::new(
        &url,
        HttpConfig {
            max_reason_bytes: 64,
            ..HttpConfig::default()
        },
    )
    .unwrap();
    enqueue(db.pool(), "cut", 1).await;

    let (outcome, settled) = attempt(&store, &sink).await;
    assert_eq!(settled, Settled::Exhausted);
    let reason = outcome.unwrap_err().stored_reason();
    assert!(reason.ends_with(" [truncated]"), "{reason}");
    assert!(
        !reason.contains(&secrets.password[..4]),
        "no start of the password at the cut: {reason}"
    );
}

/// Connection refused: reqwest's error names the URL; the reason and the logs must not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_leaks_no_credentials() {
    let logs = captured_logs();
    let db = TestDatabase::new().await;
    let secrets = UrlSecrets::new();
    let url = secrets.url("http", &format!("127.0.0.1:{}", closed_port()), "/events");
    let sink = publisher(&url, Duration::from_secs(5));
    let (event_id, _) = enqueue(db.pool(), "refused", 1).await;

    let reasons = exhaust_with_a_worker(db.pool(), sink, &[event_id]).await;

    assert!(
        reasons[0].contains("cannot connect to http://127.0.0.1:"),
        "{}",
        reasons[0]
    );
    secrets.assert_absent(&reasons[0], "last_error");
    secrets.assert_absent(&logs.text(), "the log");
    let unparsable = HttpPublisher::new(&url.replace("127.0.0.1", "[::1"), HttpConfig::default())
        .unwrap_err()
        .to_string();
    assert!(
        unparsable.contains("is not a valid receiver URL"),
        "{unparsable}"
    );
    secrets.assert_absent(&unparsable, "the configuration error");
    let not_http = HttpPublisher::new(&url.replace("http://", "ftp://"), HttpConfig::default())
        .unwrap_err()
        .to_string();
    secrets.assert_absent(&not_http, "the configuration error");
}

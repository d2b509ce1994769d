//! The NATS JetStream publisher against the real server (127.0.0.1:4222 or `NATS_URL`; these
//! tests fail, never skip, without one: start it with `nats-server -js`). Each test uses a
//! stream and a subject prefix of its own. What the receiver recorded is the stream's content.

mod adapters_support;
mod brokers_support;

use std::collections::HashSet;
use std::time::Duration;

use adapters_support::{
    LEASE, OrderShipped, Settled, TRACEPARENT, UrlSecrets, attempt, captured_logs, claim,
    closed_port, enqueue, exhaust_with_a_worker, nats, numbered_attempt, row, settle, status,
    wait_until,
};
use async_nats::jetstream;
use brokers_support::proxy::{Framing, Proxy};
use outbox_runtime::publish::Envelope;
use outbox_runtime::publish::nats::{NatsConfig, NatsPublisher, NatsStats};
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::worker::{RetryPolicy, Worker};
use outbox_runtime::{HandlerError, Sink, Store};

/// A publisher with a unique subject prefix, and (when `with_stream`) a stream of its own with
/// a two-minute duplicate window. Delete the stream with [`Fixture::cleanup`].
struct Fixture {
    publisher: NatsPublisher,
    stream: String,
}

impl Fixture {
    async fn new(with_stream: bool) -> Fixture {
        let unique = uuid::Uuid::new_v4().simple().to_string();
        let config = NatsConfig {
            subject_prefix: format!("t{unique}"),
            ack_timeout: Duration::from_secs(5),
            ..NatsConfig::default()
        };
        let publisher = NatsPublisher::new(nats().await, config).unwrap();
        publisher.check_lease(LEASE).unwrap();
        let fixture = Fixture {
            publisher,
            stream: format!("OUTBOX_TEST_{}", unique.to_uppercase()),
        };
        if with_stream {
            fixture.create_stream().await;
        }
        fixture
    }

    async fn create_stream(&self) {
        self.publisher
            .ensure_stream(&self.stream, Duration::from_secs(120))
            .await
            .unwrap();
    }

    async fn stream(&self) -> jetstream::stream::Stream {
        self.publisher
            .jetstream()
            .get_stream(&self.stream)
            .await
            .unwrap()
    }

    async fn messages(&self) -> u64 {
        self.stream().await.info().await.unwrap().state.messages
    }

    async fn cleanup(self) {
        let _ = self.publisher.jetstream().delete_stream(&self.stream).await;
    }
}

#[tokio::test]
async fn the_duplicate_window_drops_a_redelivered_event() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let fx = Fixture::new(true).await;
    let (event_id, event) = enqueue(db.pool(), "once", 10).await;

    // First attempt: the stream stores it, but the worker never records it (its acknowledgement
    // was "lost"), so the event is claimed again.
    let mut claimed = claim(&store, 1).await;
    let (first, delivery) = claimed.pop().unwrap();
    assert_eq!(fx.publisher.deliver(&first, &delivery).await, Ok(()));
    assert_eq!(
        settle(&store, &first, &Err(HandlerError::retry("ack lost"))).await,
        Settled::Rescheduled
    );

    // Second attempt: the same Nats-Msg-Id inside the window; the duplicate ack counts as delivered.
    let (second, settled, number) = numbered_attempt(&store, &fx.publisher).await;
    assert_eq!(second, Ok(()));
    assert_eq!((settled, number), (Settled::Delivered, 2));

    assert_eq!(
        fx.messages().await,
        1,
        "two publishes of one event, one message in the stream"
    );
    assert_eq!(
        fx.publisher.stats(),
        NatsStats {
            stored: 1,
            duplicates: 1
        }
    );
    assert_eq!(status(db.pool(), event_id).await, "delivered");

    // The stored message: its subject, headers and envelope.
    let message = fx.stream().await.get_raw_message(1).await.unwrap();
    assert_eq!(
        message.subject.as_str(),
        format!(
            "{}.test.order_shipped",
            fx.publisher.config().subject_prefix
        )
    );
    let header = |name: &str| message.headers.get(name).map(|v| v.as_str().to_owned());
    assert_eq!(header("Nats-Msg-Id"), Some(event_id.to_string()));
    assert_eq!(header("Outbox-Event-Id"), Some(event_id.to_string()));
    assert_eq!(
        header("Outbox-Event-Type").as_deref(),
        Some("test.order_shipped")
    );
    assert_eq!(header("Outbox-Event-Version").as_deref(), Some("3"));
    assert_eq!(
        header("Outbox-Attempt").as_deref(),
        Some("1"),
        "the stored copy is the first attempt's"
    );
    assert_eq!(header("Outbox-Aggregate-Type").as_deref(), Some("order"));
    assert_eq!(
        header("Outbox-Aggregate-Id"),
        Some(event.order_id.to_string())
    );
    assert_eq!(header("Outbox-Aggregate-Version").as_deref(), Some("7"));
    assert_eq!(header("traceparent").as_deref(), Some(TRACEPARENT));
    let envelope: Envelope = serde_json::from_slice(&message.payload).unwrap();
    assert_eq!(envelope.id, event_id);
    assert_eq!(
        serde_json::from_value::<OrderShipped>(envelope.payload).unwrap(),
        event
    );
    fx.cleanup().await;
}

#[tokio::test]
async fn distinct_events_are_distinct_messages() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let fx = Fixture::new(true).await;
    let mut ids = HashSet::new();
    for _ in 0..3 {
        ids.insert(enqueue(db.pool(), "many", 10).await.0);
    }

    let items = claim(&store, 3).await;
    let results = fx.publisher.deliver_batch(&items).await;
    for ((event, _), result) in items.iter().zip(&results) {
        assert_eq!(settle(&store, event, result).await, Settled::Delivered);
    }

    assert_eq!(fx.messages().await, 3);
    let stream = fx.stream().await;
    let mut stored = HashSet::new();
    for seq in 1..=3 {
        let message = stream.get_raw_message(seq).await.unwrap();
        stored.insert(
            message
                .headers
                .get("Nats-Msg-Id")
                .unwrap()
                .as_str()
                .parse::<uuid::Uuid>()
                .unwrap(),
        );
    }
    assert_eq!(stored, ids);
    assert_eq!(
        fx.publisher.stats(),
        NatsStats {
            stored: 3,
            duplicates: 0
        }
    );
    fx.cleanup().await;
}

#[tokio::test]
async fn a_subject_without_a_stream_is_retried_until_the_stream_exists() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let fx = Fixture::new(false).await;
    let (event_id, _) = enqueue(db.pool(), "early", 10).await;

    let (outcome, settled) = attempt(&store, &fx.publisher).await;
    let err = outcome.unwrap_err();
    assert!(!err.is_permanent());
    assert!(
        err.message.contains("no JetStream stream captures subject"),
        "{err}"
    );
    assert_eq!(settled, Settled::Rescheduled);
    let waiting = row(db.pool(), event_id).await;
    assert_eq!(
        (waiting.status.as_str(), waiting.handler_failures),
        ("pending", 1)
    );

    fx.create_stream().await;
    assert_eq!(
        fx.messages().await,
        0,
        "nothing reached the stream before it existed"
    );
    let (outcome, settled) = attempt(&store, &fx.publisher).await;
    assert_eq!(outcome, Ok(()));
    assert_eq!(settled, Settled::Delivered);
    assert_eq!(fx.messages().await, 1);
    fx.cleanup().await;
}

#[tokio::test]
async fn connecting_to_no_server_says_how_to_start_one() {
    let port = adapters_support::closed_port();
    let config = NatsConfig {
        ack_timeout: Duration::from_secs(2),
        ..NatsConfig::default()
    };
    let err = NatsPublisher::connect(&format!("nats://127.0.0.1:{port}"), config)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot connect to NATS") && err.contains("nats-server -js"),
        "{err}"
    );
}

/// A subject a core NATS subscriber listens on, with no stream: the publish reaches the
/// subscriber (which never acknowledges), so no JetStream acknowledgement ever comes. Without
/// an acknowledgement the event is not delivered: it is retried, never lost.
#[tokio::test]
async fn a_missing_acknowledgement_is_a_retry_within_the_ack_timeout() {
    use futures::StreamExt;

    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let config = NatsConfig {
        subject_prefix: format!("t{unique}"),
        ack_timeout: Duration::from_millis(500),
        ..NatsConfig::default()
    };
    let client = nats().await;
    let publisher = NatsPublisher::new(client.clone(), config).unwrap();
    let mut silent = client.subscribe(publisher.subject_filter()).await.unwrap();
    client.flush().await.unwrap();
    let (event_id, _) = enqueue(db.pool(), "unacked", 10).await;

    let (outcome, settled) = attempt(&store, &publisher).await;

    let err = outcome.unwrap_err();
    assert!(!err.is_permanent());
    assert!(
        err.message.contains("no JetStream acknowledgement") && err.message.contains("500ms"),
        "{err}"
    );
    assert_eq!(settled, Settled::Rescheduled);
    let r = row(db.pool(), event_id).await;
    assert_eq!((r.status.as_str(), r.handler_failures), ("pending", 1));
    // What the (silent) receiver got: the message, with the event id as Nats-Msg-Id.
    let got = tokio::time::timeout(Duration::from_secs(5), silent.next())
        .await
        .unwrap()
        .unwrap();
    let headers = got.headers.unwrap();
    assert_eq!(
        headers.get("Nats-Msg-Id").map(|v| v.as_str().to_owned()),
        Some(event_id.to_string())
    );
    assert_eq!(
        publisher.stats(),
        NatsStats {
            stored: 0,
            duplicates: 0
        }
    );
}

/// A server URL with a user, a password and a query: none of them appears in the error of a
/// failed connection, in the publisher's `Debug`, in a failure reason or in the logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_in_the_server_url_leak_nowhere() {
    let logs = captured_logs();
    let secrets = UrlSecrets::new();
    let config = || NatsConfig {
        subject_prefix: format!("t{}", uuid::Uuid::new_v4().simple()),
        ack_timeout: Duration::from_secs(2),
        ..NatsConfig::default()
    };

    let refused = secrets.url("nats", &format!("127.0.0.1:{}", closed_port()), "");
    let err = NatsPublisher::connect(&refused, config())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot connect to NATS at nats://127.0.0.1:"),
        "{err}"
    );
    secrets.assert_absent(&err, "the connection error");

    // The test server has no authorization configured, so it ignores the credentials.
    let server = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let host_port = server.rsplit(['/', '@']).next().unwrap().to_owned();
    let publisher = NatsPublisher::connect(&secrets.url("nats", &host_port, ""), config())
        .await
        .unwrap();
    publisher.check_lease(LEASE).unwrap();
    let shown = format!("{publisher:?}");
    secrets.assert_absent(&shown, "Debug of the publisher");
    assert!(shown.contains(&format!("nats://{host_port}")), "{shown}");

    // No stream captures the subject: the failure reason is recorded.
    let db = TestDatabase::new().await;
    let (event_id, _) = enqueue(db.pool(), "nostream", 1).await;
    let reasons = exhaust_with_a_worker(db.pool(), publisher, &[event_id]).await;
    assert!(
        reasons[0].contains("no JetStream stream captures subject"),
        "{}",
        reasons[0]
    );
    secrets.assert_absent(&reasons[0], "last_error");
    secrets.assert_absent(&logs.text(), "the log");
}

/// The proxy needs no cut points in NATS traffic: it only counts and refuses connections.
struct NoCuts;

impl Framing for NoCuts {
    fn starts(&mut self, _chunk: &[u8]) -> Vec<usize> {
        Vec::new()
    }
}

/// A 20 s outage at a worker concurrency of 16 with a short retry policy, the server behind a
/// proxy that accepts every connection and closes it at once (so each attempt is counted). The
/// client reconnects one attempt at a time, spaced by `NatsConfig::reconnect`: fewer than 50
/// attempts in the 20 s. No event is charged more attempts than the retry policy allows, and
/// once the server is back every event is in the stream once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_costs_few_connection_attempts_and_loses_nothing() {
    const OUTAGE: Duration = Duration::from_secs(20);
    let db = TestDatabase::new().await;
    let server = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let upstream = tokio::net::lookup_host(server.trim_start_matches("nats://"))
        .await
        .unwrap()
        .next()
        .unwrap();
    let proxy = Proxy::start(upstream, || Box::new(NoCuts)).await;
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let config = NatsConfig {
        subject_prefix: format!("t{unique}"),
        ack_timeout: Duration::from_secs(2),
        ..NatsConfig::default()
    };
    let publisher = NatsPublisher::connect(&format!("nats://127.0.0.1:{}", proxy.port()), config)
        .await
        .unwrap();
    let stream = format!("OUTBOX_TEST_{}", unique.to_uppercase());
    publisher
        .ensure_stream(&stream, Duration::from_secs(120))
        .await
        .unwrap();
    let policy = RetryPolicy {
        base: Duration::from_millis(50),
        max: Duration::from_millis(500),
        jitter: false,
    };
    let worker = Worker::builder(db.pool().clone(), publisher.clone())
        .lease(Duration::from_secs(30))
        .concurrency(16)
        .poll_interval(Duration::from_millis(20))
        .retry(policy)
        .start()
        .await
        .unwrap();
    let mut ids = vec![enqueue(db.pool(), "before", 1000).await.0];
    wait_until(
        "the first event delivered",
        Duration::from_secs(30),
        || async { status(db.pool(), ids[0]).await == "delivered" },
    )
    .await;

    let (attempts, during, rows) = brokers_support::outage_of(db.pool(), &proxy, OUTAGE, 1).await;

    assert!(
        attempts < 50,
        "{attempts} connection attempts during a {OUTAGE:?} outage"
    );
    assert!(attempts >= 3, "the client kept trying: {attempts} attempts");
    let mut elapsed = Duration::ZERO;
    let mut allowed = 1;
    while elapsed <= OUTAGE + Duration::from_secs(2) {
        elapsed += policy.delay_for(allowed);
        allowed += 1;
    }
    for r in &rows {
        assert_ne!(r.status, "delivered", "delivered during the outage: {r:?}");
        assert!(
            i64::from(r.attempts) <= i64::from(allowed),
            "charged more attempts than the retry policy allows ({allowed}): {r:?}"
        );
    }

    ids.extend(&during);
    wait_until(
        "every event delivered after the server came back",
        Duration::from_secs(60),
        || async {
            for id in &ids {
                if status(db.pool(), *id).await != "delivered" {
                    return false;
                }
            }
            true
        },
    )
    .await;
    worker.shutdown().await;
    let stored = publisher
        .jetstream()
        .get_stream(&stream)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .messages;
    assert_eq!(stored, 41, "every event once in the stream");
    let _ = publisher.jetstream().delete_stream(&stream).await;
}

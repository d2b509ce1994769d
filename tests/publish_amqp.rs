//! The RabbitMQ publisher against the real broker (127.0.0.1:5672 guest/guest, or `AMQP_URL`;
//! these tests fail, never skip, without one). Each test uses an exchange and queues of its
//! own. Faults go through a TCP proxy in front of the broker ([`brokers_support::proxy`]): the
//! machine's RabbitMQ is never stopped, but the publisher's connection to it really dies.
//!
//! What the receiver recorded is what the queues hold, and what the ledger consumer
//! (`examples/amqp_consumer/consumer.rs`) applied through the inbox.

mod adapters_support;
mod brokers_support;
#[path = "../examples/amqp_consumer/consumer.rs"]
mod consumer;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use adapters_support::{
    LEASE, OrderShipped, Settled, TRACEPARENT, attempt, captured_logs, claim, closed_port, enqueue,
    exhaust_with_a_worker, row, settle, status, wait_until,
};
use brokers_support::{amqp_proxy, amqp_url, amqp_url_via, queue_len, rabbit};
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ExchangeKind};
use outbox_runtime::publish::Envelope;
use outbox_runtime::publish::amqp::{AmqpConfig, AmqpPublisher, AmqpStats, RoutingKey, Unroutable};
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::worker::{RetryPolicy, Worker};
use outbox_runtime::{HandlerError, Sink, Store};
use uuid::Uuid;

/// An exchange of the test's own with two queues bound to every routing key: `queue` for the
/// ledger consumer, `audit` for the test to read messages from.
struct Fixture {
    connection: Connection,
    channel: Channel,
    exchange: String,
    queue: String,
    audit: String,
}

impl Fixture {
    async fn new() -> Fixture {
        let unique = Uuid::new_v4().simple().to_string();
        let connection = rabbit().await;
        let channel = connection.create_channel().await.unwrap();
        let fixture = Fixture {
            connection,
            channel,
            exchange: format!("outbox.test.{unique}"),
            queue: format!("outbox-test-ledger-{unique}"),
            audit: format!("outbox-test-audit-{unique}"),
        };
        fixture
            .channel
            .exchange_declare(
                &fixture.exchange,
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        for queue in [&fixture.queue, &fixture.audit] {
            consumer::declare_queue(&fixture.channel, queue, &fixture.exchange, "#")
                .await
                .unwrap();
        }
        fixture
    }

    fn config(&self) -> AmqpConfig {
        AmqpConfig {
            exchange: self.exchange.clone(),
            confirm_timeout: Duration::from_secs(3),
            ..AmqpConfig::default()
        }
    }

    /// A publisher straight to the broker.
    async fn publisher(&self, config: AmqpConfig) -> AmqpPublisher {
        let publisher = AmqpPublisher::connect(&amqp_url(), config).await.unwrap();
        publisher.check_lease(LEASE).unwrap();
        publisher
    }

    /// Messages ready in the audit queue.
    async fn messages(&self) -> u32 {
        queue_len(&self.channel, &self.audit).await
    }

    /// Take every message of the audit queue.
    async fn audit_messages(&self) -> Vec<lapin::message::Delivery> {
        let mut taken = Vec::new();
        while let Some(message) = self
            .channel
            .basic_get(&self.audit, BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            taken.push(message.delivery);
        }
        taken
    }

    async fn cleanup(self) {
        for queue in [&self.queue, &self.audit] {
            let _ = self
                .channel
                .queue_delete(queue, QueueDeleteOptions::default())
                .await;
        }
        let _ = self
            .channel
            .exchange_delete(&self.exchange, ExchangeDeleteOptions::default())
            .await;
        let _ = self.connection.close(200, "test done").await;
    }
}

fn header(message: &lapin::message::Delivery, name: &str) -> Option<String> {
    let headers = message.properties.headers().as_ref()?;
    match headers.inner().get(name)? {
        AMQPValue::LongString(s) => Some(s.to_string()),
        other => panic!("header {name} is not a long string: {other:?}"),
    }
}

fn message_id(message: &lapin::message::Delivery) -> Uuid {
    message
        .properties
        .message_id()
        .as_ref()
        .expect("every message has a message_id")
        .as_str()
        .parse()
        .expect("the message_id is an event id")
}

#[tokio::test]
async fn an_event_is_delivered_once_confirmed_as_a_persistent_message_with_its_id_and_headers() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let fx = Fixture::new().await;
    let publisher = fx.publisher(fx.config()).await;
    let (event_id, event) = enqueue(db.pool(), "once", 10).await;

    let (outcome, settled) = attempt(&store, &publisher).await;

    assert_eq!(outcome, Ok(()));
    assert_eq!(settled, Settled::Delivered);
    assert_eq!(status(db.pool(), event_id).await, "delivered");
    assert_eq!(
        publisher.stats(),
        AmqpStats {
            confirmed: 1,
            nacked: 0,
            returned: 0,
            links_opened: 1
        }
    );
    let messages = fx.audit_messages().await;
    assert_eq!(messages.len(), 1);
    let message = &messages[0];
    assert_eq!(message.exchange.as_str(), fx.exchange);
    assert_eq!(message.routing_key.as_str(), "test.order_shipped");
    let properties = &message.properties;
    assert_eq!(message_id(message), event_id);
    assert_eq!(*properties.delivery_mode(), Some(2), "persistent");
    assert_eq!(
        properties.content_type().as_ref().map(|s| s.as_str()),
        Some("application/json")
    );
    assert_eq!(
        properties.kind().as_ref().map(|s| s.as_str()),
        Some("test.order_shipped")
    );
    assert_eq!(
        header(message, "Outbox-Event-Id"),
        Some(event_id.to_string())
    );
    assert_eq!(
        header(message, "Outbox-Event-Type").as_deref(),
        Some("test.order_shipped")
    );
    assert_eq!(
        header(message, "Outbox-Event-Version").as_deref(),
        Some("3")
    );
    assert_eq!(header(message, "Outbox-Attempt").as_deref(), Some("1"));
    assert_eq!(
        header(message, "Outbox-Aggregate-Type").as_deref(),
        Some("order")
    );
    assert_eq!(
        header(message, "Outbox-Aggregate-Id"),
        Some(event.order_id.to_string())
    );
    assert_eq!(
        header(message, "Outbox-Aggregate-Version").as_deref(),
        Some("7")
    );
    assert_eq!(header(message, "traceparent").as_deref(), Some(TRACEPARENT));
    let envelope: Envelope = serde_json::from_slice(&message.data).unwrap();
    assert_eq!(envelope.id, event_id);
    assert_eq!(
        serde_json::from_value::<OrderShipped>(envelope.payload).unwrap(),
        event
    );
    fx.cleanup().await;
}

/// The broker takes the message, but its confirm never reaches the publisher (the proxy holds
/// the broker's answers back): without the confirm the event is not delivered. It is retried,
/// and the second copy carries the same message_id.
#[tokio::test]
async fn a_message_the_broker_took_is_not_delivered_until_its_confirm_arrives() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let fx = Fixture::new().await;
    let proxy = amqp_proxy().await;
    let config = AmqpConfig {
        confirm_timeout: Duration::from_millis(800),
        ..fx.config()
    };
    let publisher = AmqpPublisher::connect(&amqp_url_via(proxy.port()).await, config)
        .await
        .unwrap();
    let (event_id, _) = enqueue(db.pool(), "unconfirmed", 10).await;

    proxy.hold_replies();
    let (outcome, settled) = attempt(&store, &publisher).await;

    let err = outcome.unwrap_err();
    assert!(!err.is_permanent());
    assert!(
        err.message.contains("no confirm from") && err.message.contains("800ms"),
        "{err}"
    );
    assert_eq!(settled, Settled::Rescheduled);
    wait_until(
        "the broker routed the unconfirmed message",
        Duration::from_secs(10),
        || async { fx.messages().await == 1 },
    )
    .await;
    assert_eq!(row(db.pool(), event_id).await.status, "pending");
    assert_eq!(publisher.stats().confirmed, 0);

    proxy.release_replies();
    let (outcome, settled) = attempt(&store, &publisher).await;
    assert_eq!(outcome, Ok(()));
    assert_eq!(settled, Settled::Delivered);
    let messages = fx.audit_messages().await;
    assert_eq!(messages.len(), 2, "the retry published a second copy");
    assert!(messages.iter().all(|m| message_id(m) == event_id));
    assert_eq!(
        publisher.stats().links_opened,
        2,
        "a channel that missed a confirm is replaced"
    );
    fx.cleanup().await;
}

#[tokio::test]
async fn an_unroutable_message_is_retried_or_exhausted_as_configured() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let fx = Fixture::new().await;
    // A routing key no queue is bound for: the fixture binds `#` on its own exchange only, so
    // publish to a second exchange without bindings.
    let lonely = format!("{}.unbound", fx.exchange);
    let config = AmqpConfig {
        exchange: lonely.clone(),
        declare_exchange: Some(ExchangeKind::Direct),
        routing_key: RoutingKey::Prefixed("acme".into()),
        ..fx.config()
    };
    let retrying = fx.publisher(config.clone()).await;
    let (event_id, _) = enqueue(db.pool(), "nowhere", 10).await;

    let (outcome, settled) = attempt(&store, &retrying).await;
    let err = outcome.unwrap_err();
    assert!(!err.is_permanent(), "{err}");
    assert!(
        err.message.contains("312 NO_ROUTE")
            && err.message.contains(&lonely)
            && err.message.contains("acme.test.order_shipped"),
        "{err}"
    );
    assert_eq!(settled, Settled::Rescheduled);
    assert_eq!(retrying.stats().returned, 1);

    let permanent = fx
        .publisher(AmqpConfig {
            unroutable: Unroutable::Permanent,
            ..config
        })
        .await;
    let (outcome, settled) = attempt(&store, &permanent).await;
    assert!(outcome.unwrap_err().is_permanent());
    assert_eq!(settled, Settled::Exhausted);
    let r = row(db.pool(), event_id).await;
    assert_eq!(r.status, "exhausted");
    assert!(r.last_error.unwrap().contains("NO_ROUTE"));
    let _ = fx
        .channel
        .exchange_delete(&lonely, ExchangeDeleteOptions::default())
        .await;
    fx.cleanup().await;
}

/// A missing exchange is refused at start; one deleted while the publisher runs makes the
/// broker close the channel: the event is retried, and once the exchange is back the publisher
/// opens a new channel and delivers it.
#[tokio::test]
async fn a_missing_exchange_is_refused_at_start_and_retried_at_run_time() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let fx = Fixture::new().await;
    let missing = AmqpConfig {
        exchange: format!("{}.missing", fx.exchange),
        ..fx.config()
    };
    let err = AmqpPublisher::connect(&amqp_url(), missing)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(".missing` does not exist") && err.contains("rabbitmqadmin declare exchange"),
        "{err}"
    );

    let publisher = fx.publisher(fx.config()).await;
    fx.channel
        .exchange_delete(&fx.exchange, ExchangeDeleteOptions::default())
        .await
        .unwrap();
    let (event_id, _) = enqueue(db.pool(), "early", 10).await;
    let (outcome, settled) = attempt(&store, &publisher).await;
    let err = outcome.unwrap_err();
    assert!(!err.is_permanent());
    assert!(err.message.contains("does not exist"), "{err}");
    assert_eq!(settled, Settled::Rescheduled);

    // The exchange comes back (its queues lost their bindings with it).
    fx.channel
        .exchange_declare(
            &fx.exchange,
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    consumer::declare_queue(&fx.channel, &fx.audit, &fx.exchange, "#")
        .await
        .unwrap();
    let (outcome, settled) = attempt(&store, &publisher).await;
    assert_eq!(outcome, Ok(()));
    assert_eq!(settled, Settled::Delivered);
    assert_eq!(status(db.pool(), event_id).await, "delivered");
    assert_eq!(fx.messages().await, 1);
    assert_eq!(
        publisher.stats().links_opened,
        2,
        "the closed channel was replaced"
    );
    fx.cleanup().await;
}

/// A worker publishes through a proxy; the broker goes away (every connection closed, new ones
/// refused) while events keep coming, then comes back. Every event ends up delivered, in the
/// queue, and applied once by the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_then_up_loses_nothing() {
    let db = TestDatabase::new().await;
    consumer::create_schema(db.pool()).await.unwrap();
    let fx = Fixture::new().await;
    let proxy = amqp_proxy().await;
    let config = AmqpConfig {
        confirm_timeout: Duration::from_secs(2),
        ..fx.config()
    };
    let publisher = AmqpPublisher::connect(&amqp_url_via(proxy.port()).await, config)
        .await
        .unwrap();
    let worker = Worker::builder(db.pool().clone(), publisher.clone())
        .lease(Duration::from_secs(30))
        .poll_interval(Duration::from_millis(50))
        .retry(RetryPolicy {
            base: Duration::from_millis(50),
            max: Duration::from_millis(300),
            jitter: false,
        })
        .start()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(enqueue(db.pool(), "before", 100).await.0);
    }
    let all_delivered = |ids: Vec<Uuid>| {
        let pool = db.pool().clone();
        move || {
            let (pool, ids) = (pool.clone(), ids.clone());
            async move {
                for id in &ids {
                    if status(&pool, *id).await != "delivered" {
                        return false;
                    }
                }
                true
            }
        }
    };
    wait_until(
        "the first events delivered",
        Duration::from_secs(30),
        all_delivered(ids.clone()),
    )
    .await;

    proxy.down();
    let mut during = Vec::new();
    for _ in 0..5 {
        during.push(enqueue(db.pool(), "during", 100).await.0);
    }
    wait_until(
        "every event enqueued while the broker is away tried and retried",
        Duration::from_secs(30),
        || async {
            for id in &during {
                if row(db.pool(), *id).await.handler_failures < 1 {
                    return false;
                }
            }
            true
        },
    )
    .await;
    for id in &during {
        let r = row(db.pool(), *id).await;
        assert_ne!(
            r.status, "delivered",
            "delivered while the broker was away: {r:?}"
        );
        assert!(
            r.last_error.as_deref().unwrap_or("").contains("RabbitMQ"),
            "{r:?}"
        );
    }

    proxy.up().await;
    ids.extend(&during);
    wait_until(
        "every event delivered after the broker came back",
        Duration::from_secs(60),
        all_delivered(ids.clone()),
    )
    .await;
    worker.shutdown().await;
    assert!(
        publisher.stats().links_opened >= 2,
        "{:?}",
        publisher.stats()
    );

    let in_queue = queue_len(&fx.channel, &fx.queue).await;
    assert!(
        in_queue >= 10,
        "every delivered event is in the queue: {in_queue}"
    );
    let counts = consumer::consume(
        db.pool(),
        &fx.channel,
        &fx.queue,
        u64::from(in_queue),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    assert_eq!(counts.applied, 10);
    assert_eq!(counts.duplicates, u64::from(in_queue) - 10);
    let applied: BTreeSet<Uuid> = sqlx::query_scalar("SELECT event_id FROM ledger")
        .fetch_all(db.pool())
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(applied, ids.iter().copied().collect());
    fx.cleanup().await;
}

/// The most attempts an event can have within `window` under `policy` (without jitter): the
/// first at once, each next one after the policy's delay for the attempt before it.
fn attempts_allowed(policy: RetryPolicy, window: Duration) -> i32 {
    let mut elapsed = Duration::ZERO;
    let mut attempts = 1;
    loop {
        elapsed += policy.delay_for(u32::try_from(attempts).unwrap());
        if elapsed > window {
            return attempts;
        }
        attempts += 1;
    }
}

/// A 20 s outage at a worker concurrency of 16 with a short retry policy, the broker behind a
/// proxy that accepts every connection and closes it at once (so each attempt is counted).
/// Before the shared reconnect backoff every delivery opened a connection of its own: thousands
/// of attempts. Now one delivery at a time tries, with capped exponential backoff: fewer than
/// 50 attempts in the 20 s. The deliveries in between fail as retries: no event is charged
/// more attempts than the worker's retry policy allows in that time, none is exhausted, and
/// once the broker is back every event is delivered and applied once by the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_costs_few_connection_attempts_and_loses_nothing() {
    const OUTAGE: Duration = Duration::from_secs(20);
    let db = TestDatabase::new().await;
    consumer::create_schema(db.pool()).await.unwrap();
    let fx = Fixture::new().await;
    let proxy = amqp_proxy().await;
    let config = AmqpConfig {
        confirm_timeout: Duration::from_secs(2),
        ..fx.config()
    };
    let publisher = AmqpPublisher::connect(&amqp_url_via(proxy.port()).await, config)
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
    let (first, _) = enqueue(db.pool(), "before", 100).await;
    wait_until(
        "the first event delivered",
        Duration::from_secs(30),
        || async { status(db.pool(), first).await == "delivered" },
    )
    .await;

    let (attempts, during, rows) = brokers_support::outage_of(db.pool(), &proxy, OUTAGE, 2).await;

    assert!(
        attempts < 50,
        "{attempts} connection attempts during a {OUTAGE:?} outage (one per delivery, not one \
         shared reconnect with backoff)"
    );
    assert!(
        attempts >= 3,
        "the publisher kept trying during the outage: {attempts} attempts"
    );
    // The outage, plus a margin for the rows read after it.
    let allowed = attempts_allowed(policy, OUTAGE + Duration::from_secs(2));
    for r in &rows {
        assert_ne!(r.status, "delivered", "delivered during the outage: {r:?}");
        assert_ne!(r.status, "exhausted", "{r:?}");
        assert!(
            r.attempts <= allowed,
            "charged {} attempts, more than the retry policy allows in the outage ({allowed}): {r:?}",
            r.attempts
        );
        let reason = r.last_error.as_deref().unwrap_or("");
        assert!(reason.contains("RabbitMQ at amqp://127.0.0.1:"), "{r:?}");
    }
    assert!(
        rows.iter().any(|r| r
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("in a row failed"))),
        "a delivery during the backoff says so: {rows:?}"
    );

    let mut ids = vec![first];
    ids.extend(&during);
    wait_until(
        "every event delivered after the broker came back",
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
    publisher.close().await;

    let in_queue = queue_len(&fx.channel, &fx.queue).await;
    assert!(
        in_queue >= 41,
        "every delivered event is in the queue: {in_queue}"
    );
    let counts = consumer::consume(
        db.pool(),
        &fx.channel,
        &fx.queue,
        u64::from(in_queue),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    assert_eq!(counts.applied, 41);
    let applied: BTreeSet<Uuid> = sqlx::query_scalar("SELECT event_id FROM ledger")
        .fetch_all(db.pool())
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(applied, ids.iter().copied().collect());
    fx.cleanup().await;
}

/// Batch mode: twenty events published back to back, the connection killed right before the
/// ninth publish while the broker's confirms are held back. The broker has the first eight;
/// the publisher has no confirm, so all twenty are retried, and the retry sends the first
/// eight a second time under the same message ids. The ledger applies each event once.
///
/// The cut is held open until the broker shows the eight messages routed, and only then closed:
/// in one CI run the eight never all arrived when the connection closed right after the eighth
/// publish (most likely RabbitMQ dropping publishes it had received but not yet processed).
#[tokio::test]
async fn a_connection_killed_mid_batch_loses_nothing_and_the_inbox_drops_the_duplicates() {
    let db = TestDatabase::new().await;
    consumer::create_schema(db.pool()).await.unwrap();
    let store = Store::new(db.pool().clone());
    let fx = Fixture::new().await;
    let proxy = amqp_proxy().await;
    let config = AmqpConfig {
        batch: Some(20),
        ..fx.config()
    };
    let publisher = AmqpPublisher::connect(&amqp_url_via(proxy.port()).await, config)
        .await
        .unwrap();
    assert_eq!(publisher.max_batch(), 20);
    let mut ids = BTreeSet::new();
    for _ in 0..20 {
        ids.insert(enqueue(db.pool(), "batch", 10).await.0);
    }

    let items = claim(&store, 20).await;
    proxy.hold_replies();
    proxy.hold_cut();
    proxy.cut_before(8);
    let (results, ()) = tokio::join!(publisher.deliver_batch(&items), async {
        wait_until(
            "the broker routed the eight whole messages",
            Duration::from_secs(10),
            || async { fx.messages().await == 8 },
        )
        .await;
        proxy.release_cut();
    });
    assert_eq!(proxy.cuts(), 1, "the connection was cut");
    assert_eq!(results.len(), 20);
    for ((event, _), result) in items.iter().zip(&results) {
        let err = result.as_ref().unwrap_err();
        assert!(!err.is_permanent(), "{err}");
        assert_eq!(settle(&store, event, result).await, Settled::Rescheduled);
    }
    assert_eq!(
        fx.messages().await,
        8,
        "nothing after the cut reached the broker"
    );
    proxy.release_replies();

    let items = claim(&store, 20).await;
    let results = publisher.deliver_batch(&items).await;
    for ((event, _), result) in items.iter().zip(&results) {
        assert_eq!(result, &Ok(()));
        assert_eq!(settle(&store, event, result).await, Settled::Delivered);
    }
    assert_eq!(publisher.stats().confirmed, 20);

    // Each event's copies carry its id as message_id and the same envelope.
    let messages = fx.audit_messages().await;
    assert_eq!(messages.len(), 28);
    let mut copies: BTreeMap<Uuid, Vec<Envelope>> = BTreeMap::new();
    for message in &messages {
        let envelope: Envelope = serde_json::from_slice(&message.data).unwrap();
        assert_eq!(message_id(message), envelope.id);
        assert_eq!(
            header(message, "Outbox-Event-Id"),
            Some(envelope.id.to_string())
        );
        copies.entry(envelope.id).or_default().push(envelope);
    }
    assert_eq!(copies.keys().copied().collect::<BTreeSet<_>>(), ids);
    let duplicated: Vec<&Vec<Envelope>> = copies.values().filter(|c| c.len() > 1).collect();
    assert_eq!(duplicated.len(), 8);
    for pair in duplicated {
        assert_eq!(pair.len(), 2);
        assert_eq!(pair[0], pair[1]);
    }

    let counts = consumer::consume(
        db.pool(),
        &fx.channel,
        &fx.queue,
        28,
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    assert_eq!(
        (counts.applied, counts.duplicates, counts.rejected),
        (20, 8, 0)
    );
    let per_event: Vec<i64> = sqlx::query_scalar("SELECT count(*) FROM ledger GROUP BY event_id")
        .fetch_all(db.pool())
        .await
        .unwrap();
    assert_eq!(per_event, vec![1; 20], "each event applied once");
    fx.cleanup().await;
}

#[tokio::test]
async fn the_confirm_timeout_must_be_shorter_than_the_lease() {
    let db = TestDatabase::new().await;
    let fx = Fixture::new().await;
    let publisher = fx.publisher(fx.config()).await;
    let err = Worker::builder(db.pool().clone(), publisher)
        .lease(Duration::from_secs(3))
        .start()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("AMQP confirm timeout (3s) must be shorter than the worker's lease (3s)"),
        "{err}"
    );
    fx.cleanup().await;
}

#[tokio::test]
async fn connecting_to_no_broker_says_how_to_start_one() {
    let config = AmqpConfig {
        confirm_timeout: Duration::from_secs(2),
        ..AmqpConfig::default()
    };
    let url = format!("amqp://127.0.0.1:{}/%2f", closed_port());
    let err = AmqpPublisher::connect(&url, config)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot connect to RabbitMQ at amqp://127.0.0.1:")
            && err.contains("rabbitmq-server"),
        "{err}"
    );
}

/// A RabbitMQ user of this test's own, with a random name and a password that URLs
/// percent-encode, created and removed with `rabbitmqctl`.
struct BrokerUser {
    user: String,
    password: String,
}

impl BrokerUser {
    async fn create() -> BrokerUser {
        let unique = Uuid::new_v4().simple().to_string();
        let user = BrokerUser {
            user: format!("svc{}", &unique[..10]),
            password: format!("pw:{}/x y@z", &unique[10..20]),
        };
        rabbitmqctl(&["add_user", &user.user, &user.password]).await;
        rabbitmqctl(&["set_permissions", "-p", "/", &user.user, ".*", ".*", ".*"]).await;
        user
    }

    fn url(&self, host_port: &str, password: &str) -> String {
        format!(
            "amqp://{}:{}@{host_port}/%2f",
            adapters_support::encode(&self.user),
            adapters_support::encode(password)
        )
    }

    fn assert_absent(&self, text: &str, context: &str) {
        for s in [&self.user, &self.password] {
            for spelling in [
                s.clone(),
                adapters_support::encode(s),
                adapters_support::encode_lower(s),
            ] {
                assert!(
                    !text.contains(&spelling),
                    "{context} holds the secret {spelling:?}: {text}"
                );
            }
        }
    }

    async fn delete(self) {
        rabbitmqctl(&["delete_user", &self.user]).await;
    }
}

async fn rabbitmqctl(args: &[&str]) {
    let run = tokio::process::Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("rabbitmqctl answered within 60 s")
        .expect("running rabbitmqctl (installed with rabbitmq-server)");
    assert!(
        output.status.success(),
        "rabbitmqctl {} failed: {}",
        args[0],
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The user and password of the broker URL appear in no connection error (refused, or
/// refused credentials), in no `Debug` output, failure reason or log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_in_the_broker_url_leak_nowhere() {
    let logs = captured_logs();
    let user = BrokerUser::create().await;
    let fx = Fixture::new().await;
    let broker = brokers_support::amqp_addr().await;
    let host_port = format!("127.0.0.1:{}", broker.port());
    let config = || AmqpConfig {
        exchange: fx.exchange.clone(),
        confirm_timeout: Duration::from_secs(3),
        routing_key: RoutingKey::Fixed("nowhere".into()),
        ..AmqpConfig::default()
    };

    let refused = AmqpPublisher::connect(
        &user.url(&format!("127.0.0.1:{}", closed_port()), &user.password),
        config(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        refused.contains("cannot connect to RabbitMQ at amqp://127.0.0.1:"),
        "{refused}"
    );
    user.assert_absent(&refused, "the refused connection's error");

    let wrong = AmqpPublisher::connect(&user.url(&host_port, "not-the-password"), config())
        .await
        .unwrap_err()
        .to_string();
    assert!(wrong.contains("cannot connect to RabbitMQ"), "{wrong}");
    user.assert_absent(&wrong, "the refused login's error");

    let publisher = AmqpPublisher::connect(&user.url(&host_port, &user.password), config())
        .await
        .unwrap();
    let shown = format!("{publisher:?}");
    user.assert_absent(&shown, "Debug of the publisher");
    assert!(
        shown.contains(&format!("amqp://{host_port}/%2f")),
        "{shown}"
    );

    // Unbind the fixture's queues: nothing takes the message, and the reason is recorded.
    for queue in [&fx.queue, &fx.audit] {
        fx.channel
            .queue_unbind(queue, &fx.exchange, "#", FieldTable::default())
            .await
            .unwrap();
    }
    let db = TestDatabase::new().await;
    let (event_id, _) = enqueue(db.pool(), "nobody", 1).await;
    let reasons = exhaust_with_a_worker(db.pool(), publisher, &[event_id]).await;
    assert!(reasons[0].contains("NO_ROUTE"), "{}", reasons[0]);
    user.assert_absent(&reasons[0], "last_error");
    user.assert_absent(&logs.text(), "the log");
    user.delete().await;
    fx.cleanup().await;
}

/// Batch mode keeps every event's own outcome: an event that can never be published (its
/// name, stored by an older release, makes a routing key over AMQP's limit) is exhausted, its
/// neighbours in the batch are delivered.
#[tokio::test]
async fn a_batch_reports_each_event_on_its_own() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let fx = Fixture::new().await;
    let publisher = fx
        .publisher(AmqpConfig {
            batch: Some(10),
            ..fx.config()
        })
        .await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(enqueue(db.pool(), "fine", 10).await.0);
    }
    sqlx::query("UPDATE outbox SET event_type = repeat('x', 300) WHERE event_id = $1")
        .bind(ids[1])
        .execute(db.pool())
        .await
        .unwrap();
    let items = claim(&store, 3).await;
    let results = publisher.deliver_batch(&items).await;
    assert_eq!(results.len(), 3);
    for ((event, _), result) in items.iter().zip(&results) {
        if event.event_id == ids[1] {
            let err = result.as_ref().unwrap_err();
            assert!(
                err.is_permanent() && err.message.contains("over AMQP's limit"),
                "{err}"
            );
            assert_eq!(settle(&store, event, result).await, Settled::Exhausted);
        } else {
            assert_eq!(result, &Ok::<(), HandlerError>(()));
            assert_eq!(settle(&store, event, result).await, Settled::Delivered);
        }
    }
    assert_eq!(fx.messages().await, 2);
    fx.cleanup().await;
}

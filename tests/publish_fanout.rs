//! FanOut to NATS JetStream and an HTTP receiver: when one member fails, the event is retried
//! for both, and each receiver's deduplication keeps it to one message and one effect.
//! Needs NATS (`nats-server -js`), like `publish_nats.rs`.

mod adapters_support;

use std::time::Duration;

use adapters_support::{
    LEASE, Receiver, Settled, Step, attempt, enqueue, nats, numbered_attempt, status,
};
use outbox_runtime::Store;
use outbox_runtime::publish::FanOut;
use outbox_runtime::publish::http::{HttpConfig, HttpPublisher};
use outbox_runtime::publish::nats::{NatsConfig, NatsPublisher, NatsStats};
use outbox_runtime::testing::TestDatabase;

#[tokio::test]
async fn a_failing_member_retries_the_event_for_all_and_each_receiver_keeps_one_copy() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let stream = format!("OUTBOX_TEST_{}", unique.to_uppercase());
    let nats_config = NatsConfig {
        subject_prefix: format!("t{unique}"),
        ack_timeout: Duration::from_secs(5),
        ..NatsConfig::default()
    };
    let broker = NatsPublisher::new(nats().await, nats_config).unwrap();
    broker
        .ensure_stream(&stream, Duration::from_secs(120))
        .await
        .unwrap();
    let receiver = Receiver::start(
        db.pool(),
        vec![Step::respond(503, "warming up"), Step::Apply],
    )
    .await;
    let webhook = HttpPublisher::new(&receiver.url("/events"), HttpConfig::default()).unwrap();
    webhook.check_lease(LEASE).unwrap();
    let sink = FanOut::new().to("nats", broker.clone()).to("http", webhook);
    let (event_id, _) = enqueue(db.pool(), "both", 10).await;

    let (first, settled) = attempt(&store, &sink).await;
    let err = first.unwrap_err();
    // The receiver's body is the detail: stored, but not part of the logged message.
    assert!(!err.message.contains("warming up"), "{}", err.message);
    assert_eq!(
        err.stored_reason(),
        format!(
            "http: HTTP 503 Service Unavailable from http://{}/events (accepted by nats, which will see it again): http: warming up",
            receiver.addr
        )
    );
    assert_eq!(settled, Settled::Rescheduled);

    let (second, settled, number) = numbered_attempt(&store, &sink).await;
    assert_eq!(second, Ok(()));
    assert_eq!((settled, number), (Settled::Delivered, 2));

    let info = broker
        .jetstream()
        .get_stream(&stream)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .messages;
    assert_eq!(info, 1, "the stream dropped the second publish");
    assert_eq!(
        broker.stats(),
        NatsStats {
            stored: 1,
            duplicates: 1
        }
    );
    let answered: Vec<u16> = receiver.seen().iter().map(|s| s.answered).collect();
    assert_eq!(answered, vec![503, 200]);
    assert_eq!(receiver.effects(event_id).await, 1);
    assert_eq!(status(db.pool(), event_id).await, "delivered");
    let _ = broker.jetstream().delete_stream(&stream).await;
}

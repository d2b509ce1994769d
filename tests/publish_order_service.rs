//! The order service example, run as a function against a real PostgreSQL (and, in the second
//! test, the real NATS server: `nats-server -js`). Checks the report it prints and the state
//! the service and its receivers left in the database.

#[path = "../examples/order_service/app.rs"]
mod app;
#[path = "../examples/order_service/billing.rs"]
mod billing;
#[path = "../examples/order_service/events.rs"]
mod events;
#[path = "../examples/order_service/orders.rs"]
mod orders;
#[path = "../examples/order_service/receiver.rs"]
mod receiver;

use app::{NatsChoice, NatsReport, Options};
use outbox_runtime::testing::TestDatabase;
use sqlx::PgPool;

/// A run that has not finished by then is stuck: the test fails instead of hanging.
const RUN_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// What the database says after a run: every order confirmed once (version 2), one shipment
/// per order, one inbox row per event, every outbox row delivered, and the event payloads
/// matching their orders.
async fn assert_database_state(pool: &PgPool, orders: i64) {
    let (confirmed, at_version_2): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'confirmed'), count(*) FILTER (WHERE version = 2) FROM orders",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        (confirmed, at_version_2),
        (orders, orders),
        "one successful confirmation per order"
    );
    let mismatched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orders o
         LEFT JOIN outbox e ON e.aggregate_id = o.id::text AND e.event_type = 'order.confirmed'
         LEFT JOIN shipments s ON s.event_id = e.event_id
         WHERE e.id IS NULL
            OR EXISTS (SELECT 1 FROM outbox_queue q WHERE q.id = e.id)
            OR e.aggregate_version <> o.version
            OR (e.payload->>'total_cents')::bigint <> o.total_cents OR s.total_cents <> o.total_cents",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        mismatched, 0,
        "each order has its delivered event and its shipment, with the same figures"
    );
    let per_order: Vec<i64> = sqlx::query_scalar(
        "SELECT count(s.id) FROM orders o LEFT JOIN shipments s ON s.order_id = o.id GROUP BY o.id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        per_order,
        vec![1; orders as usize],
        "every order shipped exactly once"
    );
    let inbox: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_inbox WHERE consumer = 'shipping'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(inbox, orders);
}

#[tokio::test]
async fn with_postgres_only_the_http_receiver_applies_every_order_once_despite_lost_responses() {
    let db = TestDatabase::new().await;
    let options = Options {
        orders: 4,
        nats: NatsChoice::Off,
        lose_responses: 2,
        keep_stream: false,
    };

    let report = tokio::time::timeout(RUN_LIMIT, app::run(db.pool(), &options))
        .await
        .expect("the order service run finished within its limit")
        .unwrap();

    assert!(report.ok(), "{report}");
    assert_eq!(
        (report.placed, report.confirmed, report.stale_rejected),
        (4, 4, 1)
    );
    assert_eq!(
        (report.events, report.delivered, report.exhausted),
        (4, 4, 0)
    );
    // Exact when nothing else times out; a loaded machine can add retries, never remove them.
    assert_eq!(report.http.lost_responses, 2);
    assert!(
        report.http.duplicates >= 2,
        "each lost response came back as a duplicate: {report}"
    );
    assert_eq!(report.http.applied, 4);
    assert!(
        report.http.requests >= 6 && report.attempts >= 6,
        "{report}"
    );
    assert_eq!(report.shipments, 4);
    assert!(matches!(report.nats, NatsReport::NotUsed(_)));
    let text = report.to_string();
    assert!(text.contains("nats  not used: switched off"), "{text}");
    assert!(text.contains(" requests, 4 applied, "), "{text}");
    assert!(
        text.contains(" duplicate(s) dropped by the inbox (2 response(s) lost on purpose"),
        "{text}"
    );
    assert!(text.ends_with("result:    OK"), "{text}");
    assert_database_state(db.pool(), 4).await;
}

#[tokio::test]
async fn with_nats_both_receivers_take_part_and_both_drop_the_redeliveries() {
    let db = TestDatabase::new().await;
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| app::LOCAL_NATS.to_owned());
    let options = Options {
        orders: 3,
        nats: NatsChoice::Url(url.clone()),
        lose_responses: 1,
        keep_stream: false,
    };

    let run = tokio::time::timeout(RUN_LIMIT, app::run(db.pool(), &options))
        .await
        .expect("the order service run finished within its limit");
    let report = match run {
        Ok(report) => report,
        Err(e) => panic!("{e} (these tests need NATS: start it with `nats-server -js`)"),
    };

    assert!(report.ok(), "{report}");
    let NatsReport::Used {
        messages,
        duplicates,
        subject,
        billing,
        replay,
        ..
    } = &report.nats
    else {
        panic!("NATS was named but not used: {report}");
    };
    assert_eq!(*messages, 3, "one message per confirmed order");
    assert!(
        *duplicates >= 1,
        "the retry after the lost HTTP response reached NATS again and was dropped"
    );
    assert!(subject.ends_with(".order.confirmed"), "{subject}");
    assert_eq!(
        (billing.received, billing.applied, billing.duplicates),
        (3, 3, 0)
    );
    assert_eq!(
        (replay.received, replay.applied, replay.duplicates),
        (3, 0, 3),
        "a replay applies nothing"
    );
    let per_order: Vec<i64> = sqlx::query_scalar(
        "SELECT count(i.id) FROM orders o LEFT JOIN invoices i ON i.order_id = o.id GROUP BY o.id",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(per_order, vec![1; 3], "every order invoiced exactly once");
    let billing_inbox: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_inbox WHERE consumer = 'billing'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(billing_inbox, 3);
    assert_eq!(report.http.applied, 3);
    assert!(report.http.duplicates >= 1, "{report}");
    let text = report.to_string();
    assert!(
        text.contains(&format!("  nats  {url}, stream ORDER_SERVICE_")),
        "{text}"
    );
    assert!(
        text.contains("nats:      3 messages in the stream, "),
        "{text}"
    );
    assert_database_state(db.pool(), 3).await;
}

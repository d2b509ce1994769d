//! The order service's shipping handler under the test kit: it passes the idempotency check
//! (through the real HTTP receiver and in process), a deliberately non-idempotent variant of it
//! is caught, and a confirmation is asserted and drained on a `#[sqlx::test]` pool.
//! `docs/testing.md` shows the first test and the variant's failure message verbatim; the last
//! test keeps them from drifting.

#[path = "../examples/order_service/events.rs"]
mod events;
#[path = "../examples/order_service/orders.rs"]
#[allow(dead_code, reason = "the example's module; these tests use part of it")]
mod orders;
#[path = "../examples/order_service/receiver.rs"]
#[allow(dead_code, reason = "the example's module; these tests use part of it")]
mod receiver;

// docs/testing.md: example begins
use events::OrderConfirmed;
use outbox_runtime::publish::http::{HttpConfig, HttpPublisher};
use outbox_runtime::testing::{TestDatabase, TestEvent, check_idempotent};
use receiver::ShippingReceiver;
use std::time::Duration;
use uuid::Uuid;

#[tokio::test]
async fn shipping_survives_redelivery() -> Result<(), Box<dyn std::error::Error>> {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    let shipping = ShippingReceiver::start(pool, 0, Duration::ZERO).await?;
    let http = HttpPublisher::new(&shipping.url(), HttpConfig::default())?;
    let events = (1..=3).map(|n| {
        let order = OrderConfirmed {
            order_id: Uuid::from_u128(n),
            order_version: 2,
            customer: "ada".into(),
            total_cents: 1_000,
        };
        TestEvent::new(order, format!("confirm-order/{n}"))
    });
    let shipped = async || -> Vec<(Uuid, i64)> {
        let sql = "SELECT order_id, count(*) FROM shipments GROUP BY 1 ORDER BY 1";
        sqlx::query_as(sql).fetch_all(pool).await.unwrap()
    };
    check_idempotent(pool, &http, events, shipped).await?;
    Ok(())
}
// docs/testing.md: example ends

use outbox_runtime::testing::{
    Faults, IdempotencyError, Injected, Outcome, Pick, assert_enqueued, drain,
};
use outbox_runtime::{Delivery, Dispatcher, HandlerError};
use sqlx::PgPool;

/// The shipping handler in process: the example's own `receiver::ship`, or the variant below.
fn shipping_handler(pool: &PgPool, with_inbox: bool) -> Dispatcher {
    let pool = pool.clone();
    Dispatcher::builder()
        .handler(move |event: OrderConfirmed, ctx: Delivery| {
            let pool = pool.clone();
            async move {
                if with_inbox {
                    receiver::ship(&pool, ctx.event_id(), &event)
                        .await
                        .map(drop)
                        .map_err(HandlerError::retry)
                } else {
                    ship_without_inbox(&pool, ctx.event_id(), &event).await
                }
            }
        })
        .build()
        .unwrap()
}

/// The deliberately non-idempotent variant: `receiver::ship` with the inbox left out, so every
/// delivery writes a shipment.
async fn ship_without_inbox(
    pool: &PgPool,
    event_id: Uuid,
    event: &OrderConfirmed,
) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO shipments (order_id, event_id, total_cents) VALUES ($1, $2, $3)")
        .bind(event.order_id)
        .bind(event_id)
        .bind(event.total_cents)
        .execute(pool)
        .await
        .map(drop)
        .map_err(HandlerError::retry)
}

async fn shipments(pool: &PgPool) -> Vec<(Uuid, i64)> {
    sqlx::query_as("SELECT order_id, count(*) FROM shipments GROUP BY 1 ORDER BY 1")
        .fetch_all(pool)
        .await
        .unwrap()
}

fn confirmed(n: u128) -> TestEvent {
    let order = OrderConfirmed {
        order_id: Uuid::from_u128(n),
        order_version: 2,
        customer: "ada".into(),
        total_cents: 1_000,
    };
    TestEvent::new(order, format!("confirm-order/{n}"))
}

#[tokio::test]
async fn the_in_process_shipping_handler_passes_and_its_variant_without_inbox_is_caught() {
    let db = TestDatabase::new().await;
    receiver::create_schema(db.pool()).await.unwrap();
    let report = check_idempotent(
        db.pool(),
        &shipping_handler(db.pool(), true),
        [confirmed(1), confirmed(2)],
        async || shipments(db.pool()).await,
    )
    .await
    .unwrap();
    assert_eq!(report.sink_calls, 8);
    assert_eq!(
        shipments(db.pool()).await,
        vec![(Uuid::from_u128(1), 1), (Uuid::from_u128(2), 1)]
    );

    let db = TestDatabase::new().await;
    receiver::create_schema(db.pool()).await.unwrap();
    let error = check_idempotent(
        db.pool(),
        &shipping_handler(db.pool(), false),
        [confirmed(1), confirmed(2)],
        async || shipments(db.pool()).await,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(error, IdempotencyError::NotIdempotent { index: 1, .. }),
        "{error}"
    );
    assert_eq!(
        error.to_string(),
        variant_failure(),
        "docs/testing.md shows this message verbatim"
    );
}

/// The variant's failure, exactly: the order ids are fixed, and the event id is derived from the
/// operation key.
fn variant_failure() -> String {
    let event_id = outbox_runtime::store::enqueue::event_id_for("outbox", "confirm-order/1");
    VARIANT_FAILURE.replace("EVENT_ID", &event_id.to_string())
}

const VARIANT_FAILURE: &str = "not idempotent: event 1 of 2 changed the observed state when it was delivered again
  event:    `order.confirmed` v1 EVENT_ID (key `confirm-order/1`)
  delivery: attempt 2, delivered again after the response to attempt 1 was lost (the sink had accepted it; no completion was written; the lease ran out and recovery handed the event back), and its own lease was lost while the sink ran
  after the first delivery: [(00000000-0000-0000-0000-000000000001, 1)]
  after this delivery:      [(00000000-0000-0000-0000-000000000001, 2)]
A handler must leave the state as one delivery does, however often the event arrives: deduplicate on `Delivery::idempotency_key()` (for example with `outbox_runtime::inbox::apply_once` in the handler's transaction).";

/// A fault plan wraps a publisher as it wraps handlers: a duplicate and a lost response reach
/// the real receiver, which applies the order once and answers the repeats with 409.
#[tokio::test]
async fn faults_through_the_http_publisher_reach_the_receiver_as_duplicates() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    let shipping = ShippingReceiver::start(pool, 0, Duration::ZERO)
        .await
        .unwrap();
    let http = HttpPublisher::new(&shipping.url(), HttpConfig::default()).unwrap();
    let order = OrderConfirmed {
        order_id: Uuid::from_u128(7),
        order_version: 2,
        customer: "ada".into(),
        total_cents: 700,
    };
    let mut tx = pool.begin().await.unwrap();
    outbox_runtime::Event::enqueue(&order, &mut tx, "confirm-order/7")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let faulty = Faults::seeded(7)
        .deliver_twice(Pick::Every)
        .lose_response(Pick::Every)
        .wrap(http);
    let report = drain(pool, &faulty).await.unwrap();
    assert_eq!(report.records.len(), 2, "{report}");
    assert_eq!(
        report.records[0].injected,
        vec![Injected::DeliveredTwice, Injected::ResponseLost],
        "{report}"
    );
    assert_eq!(report.records[1].outcome, Outcome::Completed, "{report}");
    let counts = shipping.counts();
    assert_eq!(
        (counts.requests, counts.applied, counts.duplicates),
        (3, 1, 2),
        "the duplicate and the redelivery after the lost response were both recognised"
    );
    assert_eq!(shipments(pool).await, vec![(order.order_id, 1)]);
}

/// The service's confirmation, asserted and delivered with the kit on a `#[sqlx::test]` pool.
#[sqlx::test(migrations = false)]
async fn a_confirmation_enqueues_its_event_and_a_drain_ships_it(pool: PgPool) {
    outbox_runtime::migrate(&pool).await.unwrap();
    orders::create_schema(&pool).await.unwrap();
    receiver::create_schema(&pool).await.unwrap();
    let order = orders::place_order(&pool, "ada", 4_200).await.unwrap();
    orders::confirm_order(&pool, order).await.unwrap();
    let (meta, event) = assert_enqueued::<OrderConfirmed>(&pool, |e| e.order_id == order.id).await;
    assert_eq!(
        (event.order_version, meta.operation_key),
        (2, format!("confirm-order/{}", order.id))
    );
    let report = drain(&pool, &shipping_handler(&pool, true)).await.unwrap();
    assert_eq!(report.completed(), 1, "{report}");
    assert_eq!(shipments(&pool).await, vec![(order.id, 1)]);
}

#[test]
fn docs_show_the_example_and_the_failure_verbatim() {
    let docs = include_str!("../docs/testing.md");
    let source = include_str!("order_service_idempotency.rs");
    let begin = "// docs/testing.md: example begins\n";
    let start = source.find(begin).unwrap() + begin.len();
    let end = source.find("// docs/testing.md: example ends").unwrap();
    let example = &source[start..end];
    assert!(
        example.lines().count() < 30,
        "the docs promise a test in under 30 lines"
    );
    assert!(
        docs.contains(example),
        "docs/testing.md must show the example test verbatim:\n{example}"
    );
    assert!(
        include_str!("../README.md").contains(example),
        "README.md's \"Testing your service\" must show the example test verbatim:\n{example}"
    );
    let failure = variant_failure();
    assert!(
        docs.contains(&failure),
        "docs/testing.md must show the failure verbatim:\n{failure}"
    );
}

//! Poison events never block the queue: an unknown name or version, a payload that does not
//! decode, and a handler that panics end exhausted with the reason, and good rows still flow.

mod dispatch_support;

use std::sync::Arc;

use dispatch_support::*;
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::{Delivery, Dispatcher, Event, HandlerError, Store};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// An event whose handler panics.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1)]
pub struct Explosive {
    pub fuse: u32,
}

async fn explode(event: Explosive, _ctx: Delivery) -> Result<(), HandlerError> {
    panic!("fuse {} burnt out", event.fuse);
}

#[tokio::test]
async fn poison_rows_are_exhausted_with_their_reason_and_good_rows_are_delivered() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let order_id = Uuid::new_v4();

    let unknown_version = insert_raw(
        &store,
        "k-unknown-version",
        "order.confirmed",
        9,
        serde_json::json!({}),
    )
    .await;
    let unknown_name = insert_raw(
        &store,
        "k-unknown-name",
        "parcel.lost",
        1,
        serde_json::json!({}),
    )
    .await;
    let bad_payload = insert_raw(
        &store,
        "k-bad-payload",
        "order.confirmed",
        2,
        serde_json::json!({"order_id": "not-a-uuid"}),
    )
    .await;
    let mut tx = db.pool().begin().await.unwrap();
    let panicking = Explosive { fuse: 3 }
        .enqueue(&mut tx, "k-panic")
        .await
        .unwrap();
    let good = OrderConfirmed {
        order_id,
        total_cents: 10,
        currency: "EUR".into(),
    }
    .enqueue(&mut tx, "k-good")
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let record: Record<OrderConfirmed> = Arc::default();
    let seen = Arc::clone(&record);
    let dispatcher = Dispatcher::builder()
        .handler(move |event: OrderConfirmed, ctx: Delivery| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push(Seen::new(event, &ctx));
                Ok(())
            }
        })
        .handler(explode)
        .build()
        .unwrap();

    let outcomes = deliver_ready(&store, &dispatcher).await;
    assert_eq!(
        outcomes.len(),
        5,
        "one claim took every row, poison included"
    );

    let (status, attempts, reason) = row_state(&store, unknown_version).await;
    assert_eq!((status.as_str(), attempts), ("exhausted", Some(1)));
    let reason = reason.unwrap();
    assert!(reason.contains("event `order.confirmed` version 9 is unknown to this binary, which handles versions [1, 2]"), "{reason}");

    let reason = row_state(&store, unknown_name).await.2.unwrap();
    assert!(
        reason.starts_with("no handler for event `parcel.lost` (version 1)"),
        "{reason}"
    );
    assert_eq!(row_state(&store, unknown_name).await.0, "exhausted");

    let (status, _, reason) = row_state(&store, bad_payload).await;
    assert_eq!(status, "exhausted");
    let reason = reason.unwrap();
    assert!(
        reason.contains("payload of event `order.confirmed` version 2 does not decode as"),
        "{reason}"
    );
    assert!(reason.contains("UUID"), "the serde error is kept: {reason}");

    let (status, _, reason) = row_state(&store, panicking).await;
    assert_eq!(status, "exhausted");
    let reason = reason.unwrap();
    assert!(
        reason.contains("panicked on event `explosive` version 1: fuse 3 burnt out"),
        "{reason}"
    );
    assert!(reason.contains("explode"), "names the handler: {reason}");

    assert_eq!(row_state(&store, good).await.0, "delivered");
    let seen = record.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].event_id, good);

    // Nothing is left to claim: the poison did not come back.
    assert!(deliver_ready(&store, &dispatcher).await.is_empty());
}

//! `#[handler]` functions are collected by `Dispatcher::from_inventory()`, stay callable, and
//! share the explicit builder's checks.

mod dispatch_support;

use std::sync::Mutex;

use dispatch_support::*;
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::{Delivery, Dispatcher, Event, HandlerError, Store, handler};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

static CONFIRMED: Mutex<Vec<Seen<OrderConfirmed>>> = Mutex::new(Vec::new());

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "invoice.sent", version = 1)]
pub struct InvoiceSent {
    #[outbox(aggregate_id)]
    pub invoice_id: i64,
}

#[handler]
async fn on_order_confirmed(event: OrderConfirmed, ctx: Delivery) -> Result<(), HandlerError> {
    CONFIRMED.lock().unwrap().push(Seen::new(event, &ctx));
    Ok(())
}

#[handler]
pub(crate) async fn on_invoice_sent(
    event: InvoiceSent,
    _ctx: Delivery,
) -> Result<(), HandlerError> {
    if event.invoice_id < 0 {
        return Err(HandlerError::permanent(format!(
            "invoice {} cannot exist",
            event.invoice_id
        )));
    }
    Ok(())
}

#[tokio::test]
async fn from_inventory_routes_every_handler_and_every_stored_version() {
    let dispatcher = Dispatcher::from_inventory().expect("no conflicts");
    assert_eq!(
        dispatcher.routes(),
        [
            ("invoice.sent", 1),
            ("order.confirmed", 1),
            ("order.confirmed", 2)
        ]
    );

    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let order_id = Uuid::new_v4();
    let mut tx = db.pool().begin().await.unwrap();
    let current = OrderConfirmed {
        order_id,
        total_cents: 7,
        currency: "USD".into(),
    };
    let current_id = current.enqueue(&mut tx, "inv-current").await.unwrap();
    let v1_id = outbox_runtime::store::enqueue::enqueue_event(
        &mut tx,
        &OrderConfirmedV1 {
            order_id,
            total_cents: 8,
        },
        "inv-v1",
        &Default::default(),
    )
    .await
    .unwrap();
    let bad_invoice = InvoiceSent { invoice_id: -1 }
        .enqueue(&mut tx, "inv-bad")
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let outcomes = deliver_ready(&store, &dispatcher).await;
    assert_eq!(outcomes.len(), 3);
    let seen = CONFIRMED.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!((seen[0].event_id, &seen[0].event), (current_id, &current));
    assert_eq!(
        (
            seen[1].event_id,
            seen[1].stored_version,
            seen[1].event.currency.as_str()
        ),
        (v1_id, 1, "EUR")
    );
    assert_eq!(
        row_state(&store, bad_invoice).await,
        (
            "exhausted".into(),
            Some(1),
            Some("invoice -1 cannot exist".into())
        )
    );
}

#[tokio::test]
async fn a_handler_function_is_still_an_ordinary_function() {
    let ok = on_invoice_sent(InvoiceSent { invoice_id: 3 }, dummy_delivery()).await;
    assert_eq!(ok, Ok(()));
    let err = on_invoice_sent(InvoiceSent { invoice_id: -3 }, dummy_delivery())
        .await
        .unwrap_err();
    assert!(err.is_permanent());
}

#[test]
fn the_explicit_builder_rejects_a_handler_registered_twice() {
    let err = Dispatcher::builder()
        .with_inventory_handlers()
        .handler(on_invoice_sent)
        .build()
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("event `invoice.sent` has two handlers"),
        "{msg}"
    );
    assert!(msg.contains("on_invoice_sent"), "{msg}");
}

fn dummy_delivery() -> Delivery {
    let event = outbox_runtime::store::ClaimedEvent {
        id: 1,
        event_id: Uuid::nil(),
        event_type: "invoice.sent".into(),
        event_version: 1,
        aggregate_type: None,
        aggregate_id: None,
        aggregate_version: None,
        payload: serde_json::json!({}),
        headers: serde_json::json!({}),
        claim_version: 1,
        attempts: 1,
        max_attempts: 10,
        lease_until: Default::default(),
        waited: std::time::Duration::ZERO,
        since_enqueue: std::time::Duration::ZERO,
    };
    Delivery::new(&event, Default::default())
}

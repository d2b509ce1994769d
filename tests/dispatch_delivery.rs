//! An event written with a business change, claimed, delivered through the dispatcher and
//! completed; older stored versions reach the handler upcast; handlers can ask for a retry.

mod dispatch_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dispatch_support::*;
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::{Delivery, Dispatcher, Event, HandlerError, Store};
use uuid::Uuid;

async fn orders_table(store: &Store) {
    sqlx::query("CREATE TABLE orders (id uuid PRIMARY KEY, status text NOT NULL, total_cents bigint NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
}

fn recording_dispatcher() -> (Dispatcher, Record<OrderConfirmed>) {
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
        .build()
        .expect("dispatcher");
    (dispatcher, record)
}

#[tokio::test]
async fn an_event_enqueued_with_a_business_update_reaches_the_handler() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    orders_table(&store).await;
    let order_id = Uuid::new_v4();

    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id, status, total_cents) VALUES ($1, 'confirmed', 4200)")
        .bind(order_id)
        .execute(&mut *tx)
        .await
        .unwrap();
    let event = OrderConfirmed {
        order_id,
        total_cents: 4200,
        currency: "CHF".into(),
    };
    let event_id = event
        .enqueue(&mut tx, &format!("confirm-{order_id}"))
        .await
        .expect("enqueue");
    tx.commit().await.unwrap();

    let (dispatcher, record) = recording_dispatcher();
    let outcomes = deliver_ready(&store, &dispatcher).await;
    assert_eq!(outcomes.len(), 1);
    assert!(outcomes[0].result.is_ok(), "{:?}", outcomes[0].result);

    let seen = record.lock().unwrap().clone();
    assert_eq!(
        seen,
        [Seen {
            event,
            event_id,
            attempt: 1,
            stored_version: 2,
            aggregate: Some(("order".into(), order_id.to_string())),
        }]
    );
    // Delivered: the queue row is gone, with its attempts (the one attempt is `seen` above).
    assert_eq!(
        row_state(&store, event_id).await,
        ("delivered".into(), None, None)
    );
    let status: String = sqlx::query_scalar("SELECT status FROM orders WHERE id = $1")
        .bind(order_id)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(status, "confirmed");
}

#[tokio::test]
async fn a_rolled_back_transaction_leaves_neither_the_order_nor_the_event() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    orders_table(&store).await;
    let order_id = Uuid::new_v4();

    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id, status, total_cents) VALUES ($1, 'confirmed', 1)")
        .bind(order_id)
        .execute(&mut *tx)
        .await
        .unwrap();
    OrderConfirmed {
        order_id,
        total_cents: 1,
        currency: "EUR".into(),
    }
    .enqueue(&mut tx, "rolled-back")
    .await
    .unwrap();
    tx.rollback().await.unwrap();

    let (dispatcher, record) = recording_dispatcher();
    assert!(deliver_ready(&store, &dispatcher).await.is_empty());
    assert!(record.lock().unwrap().is_empty());
    let counts: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM outbox),
                (SELECT count(*) FROM outbox_queue)",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(counts, (0, 0, 0));
}

#[tokio::test]
async fn a_stored_v1_payload_reaches_the_v2_handler_upcast() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let order_id = Uuid::new_v4();

    // Written by an older binary: the v1 type through the store's writer (the typed
    // `enqueue` only accepts current versions), and a raw v1 row.
    let mut tx = db.pool().begin().await.unwrap();
    let v1 = OrderConfirmedV1 {
        order_id,
        total_cents: 990,
    };
    let typed_id = outbox_runtime::store::enqueue::enqueue_event(
        &mut tx,
        &v1,
        "v1-typed",
        &Default::default(),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let raw_id = insert_raw(
        &store,
        "v1-raw",
        "order.confirmed",
        1,
        serde_json::json!({"order_id": order_id, "total_cents": 5}),
    )
    .await;

    let (dispatcher, record) = recording_dispatcher();
    assert_eq!(
        dispatcher.routes(),
        [("order.confirmed", 1), ("order.confirmed", 2)]
    );
    let outcomes = deliver_ready(&store, &dispatcher).await;
    assert!(outcomes.iter().all(|o| o.result.is_ok()), "{outcomes:?}");

    let seen = record.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0].event,
        OrderConfirmed {
            order_id,
            total_cents: 990,
            currency: "EUR".into()
        }
    );
    assert_eq!((seen[0].event_id, seen[0].stored_version), (typed_id, 1));
    assert_eq!(seen[1].event.total_cents, 5);
    assert_eq!((seen[1].event_id, seen[1].stored_version), (raw_id, 1));
    assert_eq!(row_state(&store, typed_id).await.0, "delivered");
    assert_eq!(row_state(&store, raw_id).await.0, "delivered");
}

#[tokio::test]
async fn a_handler_asking_for_a_retry_leaves_the_event_pending() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let calls = Arc::new(Mutex::new(0));
    let counter = Arc::clone(&calls);
    let dispatcher = Dispatcher::builder()
        .handler(move |_event: OrderConfirmed, _ctx: Delivery| {
            let counter = Arc::clone(&counter);
            async move {
                *counter.lock().unwrap() += 1;
                Err(HandlerError::retry_after(
                    "receiver busy",
                    Duration::from_secs(3600),
                ))
            }
        })
        .build()
        .unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    let id = OrderConfirmed {
        order_id: Uuid::new_v4(),
        total_cents: 1,
        currency: "EUR".into(),
    }
    .enqueue(&mut tx, "retry-me")
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let outcomes = deliver_ready(&store, &dispatcher).await;
    assert_eq!(outcomes.len(), 1);
    let err = outcomes[0].result.as_ref().unwrap_err();
    assert!(!err.is_permanent());
    assert_eq!(
        row_state(&store, id).await,
        ("pending".into(), Some(1), Some("receiver busy".into()))
    );
    // Not available again before the hour it asked for.
    assert!(deliver_ready(&store, &dispatcher).await.is_empty());
    assert_eq!(*calls.lock().unwrap(), 1);
}

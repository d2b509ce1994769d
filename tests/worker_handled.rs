//! A worker claims only what its sink can deliver: a dispatcher's worker leaves the events of
//! types and versions it has no handler for pending, uncharged and never exhausted, for the
//! worker that handles them (another service on the same table, or the next release). An
//! ordered worker keeps an aggregate's order across such an event.
//!
//! The rolling deploy with real processes is in `tests/rolling_deploy.rs`.

mod worker_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::worker::{Worker, WorkerEvent};
use outbox_runtime::{Delivery, Dispatcher, Event, HandlerError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use worker_support::*;

const WAIT: Duration = Duration::from_secs(20);

/// The event this file's dispatchers handle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "handled.order_placed", version = 1, aggregate = "order")]
struct OrderPlaced {
    #[outbox(aggregate_id)]
    order: String,
    #[outbox(aggregate_version)]
    seq: i64,
}

/// Another service's event on the same table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "handled.invoice_sent", version = 1)]
struct InvoiceSent {
    invoice: i64,
}

/// What a dispatcher's handlers saw: (event name, aggregate version or invoice number).
type Seen = Arc<Mutex<Vec<(String, i64)>>>;

fn orders_dispatcher(seen: &Seen) -> Dispatcher {
    let seen = Arc::clone(seen);
    Dispatcher::builder()
        .handler(move |event: OrderPlaced, _ctx: Delivery| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock()
                    .unwrap()
                    .push((OrderPlaced::NAME.into(), event.seq));
                Ok::<(), HandlerError>(())
            }
        })
        .build()
        .unwrap()
}

fn invoices_dispatcher(seen: &Seen) -> Dispatcher {
    let seen = Arc::clone(seen);
    Dispatcher::builder()
        .handler(move |event: InvoiceSent, _ctx: Delivery| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock()
                    .unwrap()
                    .push((InvoiceSent::NAME.into(), event.invoice));
                Ok::<(), HandlerError>(())
            }
        })
        .build()
        .unwrap()
}

async fn place(pool: &PgPool, order: &str, seq: i64) {
    let mut tx = pool.begin().await.unwrap();
    OrderPlaced {
        order: order.into(),
        seq,
    }
    .enqueue(&mut tx, &format!("place-{order}-{seq}"))
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

async fn send_invoice(pool: &PgPool, invoice: i64) {
    let mut tx = pool.begin().await.unwrap();
    InvoiceSent { invoice }
        .enqueue(&mut tx, &format!("invoice-{invoice}"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

/// An event of `handled.order_placed` version 2 of aggregate `order`, as the next release's
/// producer writes it (this binary has no type for version 2), by raw SQL with its queue row.
async fn place_v2(pool: &PgPool, order: &str, seq: i64) {
    sqlx::query(
        "WITH e AS (
             INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version,
                                 aggregate_type, aggregate_id, aggregate_version, payload)
             VALUES (gen_random_uuid(), $1, '\\x00', 'handled.order_placed', 2, 'order', $2, $3,
                     jsonb_build_object('order', $2, 'seq', $3, 'channel', 'web'))
             RETURNING id, aggregate_type, aggregate_id)
         INSERT INTO outbox_queue (id, aggregate_type, aggregate_id) SELECT id, aggregate_type, aggregate_id FROM e",
    )
    .bind(format!("place-v2-{order}-{seq}"))
    .bind(order)
    .bind(seq)
    .execute(pool)
    .await
    .unwrap();
}

/// The queue rows of `event_type` version `version`: (status, attempts, last_error).
async fn queue_of(
    pool: &PgPool,
    event_type: &str,
    version: i32,
) -> Vec<(String, i32, Option<String>)> {
    sqlx::query_as(
        "SELECT q.status, q.attempts, q.last_error
         FROM outbox_queue q JOIN outbox e ON e.id = q.id
         WHERE e.event_type = $1 AND e.event_version = $2 ORDER BY q.id",
    )
    .bind(event_type)
    .bind(version)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Wait for `n` claims that found nothing: the worker looked again after it ran dry.
async fn claims_of_nothing(rx: &mut tokio::sync::mpsc::UnboundedReceiver<WorkerEvent>, n: usize) {
    for _ in 0..n {
        wait_event(rx, WAIT, "a claim that found nothing", |e| {
            matches!(e, WorkerEvent::ClaimedNothing)
        })
        .await;
    }
}

#[tokio::test]
async fn a_worker_leaves_the_types_and_versions_it_does_not_handle_pending_and_uncharged() {
    let db = database().await;
    let pool = db.pool();
    place(pool, "o1", 1).await;
    send_invoice(pool, 7).await;
    place_v2(pool, "o2", 1).await;

    let seen = Seen::default();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::builder(pool.clone(), orders_dispatcher(&seen))
        .poll_interval(Duration::from_millis(50))
        .events(tx)
        .start()
        .await
        .unwrap();
    wait_until(WAIT, "the order is delivered", || async {
        queue_of(pool, OrderPlaced::NAME, 1).await.is_empty()
    })
    .await;
    // Three more claims after the delivery: every one of them could have taken the other two.
    claims_of_nothing(&mut rx, 3).await;
    worker.shutdown().await;

    assert_eq!(*seen.lock().unwrap(), [(OrderPlaced::NAME.to_owned(), 1)]);
    // Another service's event and a newer version: pending, no attempt, no failure recorded.
    assert_eq!(
        queue_of(pool, InvoiceSent::NAME, 1).await,
        [("pending".to_owned(), 0, None)]
    );
    assert_eq!(
        queue_of(pool, OrderPlaced::NAME, 2).await,
        [("pending".to_owned(), 0, None)]
    );
    assert_eq!(count_status(pool, "exhausted").await, 0);
}

#[tokio::test]
async fn two_services_on_one_table_each_deliver_their_own_events_and_exhaust_nothing() {
    let db = database().await;
    let pool = db.pool();
    for n in 1..=40 {
        place(pool, &format!("o{}", n % 4), n).await;
        send_invoice(pool, n).await;
    }
    let (orders_seen, invoices_seen) = (Seen::default(), Seen::default());
    let orders = Worker::builder(pool.clone(), orders_dispatcher(&orders_seen))
        .name("orders")
        .poll_interval(Duration::from_millis(50))
        .batch_size(8)
        .start()
        .await
        .unwrap();
    let invoices = Worker::builder(pool.clone(), invoices_dispatcher(&invoices_seen))
        .name("invoices")
        .poll_interval(Duration::from_millis(50))
        .batch_size(8)
        .start()
        .await
        .unwrap();
    wait_until(WAIT, "every event is delivered", || async {
        queue_rows(pool).await.is_empty()
    })
    .await;
    orders.shutdown().await;
    invoices.shutdown().await;

    let names = |seen: &Seen| -> Vec<String> {
        let mut names: Vec<String> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|(n, _)| n.clone())
            .collect();
        names.dedup();
        names
    };
    assert_eq!(orders_seen.lock().unwrap().len(), 40);
    assert_eq!(invoices_seen.lock().unwrap().len(), 40);
    assert_eq!(names(&orders_seen), [OrderPlaced::NAME]);
    assert_eq!(names(&invoices_seen), [InvoiceSent::NAME]);
}

#[tokio::test]
async fn an_ordered_worker_does_not_overtake_an_earlier_event_it_cannot_handle() {
    let db = database().await;
    let pool = db.pool();
    // Aggregate o1: version 1, then a version 2 this binary cannot read, then version 1 again
    // (an old producer still running). Aggregate o2: version 1 only.
    place(pool, "o1", 1).await;
    place_v2(pool, "o1", 2).await;
    place(pool, "o1", 3).await;
    place(pool, "o2", 1).await;

    let seen = Seen::default();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::builder(pool.clone(), orders_dispatcher(&seen))
        .ordered(true)
        .poll_interval(Duration::from_millis(50))
        .events(tx)
        .start()
        .await
        .unwrap();
    wait_until(WAIT, "o1's first event and o2's are delivered", || async {
        seen.lock().unwrap().len() == 2
    })
    .await;
    claims_of_nothing(&mut rx, 3).await;
    worker.shutdown().await;

    // o1's third event waits behind the second, which waits for its worker.
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (OrderPlaced::NAME.to_owned(), 1),
            (OrderPlaced::NAME.to_owned(), 1)
        ]
    );
    assert_eq!(
        queue_of(pool, OrderPlaced::NAME, 2).await,
        [("pending".to_owned(), 0, None)]
    );
    assert_eq!(
        queue_of(pool, OrderPlaced::NAME, 1).await,
        [("pending".to_owned(), 0, None)]
    );
}

#[tokio::test]
async fn a_dispatcher_without_handlers_is_refused_at_start() {
    let db = database().await;
    let error = Worker::builder(db.pool().clone(), Dispatcher::builder().build().unwrap())
        .name("empty")
        .start()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("`empty`")
            && error.contains("handles no event")
            && error.contains("register"),
        "{error}"
    );
}

/// The live workers of the default table: (name, what they claim).
async fn live_workers(pool: &PgPool) -> Vec<(String, Option<serde_json::Value>)> {
    sqlx::query_as(
        "SELECT worker, handles FROM outbox_workers
         WHERE table_name = 'outbox' AND expires_at >= now() ORDER BY worker",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// `outbox status` of the default table, as printed.
async fn status(url: &str) -> String {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let exit = outbox_runtime::cli::Outbox::new()
        .run_with(
            ["outbox", "status", "--database-url", url],
            &mut out,
            &mut err,
        )
        .await;
    assert_eq!(
        exit,
        outbox_runtime::cli::Exit::Ok,
        "{}",
        String::from_utf8_lossy(&err)
    );
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn an_event_no_running_worker_handles_is_shown_as_waiting_for_a_worker_not_as_failed() {
    let db = database().await;
    let pool = db.pool();
    place_v2(pool, "o1", 1).await;
    send_invoice(pool, 1).await;

    let seen = Seen::default();
    let orders = Worker::builder(pool.clone(), orders_dispatcher(&seen))
        .name("orders-n")
        .poll_interval(Duration::from_millis(50))
        .maintenance_interval(Duration::from_millis(200))
        .start()
        .await
        .unwrap();
    wait_until(
        WAIT,
        "the worker lists itself with what it claims",
        || async { !live_workers(pool).await.is_empty() },
    )
    .await;
    assert_eq!(
        live_workers(pool).await,
        [(
            "orders-n".to_owned(),
            Some(serde_json::json!([{"name": "handled.order_placed", "version": 1}]))
        )]
    );
    let store = outbox_runtime::Store::new(pool.clone());
    let unhandled = store.unhandled_events(1000).await.unwrap();
    let listed: Vec<(&str, i32, i64, i64)> = unhandled
        .iter()
        .map(|u| {
            (
                u.event_type.as_str(),
                u.event_version,
                u.waiting,
                u.live_workers,
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("handled.order_placed", 2, 1, 1),
            ("handled.invoice_sent", 1, 1, 1)
        ]
    );
    let printed = status(&db.url()).await;
    assert!(
        printed.contains("no worker handles handled.order_placed v2 since")
            && printed.contains("no worker handles handled.invoice_sent v1 since")
            && printed.contains("1 waiting, not failed"),
        "{printed}"
    );

    // The other service's worker starts: its events are handled, and the status says so.
    let invoices = Worker::builder(pool.clone(), invoices_dispatcher(&Seen::default()))
        .name("invoices")
        .poll_interval(Duration::from_millis(50))
        .maintenance_interval(Duration::from_millis(200))
        .start()
        .await
        .unwrap();
    wait_until(WAIT, "the invoice is delivered", || async {
        queue_of(pool, InvoiceSent::NAME, 1).await.is_empty()
    })
    .await;
    let unhandled = store.unhandled_events(1000).await.unwrap();
    assert_eq!(unhandled.len(), 1, "{unhandled:?}");
    assert_eq!(
        (unhandled[0].event_type.as_str(), unhandled[0].event_version),
        ("handled.order_placed", 2)
    );

    // A worker that stops leaves the list at once; with none left, every waiting event is
    // listed, and says that no worker is live.
    orders.shutdown().await;
    invoices.shutdown().await;
    assert!(live_workers(pool).await.is_empty());
    let printed = status(&db.url()).await;
    assert!(
        printed.contains("no worker handles handled.order_placed v2")
            && printed.contains("no live worker is listed"),
        "{printed}"
    );
    assert_eq!(
        queue_of(pool, OrderPlaced::NAME, 2).await,
        [("pending".to_owned(), 0, None)]
    );
}

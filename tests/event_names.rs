//! Event names that arrive without `#[derive(Event)]` (which refuses them at compile time, see
//! tests/ui/event/): an `Event` implemented by hand is refused at enqueue and by the
//! dispatcher, with a typed error that shows the name escaped, and nothing is written.

use outbox_runtime::contract::Contract;
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::{Delivery, Dispatcher, Error, Event, HandlerError};
use serde::{Deserialize, Serialize};

/// A hand-written `Event` with the given name and aggregate type.
macro_rules! hand_written_event {
    ($ty:ident, $name:expr, $aggregate:expr) => {
        #[derive(Debug, Clone, Serialize, Deserialize)]
        struct $ty {
            id: u32,
        }

        impl Event for $ty {
            const NAME: &'static str = $name;
            const VERSION: u32 = 1;
            const TABLE: &'static str = "outbox";
            const AGGREGATE_TYPE: Option<&'static str> = $aggregate;
            type Current = $ty;

            fn into_current(self) -> Self::Current {
                self
            }

            fn aggregate_id(&self) -> Option<String> {
                Some(self.id.to_string())
            }

            fn aggregate_version(&self) -> Option<i64> {
                None
            }

            fn contract() -> Contract {
                Contract {
                    name: Self::NAME,
                    version: Self::VERSION,
                    type_name: stringify!($ty),
                    shape: serde_json::json!({"type": "object"}),
                }
            }
        }
    };
}

hand_written_event!(Injected, "x\nDROP TABLE victim; --", Some("order"));
hand_written_event!(Quoted, "order'); DROP TABLE victim; --", None);
hand_written_event!(BadAggregate, "order.placed", Some("Order Items"));
hand_written_event!(Fine, "order.placed", Some("order"));

async fn rows(db: &TestDatabase) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(db.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn enqueue_refuses_a_hand_written_event_with_an_invalid_name() {
    let db = TestDatabase::new().await;
    let mut tx = db.pool().begin().await.unwrap();

    let err = Injected { id: 1 }.enqueue(&mut tx, "k1").await.unwrap_err();
    let Error::InvalidEventName {
        kind,
        name,
        problem,
    } = &err
    else {
        panic!("expected InvalidEventName, got {err:?}")
    };
    assert_eq!(
        (*kind, name.as_str(), problem.as_str()),
        (
            "event name",
            "x\\nDROP TABLE victim; --",
            "it contains the character U+000A"
        )
    );
    let message = err.to_string();
    assert!(
        message.contains("lowercase ASCII letters, digits") && !message.contains('\n'),
        "{message}"
    );

    let err = Quoted { id: 1 }.enqueue(&mut tx, "k2").await.unwrap_err();
    assert!(matches!(err, Error::InvalidEventName { .. }), "{err:?}");
    let err = BadAggregate { id: 1 }
        .enqueue(&mut tx, "k3")
        .await
        .unwrap_err();
    assert!(
        err.to_string().starts_with(
            "\"Order Items\" is not a valid aggregate type: it contains the uppercase letter `O`"
        ),
        "{err}"
    );

    // Nothing was written and the transaction is still usable.
    Fine { id: 1 }
        .enqueue(&mut tx, "k4")
        .await
        .expect("a valid event enqueues in the same transaction");
    tx.commit().await.unwrap();
    assert_eq!(rows(&db).await, 1);
}

async fn handle_injected(_event: Injected, _ctx: Delivery) -> Result<(), HandlerError> {
    Ok(())
}

#[test]
fn the_dispatcher_refuses_to_handle_a_hand_written_event_with_an_invalid_name() {
    let err = Dispatcher::builder()
        .handler(handle_injected)
        .build()
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.starts_with("dispatcher: `event_names::Injected` cannot be handled: \"x\\nDROP TABLE victim; --\" is not a valid event name"),
        "{message}"
    );
    assert!(!message.contains('\n'), "{message}");
}

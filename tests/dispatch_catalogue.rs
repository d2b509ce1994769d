//! Exhaustive mode: a `#[catalogue]` module generates a trait with one method per current
//! event; its dispatcher delivers every stored version, upcast, to the implementation.

use std::sync::{Arc, Mutex};

use outbox_runtime::store::{ClaimedEvent, Ownership};
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::{Delivery, Event, HandlerError, Sink, Store, catalogue};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[catalogue]
pub mod events {
    use outbox_runtime::Event;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(name = "cart.checked_out", version = 3)]
    pub struct CartCheckedOut {
        #[outbox(aggregate_id)]
        pub cart_id: String,
        pub items: u32,
        pub coupon: Option<String>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(version = 2, upcast = CartCheckedOut)]
    pub struct CartCheckedOutV2 {
        #[outbox(aggregate_id)]
        pub cart_id: String,
        pub items: u32,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(version = 1, upcast = CartCheckedOutV2)]
    pub struct CartCheckedOutV1 {
        #[outbox(aggregate_id)]
        pub cart_id: String,
    }

    impl From<CartCheckedOutV2> for CartCheckedOut {
        fn from(v2: CartCheckedOutV2) -> Self {
            CartCheckedOut {
                cart_id: v2.cart_id,
                items: v2.items,
                coupon: None,
            }
        }
    }

    impl From<CartCheckedOutV1> for CartCheckedOutV2 {
        fn from(v1: CartCheckedOutV1) -> Self {
            CartCheckedOutV2 {
                cart_id: v1.cart_id,
                items: 1,
            }
        }
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(version = 1)]
    pub struct CartAbandoned {
        pub cart_id: String,
    }
}

/// What the implementation saw; shared with the test through an `Arc`.
#[derive(Default)]
struct Seen {
    checked_out: Mutex<Vec<(events::CartCheckedOut, u32)>>,
    abandoned: Mutex<Vec<String>>,
}

struct Carts(Arc<Seen>);

impl events::EventsHandler for Carts {
    async fn cart_checked_out(
        &self,
        event: events::CartCheckedOut,
        ctx: Delivery,
    ) -> Result<(), HandlerError> {
        self.0
            .checked_out
            .lock()
            .unwrap()
            .push((event, ctx.stored_version()));
        Ok(())
    }

    async fn cart_abandoned(
        &self,
        event: events::CartAbandoned,
        _ctx: Delivery,
    ) -> Result<(), HandlerError> {
        self.0.abandoned.lock().unwrap().push(event.cart_id);
        Ok(())
    }
}

async fn deliver_all(store: &Store, sink: &dyn Sink) -> usize {
    let claimed: Vec<ClaimedEvent> = store
        .claim_batch("catalogue", 10, Duration::from_secs(30), false)
        .await
        .unwrap();
    for event in &claimed {
        let delivery = Delivery::new(event, CancellationToken::new());
        sink.deliver(event, &delivery)
            .await
            .expect("every catalogue event is handled");
        assert_eq!(
            store.complete_if_owned(event.claim()).await.unwrap(),
            Ownership::Owned
        );
    }
    claimed.len()
}

#[tokio::test]
async fn every_stored_version_reaches_the_trait_method_of_its_current_type() {
    let seen = Arc::new(Seen::default());
    let dispatcher = events::dispatcher(Carts(Arc::clone(&seen))).expect("dispatcher");
    assert_eq!(
        dispatcher.routes(),
        [
            ("cart.checked_out", 1),
            ("cart.checked_out", 2),
            ("cart.checked_out", 3),
            ("cart_abandoned", 1)
        ]
    );

    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let mut tx = db.pool().begin().await.unwrap();
    use outbox_runtime::store::enqueue::enqueue_event;
    enqueue_event(
        &mut tx,
        &events::CartCheckedOutV1 {
            cart_id: "c1".into(),
        },
        "c1",
        &Default::default(),
    )
    .await
    .unwrap();
    enqueue_event(
        &mut tx,
        &events::CartCheckedOutV2 {
            cart_id: "c2".into(),
            items: 4,
        },
        "c2",
        &Default::default(),
    )
    .await
    .unwrap();
    events::CartCheckedOut {
        cart_id: "c3".into(),
        items: 2,
        coupon: Some("X".into()),
    }
    .enqueue(&mut tx, "c3")
    .await
    .unwrap();
    events::CartAbandoned {
        cart_id: "c4".into(),
    }
    .enqueue(&mut tx, "c4")
    .await
    .unwrap();
    tx.commit().await.unwrap();

    assert_eq!(deliver_all(&store, &dispatcher).await, 4);
    let checked_out = seen.checked_out.lock().unwrap().clone();
    assert_eq!(
        checked_out,
        [
            (
                events::CartCheckedOut {
                    cart_id: "c1".into(),
                    items: 1,
                    coupon: None
                },
                1
            ),
            (
                events::CartCheckedOut {
                    cart_id: "c2".into(),
                    items: 4,
                    coupon: None
                },
                2
            ),
            (
                events::CartCheckedOut {
                    cart_id: "c3".into(),
                    items: 2,
                    coupon: Some("X".into())
                },
                3
            ),
        ]
    );
    assert_eq!(*seen.abandoned.lock().unwrap(), ["c4"]);
    assert_eq!(events::CartCheckedOutV1::NAME, "cart.checked_out");
}

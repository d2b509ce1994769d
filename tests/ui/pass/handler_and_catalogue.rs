// A #[handler] stays an ordinary callable function; a catalogue trait is implemented with
// plain `async fn`s.
use outbox_runtime::{Delivery, Dispatcher, HandlerError, catalogue, handler};

#[catalogue]
pub mod events {
    use outbox_runtime::Event;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(name = "order.confirmed", version = 2)]
    pub struct OrderConfirmed {
        pub order_id: u64,
    }

    #[derive(Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(version = 1, upcast = OrderConfirmed)]
    pub struct OrderConfirmedV1 {
        pub order_id: u64,
    }

    impl From<OrderConfirmedV1> for OrderConfirmed {
        fn from(v: OrderConfirmedV1) -> Self {
            OrderConfirmed { order_id: v.order_id }
        }
    }
}

#[handler]
pub async fn on_order_confirmed(event: events::OrderConfirmed, ctx: Delivery) -> Result<(), HandlerError> {
    let _ = (event.order_id, ctx.attempt());
    Ok(())
}

struct Service;

impl events::EventsHandler for Service {
    async fn order_confirmed(&self, event: events::OrderConfirmed, _ctx: Delivery) -> Result<(), HandlerError> {
        if event.order_id == 0 { Err(HandlerError::permanent("order 0 does not exist")) } else { Ok(()) }
    }
}

fn main() {
    let explicit = Dispatcher::builder().handler(on_order_confirmed).build().unwrap();
    assert_eq!(explicit.routes(), [("order.confirmed", 1), ("order.confirmed", 2)]);
    let from_catalogue = events::dispatcher(Service).unwrap();
    assert_eq!(from_catalogue.routes(), explicit.routes());
    let _still_callable = on_order_confirmed;
}

// Every attribute of #[derive(Event)] at once, an enum payload, and an upcast chain.
use outbox_runtime::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "order.confirmed", version = 3, table = "billing_outbox", aggregate = "purchase", crate = ::outbox_runtime)]
pub struct OrderConfirmed {
    #[outbox(aggregate_id)]
    pub order_id: uuid::Uuid,
    #[outbox(aggregate_version)]
    pub revision: u32,
    pub total: Money,
}

#[derive(Serialize, Deserialize, JsonSchema)]
pub struct Money {
    pub cents: i64,
    pub currency: String,
}

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 2, upcast = OrderConfirmed)]
pub struct OrderConfirmedV2 {
    #[outbox(aggregate_id)]
    pub order_id: uuid::Uuid,
    pub cents: i64,
}

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1, upcast = OrderConfirmedV2)]
pub struct OrderConfirmedV1 {
    pub order_id: uuid::Uuid,
}

impl From<OrderConfirmedV2> for OrderConfirmed {
    fn from(v: OrderConfirmedV2) -> Self {
        OrderConfirmed { order_id: v.order_id, revision: 0, total: Money { cents: v.cents, currency: "EUR".into() } }
    }
}

impl From<OrderConfirmedV1> for OrderConfirmedV2 {
    fn from(v: OrderConfirmedV1) -> Self {
        OrderConfirmedV2 { order_id: v.order_id, cents: 0 }
    }
}

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1)]
#[serde(tag = "kind")]
pub enum ParcelEvent {
    Sent { carrier: String },
    Lost,
}

fn main() {
    // The chain's current type is the newest one, two steps away.
    fn current_of<E: Event<Current = OrderConfirmed>>() {}
    current_of::<OrderConfirmedV1>();
    current_of::<OrderConfirmedV2>();
    assert_eq!(OrderConfirmedV1::NAME, "order.confirmed");
    assert_eq!(OrderConfirmedV1::TABLE, "billing_outbox");
    assert_eq!(ParcelEvent::NAME, "parcel_event");
}

use outbox_runtime::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1)]
pub struct OrderConfirmed {
    #[outbox(aggregate_id)]
    pub order_id: Option<u64>,
}

fn main() {}

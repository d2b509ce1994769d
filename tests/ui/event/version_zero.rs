use outbox_runtime::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 0)]
pub struct OrderConfirmed {
    pub order_id: u64,
}

fn main() {}

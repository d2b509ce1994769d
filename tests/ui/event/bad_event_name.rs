use outbox_runtime::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "x\nDROP TABLE victim; --", version = 1)]
pub struct OrderConfirmed {
    pub order_id: u64,
}

fn main() {}

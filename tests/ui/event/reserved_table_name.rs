use outbox_runtime::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1, table = "order")]
pub struct OrderPlaced {
    pub order_id: u64,
}

fn main() {}

use outbox_runtime::Event;
use serde::{Deserialize, Serialize};

// The contract shape is the JSON Schema: `JsonSchema` is required too.
#[derive(Serialize, Deserialize, Event)]
#[outbox(version = 1)]
pub struct OrderConfirmed {
    pub order_id: u64,
}

fn main() {}

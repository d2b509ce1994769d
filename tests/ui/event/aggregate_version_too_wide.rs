use outbox_runtime::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1)]
pub struct OrderConfirmed {
    #[outbox(aggregate_id)]
    pub order_id: u64,
    #[outbox(aggregate_version)]
    pub revision: u64,
}

fn main() {}

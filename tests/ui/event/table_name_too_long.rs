use outbox_runtime::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1, table = "a_table_name_of_forty_four_characters_abcdef")]
pub struct OrderConfirmed {
    pub order_id: u64,
}

fn main() {}

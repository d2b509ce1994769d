use outbox_runtime::Event;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// No `name`: the default is the type name in snake_case, "bestellung_ä", which is not ASCII.
#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1)]
pub struct BestellungÄ {
    pub order_id: u64,
}

fn main() {}

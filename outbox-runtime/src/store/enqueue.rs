//! The transactional write of an event. OWNER: issue 2.

use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use crate::error::Result;
use crate::event::Event;

/// Options of one enqueue.
#[derive(Debug, Clone)]
pub struct EnqueueOptions {
    /// Send a wake-up notification on commit (default true). NOTIFY serialises committing
    /// transactions; services that enqueue at very high rates and poll can switch it off.
    pub notify: bool,
    /// Largest serialized payload accepted, in bytes (default 256 KiB).
    pub max_payload_bytes: usize,
    /// Attempts before the event is exhausted (default 10).
    pub max_attempts: i32,
    /// Extra headers (a JSON object) stored with the event.
    pub headers: Option<serde_json::Value>,
}

impl Default for EnqueueOptions {
    fn default() -> Self {
        EnqueueOptions {
            notify: true,
            max_payload_bytes: 256 * 1024,
            max_attempts: 10,
            headers: None,
        }
    }
}

/// Write `event` in `tx` under `operation_key`. Used by [`Event::enqueue`].
pub async fn enqueue_event<E: Event>(
    tx: &mut Transaction<'_, Postgres>,
    event: &E,
    operation_key: &str,
    options: &EnqueueOptions,
) -> Result<Uuid> {
    let _ = (tx, event, operation_key, options);
    todo!("issue 2")
}

//! What a transaction or a service enqueued, decoded the way a worker decodes it.
//!
//! [`enqueued`] reads every event of `E`'s name from `E`'s table through any executor: a pool
//! (what committed), or an open transaction (`&mut *tx`, which also sees its own uncommitted
//! events). Each payload is decoded with the contract of the version it was stored with: a row
//! of an older version is decoded as that version's type and upcast, as the dispatcher does, so
//! the test sees the current type `E`. [`assert_enqueued`] and [`assert_not_enqueued`] panic with
//! a message that lists what the table holds instead.

use std::any::TypeId;
use std::fmt::Write as _;

use sqlx::PgExecutor;
use uuid::Uuid;

use crate::contract::{registered_events, shown};
use crate::delivery::Aggregate;
use crate::event::{CurrentEvent, Event};
use crate::store::{StoredEvent, list_events};

/// The most rows an assertion reads; a test table holding more is listed in part.
const LIST_LIMIT: i64 = 10_000;

/// The longest payload text shown per event in a failure message.
const SHOWN_PAYLOAD: usize = 240;

/// What was stored with an event besides its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventMeta {
    /// Stable event id (UUID v5 of table and operation key).
    pub event_id: Uuid,
    /// The operation key it was enqueued under.
    pub operation_key: String,
    /// Event name.
    pub event_type: String,
    /// The version the payload was stored with (before any upcast).
    pub stored_version: u32,
    /// The aggregate, when the event has one.
    pub aggregate: Option<Aggregate>,
    /// `pending`, `processing`, `delivered` or `exhausted`.
    pub status: String,
    /// Attempts charged so far, while the event is not delivered; `None` once it is. A delivered
    /// event keeps no delivery state (its queue row, which held the attempts and the last error,
    /// is deleted by the completion), so a test that wants the attempts of a delivery reads
    /// them from the drain's report ([`DeliveryRecord::attempt`](crate::testing::DeliveryRecord::attempt)).
    pub attempts: Option<i32>,
    /// The headers stored with the event (a JSON object).
    pub headers: serde_json::Value,
    /// The last failure recorded, if any; `None` once delivered (see `attempts`).
    pub last_error: Option<String>,
}

impl EventMeta {
    fn of(row: &StoredEvent) -> EventMeta {
        EventMeta {
            event_id: row.event_id,
            operation_key: row.operation_key.clone(),
            event_type: row.event_type.clone(),
            stored_version: u32::try_from(row.event_version).unwrap_or(0),
            aggregate: match (&row.aggregate_type, &row.aggregate_id) {
                (Some(t), Some(id)) => Some(Aggregate {
                    aggregate_type: t.clone(),
                    id: id.clone(),
                    version: row.aggregate_version,
                }),
                _ => None,
            },
            status: row.status.clone(),
            attempts: row.attempts,
            headers: row.headers.clone(),
            last_error: row.last_error.clone(),
        }
    }
}

/// Every event of type `E` in `E`'s table, in enqueue order, whatever its status, each decoded
/// (and upcast from an older version) into `E`.
///
/// `executor` is a pool (`&pool`), a connection, or an open transaction (`&mut *tx`).
///
/// # Panics
///
/// When the table cannot be read, or when a stored event of `E`'s name cannot become an `E`:
/// its version has no type in this binary that upcasts to `E`, or its payload does not decode.
/// A worker would fail such an event permanently; a test should hear about it.
pub async fn enqueued<'e, E: CurrentEvent>(executor: impl PgExecutor<'e>) -> Vec<(EventMeta, E)> {
    let rows = read::<E>(executor, "enqueued").await;
    rows.iter()
        .filter(|row| row.event_type == E::NAME)
        .map(|row| (EventMeta::of(row), decode::<E>(row)))
        .collect()
}

/// Assert that an event of type `E` matching `predicate` was enqueued; returns the first match.
///
/// # Panics
///
/// When none matches, with every event of the table listed (name, version, id, key, status and
/// payload), or for the reasons of [`enqueued`].
pub async fn assert_enqueued<'e, E: CurrentEvent>(
    executor: impl PgExecutor<'e>,
    predicate: impl Fn(&E) -> bool,
) -> (EventMeta, E) {
    let rows = read::<E>(executor, "assert_enqueued").await;
    let found = rows
        .iter()
        .filter(|row| row.event_type == E::NAME)
        .map(|row| (EventMeta::of(row), decode::<E>(row)))
        .find(|(_, event)| predicate(event));
    match found {
        Some(found) => found,
        None => panic!(
            "assert_enqueued::<{}>: no enqueued `{}` event matched the predicate.\n{}",
            std::any::type_name::<E>(),
            E::NAME,
            listing::<E>(&rows)
        ),
    }
}

/// Assert that no event of type `E` matching `predicate` was enqueued.
///
/// # Panics
///
/// When one matches, with the matching events listed, or for the reasons of [`enqueued`].
pub async fn assert_not_enqueued<'e, E: CurrentEvent>(
    executor: impl PgExecutor<'e>,
    predicate: impl Fn(&E) -> bool,
) {
    let rows = read::<E>(executor, "assert_not_enqueued").await;
    let matching: Vec<&StoredEvent> = rows
        .iter()
        .filter(|row| row.event_type == E::NAME && predicate(&decode::<E>(row)))
        .collect();
    if !matching.is_empty() {
        let mut lines = String::new();
        for row in &matching {
            line(&mut lines, row);
        }
        panic!(
            "assert_not_enqueued::<{}>: {} enqueued `{}` event(s) matched the predicate:\n{lines}",
            std::any::type_name::<E>(),
            matching.len(),
            E::NAME,
        );
    }
}

async fn read<'e, E: Event>(executor: impl PgExecutor<'e>, caller: &str) -> Vec<StoredEvent> {
    list_events(executor, E::TABLE, LIST_LIMIT)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{caller}::<{}>: cannot read outbox table `{}`: {e} (is the outbox schema migrated in this database?)",
                std::any::type_name::<E>(),
                E::TABLE
            )
        })
}

/// Decode a stored row of `E`'s name as the version it was stored with, upcast to `E`.
fn decode<E: CurrentEvent>(row: &StoredEvent) -> E {
    let version = u32::try_from(row.event_version).unwrap_or(0);
    if version == E::VERSION {
        return match serde_json::from_value(row.payload.clone()) {
            Ok(event) => event,
            Err(e) => cannot_read::<E>(row, &format!("its payload does not decode: {e}")),
        };
    }
    // An older (or newer) version: the type `#[derive(Event)]` registered for it, if it upcasts
    // to `E`, as the dispatcher routes it.
    let registration = registered_events().into_iter().find(|r| {
        r.name == E::NAME && r.version == version && (r.current_type_id)() == TypeId::of::<E>()
    });
    let Some(registration) = registration else {
        cannot_read::<E>(
            row,
            &format!(
                "this binary has no type for version {version} that upcasts to `{}` (declare the old version with `#[outbox(upcast = ...)]`)",
                std::any::type_name::<E>()
            ),
        )
    };
    let current = match (registration.decode_current)(row.payload.clone()) {
        Ok(current) => current,
        Err(e) => cannot_read::<E>(
            row,
            &format!(
                "its payload does not decode as `{}`: {e}",
                registration.type_name
            ),
        ),
    };
    match current.downcast::<E>() {
        Ok(event) => *event,
        Err(_) => cannot_read::<E>(row, "the upcast produced another type"),
    }
}

fn cannot_read<E: Event>(row: &StoredEvent, why: &str) -> ! {
    panic!(
        "event {} (`{}` version {}, key `{}`) cannot be read as `{}`: {why}",
        row.event_id,
        E::NAME,
        row.event_version,
        shown(&row.operation_key),
        std::any::type_name::<E>()
    )
}

/// What the table holds, one line an event, for a failure message.
fn listing<E: Event>(rows: &[StoredEvent]) -> String {
    let mut out = String::new();
    if rows.is_empty() {
        let _ = write!(out, "Outbox table `{}` holds no events.", E::TABLE);
        return out;
    }
    let limited = if rows.len() as i64 >= LIST_LIMIT {
        format!(" (the first {LIST_LIMIT})")
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "Enqueued instead, in outbox table `{}`{limited}:",
        E::TABLE
    );
    for row in rows {
        line(&mut out, row);
    }
    out
}

fn line(out: &mut String, row: &StoredEvent) {
    let payload = row.payload.to_string();
    let payload = match payload.char_indices().nth(SHOWN_PAYLOAD) {
        Some((cut, _)) => format!("{}...", &payload[..cut]),
        None => payload,
    };
    let aggregate = match (&row.aggregate_type, &row.aggregate_id) {
        (Some(t), Some(id)) => format!(" aggregate {}/{}", shown(t), shown(id)),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "  - `{}` v{} {} key `{}`{aggregate} [{}] {payload}",
        shown(&row.event_type),
        row.event_version,
        row.event_id,
        shown(&row.operation_key),
        row.status,
    );
}

//! The transactional write of an event: the only way an event gets into an outbox table.
//!
//! The event id is a UUID v5 of the table and the operation key, so it is the same for every
//! retry of the business command and every delivery; receivers deduplicate on it. The payload
//! fingerprint (SHA-256 of type, version and serialized payload) tells an idempotent repeat from
//! a key reused for something else.

use std::time::Duration;

use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use sqlx::types::Json;
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::event::Event;
use crate::store::sql;

/// Namespace of the v5 event ids (a fixed, random UUID chosen for this crate; never change it,
/// or the ids of retried commands stop matching the ids already delivered).
pub const EVENT_ID_NAMESPACE: Uuid = Uuid::from_u128(0x6f1c_2a9e_5b3d_4c8f_9e07_d1a4_b2c6_e835);

/// Options of one enqueue.
#[derive(Debug, Clone)]
pub struct EnqueueOptions {
    /// Send a wake-up notification on commit (default true). A notifying commit holds a
    /// database-wide lock until it is flushed, so notifying transactions commit one at a time;
    /// services that enqueue at high rates switch it off and wake the workers after commit with
    /// a [`Waker`](crate::waker::Waker), or rely on polling.
    pub notify: bool,
    /// Largest serialized payload accepted, in bytes (default 256 KiB).
    pub max_payload_bytes: usize,
    /// Attempts before the event is exhausted (default 10).
    pub max_attempts: i32,
    /// Extra headers (a JSON object) stored with the event.
    pub headers: Option<serde_json::Value>,
    /// Make the event claimable only this long after the database's `now()` (default zero).
    pub delay: Duration,
}

impl EnqueueOptions {
    /// The defaults without the in-transaction wake-up: the workers find the event by polling,
    /// or by a [`Waker`](crate::waker::Waker) the service calls after commit.
    pub fn without_notify() -> Self {
        EnqueueOptions {
            notify: false,
            ..EnqueueOptions::default()
        }
    }
}

impl Default for EnqueueOptions {
    fn default() -> Self {
        EnqueueOptions {
            notify: true,
            max_payload_bytes: 256 * 1024,
            max_attempts: 10,
            headers: None,
            delay: Duration::ZERO,
        }
    }
}

/// The event id of the intention named by `operation_key` in `table`.
pub fn event_id_for(table: &str, operation_key: &str) -> Uuid {
    Uuid::new_v5(
        &EVENT_ID_NAMESPACE,
        format!("{table}/{operation_key}").as_bytes(),
    )
}

/// SHA-256 over event type, version and the serialized payload, each length-delimited so that
/// no two different triples hash the same input.
pub fn payload_fingerprint(event_type: &str, event_version: u32, payload: &[u8]) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update((event_type.len() as u64).to_be_bytes());
    hash.update(event_type.as_bytes());
    hash.update(event_version.to_be_bytes());
    hash.update(payload);
    hash.finalize().into()
}

/// Write `event` in `tx` under `operation_key`. Used by [`Event::enqueue`].
///
/// One round trip in the common case. Same key and same payload: the existing event id comes
/// back and nothing is written. Same key, different payload: [`Error::OperationKeyReused`], and
/// `tx` is still usable (the statement never raises a unique violation).
pub async fn enqueue_event<E: Event>(
    tx: &mut Transaction<'_, Postgres>,
    event: &E,
    operation_key: &str,
    options: &EnqueueOptions,
) -> Result<Uuid> {
    let statements = sql::statements(E::TABLE)?;
    // Checked at compile time by `#[derive(Event)]`; this catches an `Event` written by hand.
    crate::contract::validate_event_name(E::NAME)?;
    if let Some(aggregate_type) = E::AGGREGATE_TYPE {
        crate::contract::validate_aggregate_type(aggregate_type)?;
    }
    let payload = serde_json::to_string(event).map_err(|source| Error::Serialize {
        event_type: E::NAME.to_owned(),
        source,
    })?;
    if payload.len() > options.max_payload_bytes {
        return Err(Error::PayloadTooLarge {
            event_type: E::NAME.to_owned(),
            size: payload.len(),
            limit: options.max_payload_bytes,
        });
    }
    let max_attempts = options.max_attempts;
    if max_attempts < 1 {
        return Err(Error::Config(format!(
            "EnqueueOptions::max_attempts is {max_attempts}; it must be at least 1"
        )));
    }
    let fingerprint = payload_fingerprint(E::NAME, E::VERSION, payload.as_bytes());
    let event_id = event_id_for(E::TABLE, operation_key);
    let aggregate_id = event.aggregate_id();
    // Per-aggregate ordering compares (aggregate_type, aggregate_id); an event with an
    // aggregate id but no declared aggregate type is grouped under its event name.
    let aggregate_type = aggregate_id
        .as_ref()
        .map(|_| E::AGGREGATE_TYPE.unwrap_or(E::NAME));
    let version = i32::try_from(E::VERSION).map_err(|_| {
        Error::Config(format!(
            "event `{}` version {} does not fit an int",
            E::NAME,
            E::VERSION
        ))
    })?;
    let payload = RawValue::from_string(payload).map_err(|source| Error::Serialize {
        event_type: E::NAME.to_owned(),
        source,
    })?;
    let headers = options
        .headers
        .clone()
        .unwrap_or_else(|| serde_json::json!({}));
    let statement = if options.notify {
        statements.enqueue_notify
    } else {
        statements.enqueue
    };
    let query = sqlx::query(statement)
        .bind(event_id)
        .bind(operation_key)
        .bind(&fingerprint[..])
        .bind(E::NAME)
        .bind(version)
        .bind(aggregate_type)
        .bind(aggregate_id)
        .bind(event.aggregate_version())
        .bind(Json(&payload))
        .bind(Json(&headers))
        .bind(max_attempts)
        .bind(super::micros(options.delay));
    let query = if options.notify {
        query.bind(super::notify_channel(E::TABLE))
    } else {
        query
    };
    if query.execute(&mut **tx).await?.rows_affected() == 1 {
        return Ok(event_id);
    }
    // The key is taken: read the stored event with a new statement, whose snapshot sees it even
    // when it was committed after the insert began. (Under REPEATABLE READ the insert itself
    // reports a serialization failure instead, which the caller retries like any other.)
    let existing: Option<(Uuid, Vec<u8>)> = sqlx::query_as(statements.existing_by_key)
        .bind(event_id)
        .fetch_optional(&mut **tx)
        .await?;
    let Some((existing_id, existing_fingerprint)) = existing else {
        // The row vanished between the two statements (purged after delivery, or its
        // transaction rolled back); the key is free again, so write the event as new.
        return Box::pin(enqueue_event(tx, event, operation_key, options)).await;
    };
    if existing_fingerprint == fingerprint {
        Ok(existing_id)
    } else {
        Err(Error::OperationKeyReused {
            operation_key: operation_key.to_owned(),
            existing_event_id: existing_id,
        })
    }
}

//! The transactional write of an event: the only way an event gets into an outbox table.
//!
//! The event id is a UUID v5 of the table and the operation key, so it is the same for every
//! retry of the business command and every delivery; receivers deduplicate on it. The payload
//! fingerprint (SHA-256 of type, version and the payload's canonical JSON, see
//! [`payload_fingerprint`]) tells an idempotent repeat from a key reused for something else.

use std::io::Write;
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
    /// With the `opentelemetry` feature, also store the current context's W3C `baggage` with
    /// the event (default false: baggage often carries user data, and stored headers live as
    /// long as the row). The trace context itself (`traceparent`, `tracestate`) is always
    /// captured; see `trace_context`. Without the feature this does nothing.
    pub trace_baggage: bool,
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
            trace_baggage: false,
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

/// Longest operation key accepted, in bytes. A key names one business action
/// (`place-order/<order id>`); it is stored in every row and repeated in errors, so a key
/// longer than this is refused with [`Error::OperationKeyTooLong`] before anything is written.
pub const MAX_OPERATION_KEY_BYTES: usize = 1024;

/// Insert-and-look-up rounds before a key whose event keeps vanishing is given up on
/// ([`Error::OperationKeyVanished`]).
const KEY_ROUNDS: u32 = 3;

/// Separates the canonical fingerprint's input from the legacy one's, so that no payload's
/// canonical fingerprint equals another payload's legacy fingerprint.
const CANONICAL_FINGERPRINT_TAG: &[u8] = b"outbox payload fingerprint v2 (canonical JSON)\0";

/// SHA-256 over event type, version and the payload's canonical JSON, each length-delimited or
/// self-delimiting so that no two different triples hash the same input.
///
/// The canonical JSON (see `docs/operation-keys.md`) makes the fingerprint a function of the
/// payload's value, not of how serde happened to order it: object keys are sorted by their
/// UTF-8 bytes at every depth (a `HashMap` iterates in a random order per instance); a number
/// is written by its value, so `1`, `1.0` and `-0.0`/`0` are one number each (JSON has a single
/// number type, and jsonb compares them equal): integral values in the 64-bit integer range
/// as integers, any other as the shortest text that reads back to the same `f64`; strings are
/// JSON-escaped UTF-8 (`"`, `\\` and control characters escaped, everything else as is); no
/// whitespace. Arrays keep their order, since an array's order is part of its meaning: a set
/// serialized as an array (`HashSet`) must iterate in a fixed order to be fingerprinted the same
/// on a retry, so use `BTreeSet` (or sort) in event payloads.
pub fn payload_fingerprint(
    event_type: &str,
    event_version: u32,
    payload: &serde_json::Value,
) -> [u8; 32] {
    let mut hash = HashWriter(Sha256::new());
    hash.0.update(CANONICAL_FINGERPRINT_TAG);
    hash.0.update((event_type.len() as u64).to_be_bytes());
    hash.0.update(event_type.as_bytes());
    hash.0.update(event_version.to_be_bytes());
    write_canonical(&mut hash, payload);
    hash.0.finalize().into()
}

/// The fingerprint of rows written before fingerprints were canonical: SHA-256 over type,
/// version and serde's output as it came. Enqueue still accepts it on a taken key, so a
/// command first enqueued by an older version and retried by this one is recognised (when
/// serde wrote the payload in the same order both times: always for structs, by chance for
/// maps).
pub fn legacy_payload_fingerprint(
    event_type: &str,
    event_version: u32,
    serialized_payload: &[u8],
) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update((event_type.len() as u64).to_be_bytes());
    hash.update(event_type.as_bytes());
    hash.update(event_version.to_be_bytes());
    hash.update(serialized_payload);
    hash.finalize().into()
}

/// The canonical JSON text of `value` (the input of [`payload_fingerprint`]).
pub fn canonical_json(value: &serde_json::Value) -> String {
    let mut out = Vec::new();
    write_canonical(&mut out, value);
    String::from_utf8(out).expect("canonical JSON is written from UTF-8 strings")
}

/// Feeds the canonical text straight into the hash, without building it.
struct HashWriter(Sha256);

impl Write for HashWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn write_canonical(out: &mut impl Write, value: &serde_json::Value) {
    use serde_json::Value;
    // Writes go to a hash or a Vec, which never fail.
    let infallible = "writing canonical JSON to memory cannot fail";
    match value {
        Value::Null => out.write_all(b"null").expect(infallible),
        Value::Bool(true) => out.write_all(b"true").expect(infallible),
        Value::Bool(false) => out.write_all(b"false").expect(infallible),
        Value::Number(number) => write_canonical_number(out, number),
        Value::String(text) => serde_json::to_writer(&mut *out, text).expect(infallible),
        Value::Array(items) => {
            out.write_all(b"[").expect(infallible);
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",").expect(infallible);
                }
                write_canonical(out, item);
            }
            out.write_all(b"]").expect(infallible);
        }
        Value::Object(fields) => {
            // Sorted here rather than relying on the map type: serde_json's map keeps insertion
            // order when any crate in the build enables its `preserve_order` feature.
            let mut sorted: Vec<(&String, &Value)> = fields.iter().collect();
            sorted.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.write_all(b"{").expect(infallible);
            for (i, (key, item)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.write_all(b",").expect(infallible);
                }
                serde_json::to_writer(&mut *out, key).expect(infallible);
                out.write_all(b":").expect(infallible);
                write_canonical(out, item);
            }
            out.write_all(b"}").expect(infallible);
        }
    }
}

/// A number by its value: integral values in `i64::MIN..=u64::MAX` as integers (so `1.0` is
/// `1` and `-0.0` is `0`), other values as the shortest text that reads back to the same `f64`.
fn write_canonical_number(out: &mut impl Write, number: &serde_json::Number) {
    let infallible = "writing canonical JSON to memory cannot fail";
    if let Some(n) = number.as_u64() {
        return write!(out, "{n}").expect(infallible);
    }
    if let Some(n) = number.as_i64() {
        return write!(out, "{n}").expect(infallible);
    }
    // Neither integer type holds it, so it is a float (a `Value` holds finite floats only).
    let float = number.as_f64().unwrap_or(f64::NAN);
    // 2^64 and -2^63 are exact as f64; an integral float in between converts to i128 exactly.
    const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;
    if float.fract() == 0.0 && float >= i64::MIN as f64 && float < TWO_POW_64 {
        #[allow(clippy::cast_possible_truncation)] // integral and in range: exact
        let integral = float as i128;
        return write!(out, "{integral}").expect(infallible);
    }
    serde_json::to_writer(&mut *out, &float).expect(infallible);
}

/// Write `event` in `tx` under `operation_key`. Used by [`Event::enqueue`].
///
/// The raw form: it writes any version, and only the headers in `options` (no trace context is
/// captured here; the typed paths, `Event::enqueue` and the `Producer`'s, add it before calling
/// this).
///
/// The key must not be empty ([`Error::OperationKeyEmpty`]) nor longer than
/// [`MAX_OPERATION_KEY_BYTES`]. The first enqueue of a type in a process checks its contract
/// against the database's registry and refuses a payload whose shape changed without a version
/// bump ([`Error::ContractMismatch`]; see `store::contract_check`).
///
/// One round trip in the common case. Same key and same payload (by value: see
/// [`payload_fingerprint`]): the existing event id comes back and nothing is written. Same key,
/// different payload: [`Error::OperationKeyReused`], and `tx` is still usable (the statement
/// never raises a unique violation on the event id).
///
/// Errors after which `tx` is aborted and must be rolled back: [`Error::RetryTransaction`]
/// (a same-key race under REPEATABLE READ or SERIALIZABLE, or a deadlock; run the business
/// transaction again) and [`Error::UniqueViolation`] (a unique index the application added to
/// the outbox table).
pub async fn enqueue_event<E: Event>(
    tx: &mut Transaction<'_, Postgres>,
    event: &E,
    operation_key: &str,
    options: &EnqueueOptions,
) -> Result<Uuid> {
    if operation_key.is_empty() {
        return Err(Error::OperationKeyEmpty {
            event_type: E::NAME.to_owned(),
        });
    }
    if operation_key.len() > MAX_OPERATION_KEY_BYTES {
        return Err(Error::OperationKeyTooLong {
            operation_key: operation_key.to_owned(),
            length: operation_key.len(),
            limit: MAX_OPERATION_KEY_BYTES,
        });
    }
    // Before anything is written: a payload that changed shape under a registered version is
    // refused here, not by the worker after it was stored.
    super::contract_check::check_before_enqueue::<E>(tx).await?;
    write_event(tx, event, operation_key, options)
        .await
        .map_err(|error| aborted_transaction_error(error, E::TABLE))
}

/// The typed error of a statement of the enqueue path that aborted the caller's transaction,
/// or `error` unchanged.
fn aborted_transaction_error(error: Error, table: &str) -> Error {
    let Error::Database(sqlx::Error::Database(database_error)) = &error else {
        return error;
    };
    match database_error.code().as_deref() {
        Some(code @ ("40001" | "40P01")) => Error::RetryTransaction {
            reason: format!("SQLSTATE {code}: {}", database_error.message()),
        },
        Some("23505") => Error::UniqueViolation {
            table: table.to_owned(),
            constraint: database_error
                .constraint()
                .unwrap_or("(unnamed)")
                .to_owned(),
        },
        _ => error,
    }
}

async fn write_event<E: Event>(
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
    crate::payload_limits::check_enqueue(E::NAME, &payload, options.headers.as_ref())?;
    let max_attempts = options.max_attempts;
    if max_attempts < 1 {
        return Err(Error::Config(format!(
            "EnqueueOptions::max_attempts is {max_attempts}; it must be at least 1"
        )));
    }
    let value = serde_json::to_value(event).map_err(|source| Error::Serialize {
        event_type: E::NAME.to_owned(),
        source,
    })?;
    let fingerprint = payload_fingerprint(E::NAME, E::VERSION, &value);
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
    // Before the INSERT draws the row's id: per aggregate, id order must be commit order.
    super::aggregate_lock::lock_aggregate_producers(
        tx,
        E::TABLE,
        aggregate_type,
        aggregate_id.as_deref(),
    )
    .await?;
    let statement = if options.notify {
        statements.enqueue_notify
    } else {
        statements.enqueue
    };
    // Bounded: each round ends in a result unless the taken key's event was deleted between
    // the insert and the look-up, which takes a purge racing this very key.
    for _ in 0..KEY_ROUNDS {
        let query = sqlx::query(statement)
            .bind(event_id)
            .bind(operation_key)
            .bind(&fingerprint[..])
            .bind(E::NAME)
            .bind(version)
            .bind(aggregate_type)
            .bind(aggregate_id.as_deref())
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
        // The key is taken: read the stored event with a new statement, whose snapshot sees it
        // even when it was committed after the insert began. (Under REPEATABLE READ the insert
        // itself reports a serialization failure instead: Error::RetryTransaction.)
        let existing: Option<(Uuid, Vec<u8>)> = sqlx::query_as(statements.existing_by_key)
            .bind(event_id)
            .fetch_optional(&mut **tx)
            .await?;
        let Some((existing_id, existing_fingerprint)) = existing else {
            // The row vanished between the two statements (purged after delivery); the key is
            // free again, so write the event as new.
            continue;
        };
        // A row written before fingerprints were canonical carries the legacy fingerprint of
        // the same payload: a command retried across the upgrade is still the same command.
        let same_payload = existing_fingerprint == fingerprint
            || existing_fingerprint
                == legacy_payload_fingerprint(E::NAME, E::VERSION, payload.get().as_bytes());
        return if same_payload {
            Ok(existing_id)
        } else {
            Err(Error::OperationKeyReused {
                operation_key: operation_key.to_owned(),
                existing_event_id: existing_id,
            })
        };
    }
    Err(Error::OperationKeyVanished {
        operation_key: operation_key.to_owned(),
        attempts: KEY_ROUNDS,
    })
}

//! The one error type of the runtime. Each variant says what went wrong and what to do.

use uuid::Uuid;

/// Errors returned by the store, the dispatcher and the worker.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The operation key was already used for an event with a different payload. Nothing was
    /// written and the caller's transaction is still usable.
    #[error(
        "operation key `{operation_key}` is already used by event {existing_event_id} with a different payload; \
         use a new key for a different business action, or send the identical payload to get the existing event back"
    )]
    OperationKeyReused {
        /// The key that was reused.
        operation_key: String,
        /// The event already stored under that key.
        existing_event_id: Uuid,
    },
    /// The serialized payload is larger than the configured limit. Nothing was written.
    #[error(
        "event `{event_type}` payload is {size} bytes, over the limit of {limit} bytes; \
         store large data elsewhere and put a reference in the event, or raise `EnqueueOptions::max_payload_bytes`"
    )]
    PayloadTooLarge {
        /// Event name.
        event_type: String,
        /// Serialized size in bytes.
        size: usize,
        /// The configured limit in bytes.
        limit: usize,
    },
    /// A payload could not be serialized to JSON.
    #[error("event `{event_type}` could not be serialized to JSON: {source}")]
    Serialize {
        /// Event name.
        event_type: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// A table name that is not a safe SQL identifier.
    #[error(
        "`{0}` is not a valid outbox table name: use 1 to 63 lowercase ASCII letters, digits and underscores, starting with a letter or underscore"
    )]
    InvalidTableName(String),
    /// The table name is a reserved key word of PostgreSQL.
    #[error(
        "`{0}` is a reserved word in PostgreSQL, and the outbox's statements do not quote table names, so every \
         statement on it would be a syntax error: choose another name, for example `{0}_outbox`"
    )]
    ReservedTableName(String),
    /// An event name or aggregate type outside the documented rule
    /// ([`crate::contract::EVENT_NAME_RULE`]). Nothing was written.
    #[error("\"{name}\" is not a valid {kind}: {problem}; use {rule}", rule = crate::contract::EVENT_NAME_RULE)]
    InvalidEventName {
        /// `event name` or `aggregate type`.
        kind: &'static str,
        /// The name, escaped and cut short for the message.
        name: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A configuration value out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Two registrations conflict, or a handler has no route.
    #[error("dispatcher: {0}")]
    Dispatcher(String),
    /// The database's contract registry disagrees with the compiled event contracts.
    #[error("contract mismatch: {0}")]
    ContractMismatch(String),
    /// Applying the embedded migrations failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The database returned an error or the connection broke.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// Result alias of the runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;

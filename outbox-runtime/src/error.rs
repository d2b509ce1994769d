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
    /// The payload or its headers are valid JSON that no worker could decode, or that PostgreSQL
    /// could not store (see [`crate::payload_limits`]). Nothing was written and the caller's
    /// transaction is still usable.
    #[error(
        "event `{event_type}` {part} was refused: {problem}; nothing was written and the transaction is still usable"
    )]
    PayloadRejected {
        /// Event name.
        event_type: String,
        /// Which part was refused.
        part: PayloadPart,
        /// What is wrong with it, and what to do.
        problem: PayloadProblem,
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

/// The part of an event that [`Error::PayloadRejected`] refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadPart {
    /// The event's payload.
    Payload,
    /// The headers stored with it (`EnqueueOptions::headers`).
    Headers,
}

impl std::fmt::Display for PayloadPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PayloadPart::Payload => "payload",
            PayloadPart::Headers => "headers",
        })
    }
}

/// Why a payload (or headers) cannot be stored or delivered; see [`crate::payload_limits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PayloadProblem {
    /// Arrays and objects are nested deeper than `limit`
    /// ([`crate::payload_limits::MAX_JSON_DEPTH`]).
    TooDeep {
        /// The deepest nesting allowed.
        limit: usize,
    },
    /// A string or key contains U+0000, which PostgreSQL's `jsonb` cannot store.
    NulCharacter,
}

impl std::fmt::Display for PayloadProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PayloadProblem::TooDeep { limit } => write!(
                f,
                "its JSON nests arrays and objects deeper than {limit} levels, the most a worker decodes \
                 (`payload_limits::MAX_JSON_DEPTH`); flatten the structure, or carry the deep part as a JSON string"
            ),
            PayloadProblem::NulCharacter => f.write_str(
                "a string or key contains the character U+0000, which PostgreSQL's jsonb cannot store; \
                 remove it, or encode the data (for example as base64)",
            ),
        }
    }
}

/// Result alias of the runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;

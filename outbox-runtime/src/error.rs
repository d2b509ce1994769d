//! The one error type of the runtime. Each variant says what went wrong and what to do.

use uuid::Uuid;

/// Errors returned by the store, the dispatcher and the worker.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The operation key was already used for an event with a different payload. Nothing was
    /// written and the caller's transaction is still usable.
    ///
    /// The message shows at most the key's first 64 characters (a key is caller data and may be
    /// long); the field holds it whole.
    #[error(
        "operation key `{}` is already used by event {existing_event_id} with a different payload; \
         use a new key for a different business action, or send the identical payload to get the existing event back",
        abbreviate(operation_key)
    )]
    OperationKeyReused {
        /// The key that was reused, whole.
        operation_key: String,
        /// The event already stored under that key.
        existing_event_id: Uuid,
    },
    /// The operation key is empty. Every enqueue with an empty key would name the same business
    /// action (one event id per table), so it is refused. Nothing was written and the caller's
    /// transaction is still usable.
    #[error(
        "the operation key of event `{event_type}` is empty; a key names one business action, \
         for example `confirm-order/<order id>`: derive it from what makes the action unique"
    )]
    OperationKeyEmpty {
        /// Event name.
        event_type: String,
    },
    /// The operation key is longer than
    /// [`MAX_OPERATION_KEY_BYTES`](crate::store::enqueue::MAX_OPERATION_KEY_BYTES). Nothing was
    /// written and the caller's transaction is still usable.
    #[error(
        "operation key `{}` is {length} bytes, over the limit of {limit} bytes; \
         a key names one business action (e.g. `place-order/<order id>`): derive a shorter one, \
         for example a hash of the long key",
        abbreviate(operation_key)
    )]
    OperationKeyTooLong {
        /// The refused key, whole.
        operation_key: String,
        /// Its length in bytes.
        length: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// The operation key was taken, but the event stored under it was deleted (purged after
    /// delivery) each time enqueue looked it up, several times in a row. Nothing was written and
    /// the caller's transaction is still usable; retrying the enqueue is safe.
    #[error(
        "operation key `{}` was taken but its event vanished before it could be read, {attempts} times in a row \
         (something deletes events as fast as they are written); retry the enqueue, and check what deletes outbox rows",
        abbreviate(operation_key)
    )]
    OperationKeyVanished {
        /// The key, whole.
        operation_key: String,
        /// Insert-and-look-up rounds tried.
        attempts: u32,
    },
    /// The event violates a unique index or constraint of the outbox table other than the event
    /// id's (an index the application added). PostgreSQL aborted the caller's transaction: roll
    /// it back; retrying the same event hits the same index.
    #[error(
        "the event violates unique constraint `{constraint}` on outbox table `{table}` (not the event id's); \
         the transaction is aborted and must be rolled back. The outbox only guarantees uniqueness of \
         operation keys: drop that index, or make it match what your events may hold"
    )]
    UniqueViolation {
        /// The outbox table.
        table: String,
        /// The violated constraint or index, as PostgreSQL names it.
        constraint: String,
    },
    /// PostgreSQL aborted the caller's transaction to keep it serializable (SQLSTATE 40001, a
    /// same-key race under REPEATABLE READ or SERIALIZABLE) or to break a deadlock (40P01).
    /// Roll the transaction back and run the whole business transaction again: a retried
    /// enqueue with the same key and payload returns the event the other transaction wrote.
    /// [`Error::is_retryable`] is true for it.
    #[error(
        "the transaction must be retried: {reason}; roll it back and run the whole business transaction again \
         (the same operation key and payload then returns the existing event)"
    )]
    RetryTransaction {
        /// What PostgreSQL reported (SQLSTATE and message).
        reason: String,
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
    #[error("migration failed: {}", migrate_message(.0))]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The database returned an error or the connection broke.
    #[error("database error: {}", database_message(.0))]
    Database(#[from] sqlx::Error),
    /// A part of a running worker panicked, and the worker stopped (see
    /// [`crate::worker::WorkerFailure`]). Events it held whose outcome was not written are
    /// delivered again after their leases; nothing is lost.
    #[error(
        "outbox worker `{worker}` stopped because its {part} panicked: {message}; events it held \
         are delivered again once their leases end. Exit and restart the service (or start a new \
         worker), and report the panic: it is a bug in the outbox or in code the worker calls \
         (the sink's `max_batch`, a metrics recorder, a tracing subscriber)"
    )]
    WorkerFailed {
        /// The worker's name.
        worker: String,
        /// The part that panicked: `claimer`, `completer`, `renewer`, `maintenance` or `listener`.
        part: &'static str,
        /// The panic's message.
        message: String,
    },
}

/// What the database said, for a person: PostgreSQL's message with its SQLSTATE, detail and
/// hint, without the server's source-code position that sqlx's `Display` appends ("at line
/// 948" names a line of PostgreSQL's C code, not of the statement); a pool that found no
/// connection says what to check.
pub fn database_message(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Database(database_error) => {
            match database_error.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                Some(pg) => {
                    let mut text = format!("{} (SQLSTATE {})", pg.message(), pg.code());
                    if let Some(detail) = pg.detail() {
                        text.push_str(&format!("; detail: {detail}"));
                    }
                    if let Some(hint) = pg.hint() {
                        text.push_str(&format!("; hint: {hint}"));
                    }
                    text
                }
                None => database_error.message().to_owned(),
            }
        }
        sqlx::Error::PoolTimedOut => "no database connection could be opened or freed within the pool's acquire \
                                      timeout: check that PostgreSQL runs and answers at the URL the pool was built \
                                      with, and that the pool is not exhausted by long transactions"
            .to_owned(),
        other => other.to_string(),
    }
}

/// [`database_message`] for the statements of a migration.
fn migrate_message(error: &sqlx::migrate::MigrateError) -> String {
    use sqlx::migrate::MigrateError as M;
    match error {
        M::Execute(e) => format!("while executing migrations: {}", database_message(e)),
        M::ExecuteMigration(e, version) => {
            format!(
                "while executing migration {version}: {}",
                database_message(e)
            )
        }
        other => other.to_string(),
    }
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

impl Error {
    /// Whether running the whole business transaction again may succeed where this one failed
    /// (a serialization failure or a deadlock: [`Error::RetryTransaction`]).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::RetryTransaction { .. })
    }

    /// Whether a statement gave up waiting for a lock (SQLSTATE 55P03, `lock_not_available`:
    /// PostgreSQL's `lock_timeout` ran out, or `NOWAIT` found the row taken). Nothing was
    /// changed by it; another transaction held what it needed.
    pub fn is_lock_timeout(&self) -> bool {
        match self {
            Error::Database(sqlx::Error::Database(e)) => e.code().as_deref() == Some("55P03"),
            _ => false,
        }
    }
}

/// How many characters of caller data (an operation key) an error message repeats.
const SHOWN_CHARS: usize = 64;

/// `text` for an error message: whole when short, else its first [`SHOWN_CHARS`] characters
/// and its length, so a message stays small whatever the caller passed.
fn abbreviate(text: &str) -> String {
    match text.char_indices().nth(SHOWN_CHARS) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}… ({} bytes)", &text[..cut], text.len()),
    }
}

/// Result alias of the runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;

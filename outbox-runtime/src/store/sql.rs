//! The SQL text of every statement against an outbox table, one `.sql` file each, and their
//! rendering for a table name.
//!
//! The files name the default table through the visible placeholder
//! `/* TEMPLATE: table */outbox`, so each file is valid SQL for `outbox` as it stands. For another
//! table the placeholder is replaced once, when the table's `Statements` are first built, and
//! the rendered set is kept for the life of the process (see `statements`).

use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};

use crate::error::{Error, Result};

/// The placeholder every statement file writes in place of the table name.
pub const TABLE_PLACEHOLDER: &str = "/* TEMPLATE: table */outbox";

/// The event table and its queue table, with their indexes and the invariants the database
/// keeps between them (a template).
pub(crate) const CREATE_TABLE: &str = concat!(
    include_str!("sql/create_table.sql"),
    "\n",
    include_str!("sql/create_queue_table.sql"),
    "\n",
    include_str!("sql/create_queue_invariants.sql")
);
/// The invariants alone, for a table created before them: the trigger that gives every
/// inserted event its queue row and the foreign key from a queue row to its event (a template;
/// `migrations/0005_queue_invariants.sql` is it for `outbox`).
pub(crate) const QUEUE_INVARIANTS: &str = include_str!("sql/create_queue_invariants.sql");
/// The upgrade of a table of the one-table layout to the split layout: the queue table, then
/// the move of the state (a template; `migrations/0004_split_layout.sql` is it for `outbox`).
pub(crate) const UPGRADE_SPLIT_LAYOUT: &str = concat!(
    include_str!("sql/create_queue_table.sql"),
    "\n",
    include_str!("sql/upgrade_split_layout.sql")
);
/// Transactional write of one event.
pub(crate) const ENQUEUE: &str = include_str!("sql/enqueue.sql");
/// Transactional write of one event with a wake-up notification on commit: the same INSERT
/// with a RETURNING clause that queues the notification.
pub(crate) const ENQUEUE_NOTIFY: &str = concat!(
    include_str!("sql/enqueue.sql"),
    include_str!("sql/enqueue_notify.sql")
);
/// The enqueue's per-aggregate producer lock, taken before the INSERT draws the row's id.
pub(crate) const LOCK_AGGREGATE: &str = include_str!("sql/lock_aggregate.sql");
/// A wake-up notification on its own, after commit (see `waker::Waker`).
pub(crate) const WAKE: &str = include_str!("sql/wake.sql");
/// Enqueue fallback: the event stored under a key, with a fresh snapshot.
pub(crate) const EXISTING_BY_KEY: &str = include_str!("sql/existing_by_key.sql");
/// Claim a batch.
pub(crate) const CLAIM_BATCH: &str = include_str!("sql/claim_batch.sql");
/// Claim a batch, keeping the order of events within an aggregate.
pub(crate) const CLAIM_BATCH_ORDERED: &str = include_str!("sql/claim_batch_ordered.sql");
/// Claim a batch of the events a sink handles (its event names and versions).
pub(crate) const CLAIM_BATCH_HANDLED: &str = include_str!("sql/claim_batch_handled.sql");
/// Claim a batch of the events a sink handles, keeping the order within an aggregate.
pub(crate) const CLAIM_BATCH_ORDERED_HANDLED: &str =
    include_str!("sql/claim_batch_ordered_handled.sql");
/// The events that wait for a worker: ready pending events no live worker claims.
pub(crate) const UNHANDLED_EVENTS: &str = include_str!("sql/unhandled_events.sql");
/// A worker's heartbeat in `outbox_workers` (the shared table names the outbox table as a
/// value: no template).
pub(crate) const WORKER_HEARTBEAT: &str = include_str!("sql/worker_heartbeat.sql");
/// A worker leaves `outbox_workers`.
pub(crate) const WORKER_LEAVE: &str = include_str!("sql/worker_leave.sql");
/// Fenced completion of one claim.
pub(crate) const COMPLETE: &str = include_str!("sql/complete.sql");
/// Fenced completion of many claims.
pub(crate) const COMPLETE_MANY: &str = include_str!("sql/complete_many.sql");
/// Fenced completion of many claims that deletes the rows (retention zero).
pub(crate) const COMPLETE_MANY_DELETE: &str = include_str!("sql/complete_many_delete.sql");
/// Which claims of a batch an earlier completion by the same claim settled (a lost answer).
pub(crate) const COMPLETED_EARLIER: &str = include_str!("sql/completed_earlier.sql");
/// Fenced lease renewal of one claim.
pub(crate) const RENEW: &str = include_str!("sql/renew.sql");
/// Fenced lease renewal of many claims.
pub(crate) const RENEW_MANY: &str = include_str!("sql/renew_many.sql");
/// Lock the rows of a batch no other transaction holds, skipping the held ones (before a
/// batched renewal).
pub(crate) const LOCK_FREE_ROWS: &str = include_str!("sql/lock_free_rows.sql");
/// Fenced failure with retry or exhaustion.
pub(crate) const FAIL: &str = include_str!("sql/fail.sql");
/// Fenced hand-back without charging the attempt.
pub(crate) const RELEASE: &str = include_str!("sql/release.sql");
/// Fenced exhaustion of a claimed row that cannot be decoded.
pub(crate) const EXHAUST_UNDECODABLE: &str = include_str!("sql/exhaust_undecodable.sql");
/// Recovery of expired leases.
pub(crate) const RECOVER_EXPIRED: &str = include_str!("sql/recover_expired.sql");
/// The delivered rows still kept (operators only).
pub(crate) const COUNT_DELIVERED: &str = include_str!("sql/count_delivered.sql");
/// The queue gauges (stats without the delivered count).
pub(crate) const GAUGES: &str = include_str!("sql/gauges.sql");
/// Operator retry of one exhausted event.
pub(crate) const RETRY_EXHAUSTED: &str = include_str!("sql/retry_exhausted.sql");
/// Operator retry of every exhausted event of a type.
pub(crate) const RETRY_EXHAUSTED_OF_TYPE: &str = include_str!("sql/retry_exhausted_of_type.sql");
/// Operator listing of exhausted events.
pub(crate) const EXHAUSTED_EVENTS: &str = include_str!("sql/exhausted_events.sql");
/// Bounded deletion of delivered events past retention.
pub(crate) const PURGE_DELIVERED: &str = include_str!("sql/purge_delivered.sql");
/// Where one event stands, by its event id.
pub(crate) const EVENT_STATUS: &str = include_str!("sql/event_status.sql");
/// Every event of the table in id order (the test kit's assertions).
pub(crate) const LIST_EVENTS: &str = include_str!("sql/list_events.sql");
/// Delayed pending events made claimable now (the test kit's drain).
pub(crate) const MAKE_DELAYED_DUE: &str = include_str!("sql/make_delayed_due.sql");

/// The operator dashboard's reads (`outbox_runtime::dashboard`), one file each under
/// `sql/dashboard/`, with the same table placeholder. Its actions (retry, purge) run the store's
/// own statements above.
pub mod dashboard {
    /// Delivered events (no queue row) counted up to a cap, and the planner's row count of the
    /// event table.
    pub const DELIVERED_COUNT: &str = include_str!("sql/dashboard/delivered_count.sql");
    /// Events enqueued per minute over the last hour, and how many of them are delivered or
    /// exhausted by now (not a delivery rate: a delivered event keeps no delivery time).
    pub const THROUGHPUT: &str = include_str!("sql/dashboard/throughput.sql");
    /// Events not delivered by status, their failures and last failure, and the last hour's
    /// enqueues, per event type and version.
    pub const EVENT_TYPES: &str = include_str!("sql/dashboard/event_types.sql");
    /// Failing and exhausted events, filtered.
    pub const FAILURES: &str = include_str!("sql/dashboard/failures.sql");
    /// One event and, while it is not delivered, its queue row.
    pub const EVENT: &str = include_str!("sql/dashboard/event.sql");
    /// The live claims.
    pub const CLAIMS: &str = include_str!("sql/dashboard/claims.sql");

    /// Every dashboard statement with its name (for EXPLAIN, like [`super::STATEMENTS`]).
    pub const STATEMENTS: &[(&str, &str)] = &[
        ("dashboard/delivered_count", DELIVERED_COUNT),
        ("dashboard/throughput", THROUGHPUT),
        ("dashboard/event_types", EVENT_TYPES),
        ("dashboard/failures", FAILURES),
        ("dashboard/event", EVENT),
        ("dashboard/claims", CLAIMS),
    ];
}

/// The WAL relay's reads of the server (`store::relay_server`), one file each under
/// `sql/relay/`; no table placeholder.
pub mod relay {
    /// The settings and the role attribute a relay needs, read at its start.
    pub const SERVER_SETTINGS: &str = include_str!("sql/relay/server_settings.sql");
}

/// `outbox doctor`'s reads and repairs (`store::integrity`), one file each under
/// `sql/integrity/`, with the same table placeholder.
pub mod integrity {
    /// Whether the table's invariants (the trigger, the foreign key) are in place and on.
    pub const RULES: &str = include_str!("sql/integrity/rules.sql");
    /// Queue rows whose event is gone, counted and listed.
    pub const ORPHAN_QUEUE_ROWS: &str = include_str!("sql/integrity/orphan_queue_rows.sql");
    /// Events without a queue row, streamed with what tells who wrote them.
    pub const UNQUEUED_EVENTS: &str = include_str!("sql/integrity/unqueued_events.sql");
    /// Delete the queue rows whose event is gone.
    pub const DELETE_ORPHANS: &str = include_str!("sql/integrity/delete_orphans.sql");
    /// Give listed events their queue row.
    pub const REQUEUE_EVENTS: &str = include_str!("sql/integrity/requeue_events.sql");
    /// Validate the foreign key added NOT VALID.
    pub const VALIDATE_KEY: &str = include_str!("sql/integrity/validate_key.sql");

    /// Every doctor statement with its name (for EXPLAIN, like [`super::STATEMENTS`]).
    pub const STATEMENTS: &[(&str, &str)] = &[
        ("integrity/rules", RULES),
        ("integrity/orphan_queue_rows", ORPHAN_QUEUE_ROWS),
        ("integrity/unqueued_events", UNQUEUED_EVENTS),
        ("integrity/delete_orphans", DELETE_ORPHANS),
        ("integrity/requeue_events", REQUEUE_EVENTS),
    ];
}

/// Every statement template with its name (used by the EXPLAIN test in `tests/store_schema.rs`;
/// render one with `template.replace(TABLE_PLACEHOLDER, table)`).
pub const STATEMENTS: &[(&str, &str)] = &[
    ("enqueue", ENQUEUE),
    ("enqueue_notify", ENQUEUE_NOTIFY),
    ("lock_aggregate", LOCK_AGGREGATE),
    ("wake", WAKE),
    ("existing_by_key", EXISTING_BY_KEY),
    ("claim_batch", CLAIM_BATCH),
    ("claim_batch_ordered", CLAIM_BATCH_ORDERED),
    ("claim_batch_handled", CLAIM_BATCH_HANDLED),
    ("claim_batch_ordered_handled", CLAIM_BATCH_ORDERED_HANDLED),
    ("complete", COMPLETE),
    ("complete_many", COMPLETE_MANY),
    ("complete_many_delete", COMPLETE_MANY_DELETE),
    ("completed_earlier", COMPLETED_EARLIER),
    ("renew", RENEW),
    ("renew_many", RENEW_MANY),
    ("lock_free_rows", LOCK_FREE_ROWS),
    ("fail", FAIL),
    ("release", RELEASE),
    ("exhaust_undecodable", EXHAUST_UNDECODABLE),
    ("recover_expired", RECOVER_EXPIRED),
    ("count_delivered", COUNT_DELIVERED),
    ("gauges", GAUGES),
    ("unhandled_events", UNHANDLED_EVENTS),
    ("retry_exhausted", RETRY_EXHAUSTED),
    ("retry_exhausted_of_type", RETRY_EXHAUSTED_OF_TYPE),
    ("exhausted_events", EXHAUSTED_EVENTS),
    ("purge_delivered", PURGE_DELIVERED),
    ("event_status", EVENT_STATUS),
    ("list_events", LIST_EVENTS),
    ("make_delayed_due", MAKE_DELAYED_DUE),
];

/// The longest suffix the table template appends to the table name (`_queue_aggregate_idx`,
/// `_queue_exhausted_idx`).
/// PostgreSQL silently truncates identifiers to 63 bytes, which could make two index names
/// collide, so [`render_create_table`] refuses names that leave no room for it.
const LONGEST_INDEX_SUFFIX: usize = "_queue_aggregate_idx".len();

/// The suffix of an outbox table's queue table (`{table}_queue`).
pub const QUEUE_SUFFIX: &str = "_queue";

/// Key words PostgreSQL 15 reserves (the "reserved" and "reserved (can be function or type)"
/// entries of the SQL Key Words appendix, lowercased): unquoted, none of them can name a table.
/// The one list: `#[derive(Event)]` refuses a `table = "..."` on it at compile time through
/// `macro_support::refuse_reserved_table_name`.
pub(crate) const RESERVED_WORDS: &[&str] = &[
    "all",
    "analyse",
    "analyze",
    "and",
    "any",
    "array",
    "as",
    "asc",
    "asymmetric",
    "authorization",
    "binary",
    "both",
    "case",
    "cast",
    "check",
    "collate",
    "collation",
    "column",
    "concurrently",
    "constraint",
    "create",
    "cross",
    "current_catalog",
    "current_date",
    "current_role",
    "current_schema",
    "current_time",
    "current_timestamp",
    "current_user",
    "default",
    "deferrable",
    "desc",
    "distinct",
    "do",
    "else",
    "end",
    "except",
    "false",
    "fetch",
    "for",
    "foreign",
    "freeze",
    "from",
    "full",
    "grant",
    "group",
    "having",
    "ilike",
    "in",
    "initially",
    "inner",
    "intersect",
    "into",
    "is",
    "isnull",
    "join",
    "lateral",
    "leading",
    "left",
    "like",
    "limit",
    "localtime",
    "localtimestamp",
    "natural",
    "not",
    "notnull",
    "null",
    "offset",
    "on",
    "only",
    "or",
    "order",
    "outer",
    "overlaps",
    "placing",
    "primary",
    "references",
    "returning",
    "right",
    "select",
    "session_user",
    "similar",
    "some",
    "symmetric",
    "table",
    "tablesample",
    "then",
    "to",
    "trailing",
    "true",
    "union",
    "unique",
    "user",
    "using",
    "variadic",
    "verbose",
    "when",
    "where",
    "window",
    "with",
];

/// Check that `table` is a safe, unquoted SQL identifier ([`validate_identifier`]) that does not
/// end in `_queue`, the suffix of every outbox table's queue table (`orders_queue` would be the
/// queue table of `orders`).
pub fn validate_table_name(table: &str) -> Result<()> {
    validate_identifier(table)?;
    // After the identifier rule, so the message only ever repeats a plain name.
    if let Some(stem) = table.strip_suffix(QUEUE_SUFFIX) {
        return Err(Error::Config(format!(
            "outbox table name `{table}` ends in `{QUEUE_SUFFIX}`, the suffix of the queue table \
             every outbox table has (`{table}` would be the queue table of `{stem}`): choose a name \
             that does not end in `{QUEUE_SUFFIX}`"
        )));
    }
    Ok(())
}

/// Check that `name` is a safe, unquoted SQL identifier: 1 to 63 characters of
/// `[a-z_][a-z0-9_]*` and not a reserved key word (statements splice it in unquoted). The table
/// name rule without its `_queue` suffix, which only tables reserve (role names follow this).
pub fn validate_identifier(name: &str) -> Result<()> {
    if RESERVED_WORDS.contains(&name) {
        return Err(Error::ReservedTableName(name.to_owned()));
    }
    let mut chars = name.chars();
    let first_ok = matches!(chars.next(), Some('a'..='z' | '_'));
    let rest_ok = chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'));
    if first_ok && rest_ok && name.len() <= 63 {
        Ok(())
    } else {
        Err(Error::InvalidTableName(name.to_owned()))
    }
}

/// Replace the table placeholder of a statement template. `table` must be validated.
pub(crate) fn render(template: &str, table: &str) -> String {
    template.replace(TABLE_PLACEHOLDER, table)
}

/// The DDL of an outbox table named `table`: the event table, its queue table and their
/// indexes, `IF NOT EXISTS`.
pub(crate) fn render_create_table(table: &str) -> Result<String> {
    check_index_room(table)?;
    Ok(render(CREATE_TABLE, table))
}

/// The upgrade of an existing outbox table named `table` from the one-table layout to the split
/// layout (the queue table, the move of the state, the dropped columns), for a migration's
/// transaction.
pub(crate) fn render_upgrade_split_layout(table: &str) -> Result<String> {
    check_index_room(table)?;
    Ok(render(UPGRADE_SPLIT_LAYOUT, table))
}

/// The invariants of [`QUEUE_INVARIANTS`] for an existing outbox table named `table`.
pub(crate) fn render_queue_invariants(table: &str) -> Result<String> {
    check_index_room(table)?;
    Ok(render(QUEUE_INVARIANTS, table))
}

/// A valid table name that leaves room for the longest index name derived from it.
fn check_index_room(table: &str) -> Result<()> {
    validate_table_name(table)?;
    if table.len() + LONGEST_INDEX_SUFFIX > 63 {
        return Err(Error::Config(format!(
            "outbox table name `{table}` is {} characters; its index names would exceed PostgreSQL's 63-character limit, \
             so use a table name of at most {} characters",
            table.len(),
            63 - LONGEST_INDEX_SUFFIX
        )));
    }
    Ok(())
}

/// The statements of one table, rendered once.
#[derive(Debug)]
pub(crate) struct Statements {
    pub enqueue: &'static str,
    pub enqueue_notify: &'static str,
    pub lock_aggregate: &'static str,
    pub wake: &'static str,
    pub existing_by_key: &'static str,
    pub claim_batch: &'static str,
    pub claim_batch_ordered: &'static str,
    pub claim_batch_handled: &'static str,
    pub claim_batch_ordered_handled: &'static str,
    pub complete: &'static str,
    pub complete_many: &'static str,
    pub complete_many_delete: &'static str,
    pub completed_earlier: &'static str,
    pub renew: &'static str,
    pub renew_many: &'static str,
    pub lock_free_rows: &'static str,
    pub fail: &'static str,
    pub release: &'static str,
    pub exhaust_undecodable: &'static str,
    pub recover_expired: &'static str,
    pub count_delivered: &'static str,
    pub gauges: &'static str,
    pub unhandled_events: &'static str,
    pub retry_exhausted: &'static str,
    pub retry_exhausted_of_type: &'static str,
    pub exhausted_events: &'static str,
    pub purge_delivered: &'static str,
    pub event_status: &'static str,
    pub list_events: &'static str,
    pub make_delayed_due: &'static str,
}

impl Statements {
    fn render(table: &str) -> Statements {
        // Leaked on purpose: one set per table name for the life of the process (a handful of
        // tables at most), which lets sqlx take them as `&'static str` and cache their
        // prepared statements per connection.
        let r = |template: &str| -> &'static str {
            Box::leak(render(template, table).into_boxed_str())
        };
        Statements {
            enqueue: r(ENQUEUE),
            enqueue_notify: r(ENQUEUE_NOTIFY),
            lock_aggregate: r(LOCK_AGGREGATE),
            wake: r(WAKE),
            existing_by_key: r(EXISTING_BY_KEY),
            claim_batch: r(CLAIM_BATCH),
            claim_batch_ordered: r(CLAIM_BATCH_ORDERED),
            claim_batch_handled: r(CLAIM_BATCH_HANDLED),
            claim_batch_ordered_handled: r(CLAIM_BATCH_ORDERED_HANDLED),
            complete: r(COMPLETE),
            complete_many: r(COMPLETE_MANY),
            complete_many_delete: r(COMPLETE_MANY_DELETE),
            completed_earlier: r(COMPLETED_EARLIER),
            renew: r(RENEW),
            renew_many: r(RENEW_MANY),
            lock_free_rows: r(LOCK_FREE_ROWS),
            fail: r(FAIL),
            release: r(RELEASE),
            exhaust_undecodable: r(EXHAUST_UNDECODABLE),
            recover_expired: r(RECOVER_EXPIRED),
            count_delivered: r(COUNT_DELIVERED),
            gauges: r(GAUGES),
            unhandled_events: r(UNHANDLED_EVENTS),
            retry_exhausted: r(RETRY_EXHAUSTED),
            retry_exhausted_of_type: r(RETRY_EXHAUSTED_OF_TYPE),
            exhausted_events: r(EXHAUSTED_EVENTS),
            purge_delivered: r(PURGE_DELIVERED),
            event_status: r(EVENT_STATUS),
            list_events: r(LIST_EVENTS),
            make_delayed_due: r(MAKE_DELAYED_DUE),
        }
    }
}

/// The rendered statements of `table`, built on first use and cached for the process.
pub(crate) fn statements(table: &str) -> Result<&'static Statements> {
    static CACHE: OnceLock<RwLock<HashMap<String, &'static Statements>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(found) = cache.read().unwrap_or_else(|e| e.into_inner()).get(table) {
        return Ok(found);
    }
    validate_table_name(table)?;
    let mut write = cache.write().unwrap_or_else(|e| e.into_inner());
    let entry = write
        .entry(table.to_owned())
        .or_insert_with(|| Box::leak(Box::new(Statements::render(table))));
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_words_are_refused_with_a_suggestion() {
        for word in ["order", "user", "select", "table", "left"] {
            let error = validate_table_name(word).unwrap_err();
            assert!(matches!(error, Error::ReservedTableName(_)), "{word}");
            assert!(
                error.to_string().contains(&format!("`{word}_outbox`")),
                "{error}"
            );
        }
        // Reserved only as whole words: names that contain one are fine.
        for ok in ["orders", "user_outbox", "order_events"] {
            assert!(validate_table_name(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn a_name_that_would_be_another_tables_queue_is_refused() {
        let error = validate_table_name("orders_queue").unwrap_err().to_string();
        assert!(
            error.contains("queue table of `orders`") && error.contains("does not end in `_queue`"),
            "{error}"
        );
        for ok in ["queue", "orders_queued", "queue_orders"] {
            assert!(validate_table_name(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn table_names_are_checked() {
        for ok in ["outbox", "_x", "orders_outbox_2", &"a".repeat(63)] {
            assert!(validate_table_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Outbox",
            "1outbox",
            "out-box",
            "out box",
            "outbox;drop",
            "é",
            &"a".repeat(64),
        ] {
            assert!(
                matches!(validate_table_name(bad), Err(Error::InvalidTableName(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn every_statement_names_the_table_only_through_the_placeholder() {
        for (name, sql) in STATEMENTS.iter().chain(dashboard::STATEMENTS.iter()).chain(
            [
                ("create_table", CREATE_TABLE),
                ("upgrade", UPGRADE_SPLIT_LAYOUT),
            ]
            .iter(),
        ) {
            // The wake-up names no table: its channel is a parameter. The aggregate lock takes
            // the table as a parameter too (its oid seeds the lock key; the statement reads no
            // table).
            assert!(
                sql.contains(TABLE_PLACEHOLDER) || ["wake", "lock_aggregate"].contains(name),
                "{name} has no table placeholder"
            );
            let rendered = render(sql, "zz_table");
            let code: String = rendered
                .lines()
                .map(|l| l.split("--").next().unwrap_or(""))
                .collect();
            // `outbox_workers` is the one table every outbox table shares.
            assert!(
                !code.replace("outbox_workers", "").contains("outbox"),
                "{name} names the table `outbox` outside the placeholder"
            );
        }
    }

    #[test]
    fn statements_are_rendered_once_per_table() {
        let a = statements("render_once").unwrap();
        let b = statements("render_once").unwrap();
        assert!(std::ptr::eq(a, b));
        assert!(a.claim_batch.contains("UPDATE render_once_queue AS q"));
        assert!(statements("Bad").is_err());
    }

    #[test]
    fn long_names_leave_room_for_index_names() {
        assert!(render_create_table(&"a".repeat(43)).is_ok());
        assert!(matches!(
            render_create_table(&"a".repeat(44)),
            Err(Error::Config(_))
        ));
        assert!(matches!(
            render_upgrade_split_layout(&"a".repeat(44)),
            Err(Error::Config(_))
        ));
    }

    proptest::proptest! {
        /// Arbitrary text is a table name only when it is a plain lowercase identifier of at
        /// most 63 bytes and no reserved word: nothing else can reach the statements' text.
        #[test]
        fn arbitrary_text_is_a_table_name_only_when_a_plain_identifier(
            table in "\\PC{0,20}|[a-z_][a-z0-9_]{0,70}|[a-z ;'\"-]{1,20}",
        ) {
            let plain = table.len() <= 63
                && table.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                && table.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            let accepted = validate_table_name(&table).is_ok();
            proptest::prop_assert_eq!(accepted, plain && !RESERVED_WORDS.contains(&table.as_str()) && !table.ends_with(QUEUE_SUFFIX), "{:?}", table);
        }
    }
}

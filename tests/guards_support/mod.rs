//! The machinery behind `tests/store_guards.rs`: a witness builder, and a runner that plays one
//! witness in a transaction of its own (rolled back), against the statement as written and
//! against the statement with one predicate replaced by `TRUE` (or one clause by its weaker
//! spelling).
//!
//! A witness's rows are events of the default table `outbox`, each with its queue row in
//! `outbox_queue` (pending by default) or, for a delivered event, without one.

pub mod parse;

use std::collections::BTreeMap;

use sqlx::{Connection, PgConnection, Row};

/// A parameter of a statement, bound in order as `$1`, `$2`, ...
#[derive(Debug, Clone)]
pub enum Param {
    /// The id of a row set up by the witness.
    Id(&'static str),
    /// The ids of rows set up by the witness, as a `bigint[]`.
    Ids(&'static [&'static str]),
    /// The event_id of a row set up by the witness.
    EventId(&'static str),
    /// An event_id no row has.
    NoEventId,
    Int(i64),
    /// An `integer` (int4) parameter.
    Int4(i32),
    Bytes(&'static [u8]),
    Json(&'static str),
    /// A `text` NULL.
    NullText,
    Ints(&'static [i64]),
    /// A `text[]` parameter.
    Texts(&'static [&'static str]),
    /// An `integer[]` (int4) parameter.
    Int4s(&'static [i32]),
    Text(&'static str),
    Bool(bool),
}

/// What a statement did to one event set up by the witness, or which rows it added.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    /// The event or its queue row changed (or it gained a queue row).
    Updated(&'static str),
    /// The queue row was deleted and the event kept: delivered.
    Dequeued(&'static str),
    /// The event was deleted (with its queue row, if it had one).
    Deleted(&'static str),
    /// A row no witness set up: `"event"` or `"queue row"`, one entry per row.
    Added(&'static str),
}

/// How a run of a statement ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It ran and changed these rows.
    Changed(Vec<Change>),
    /// It failed with this SQLSTATE.
    Failed(String),
}

/// Whether a witness state is one the schema allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Legality {
    /// Any row state the schema's constraints accept.
    Legal,
    /// The only state in which the predicate decides breaks the CHECK that ties the queue row's
    /// `status` to `exhausted_at`: the runner first shows the setup is refused (SQLSTATE 23514),
    /// then drops that CHECK inside the rolled-back transaction and plays the witness. Such a
    /// predicate is implied by the status predicate beside it and is there for the partial
    /// index; the witness still shows it filters.
    ForbiddenBySchema,
}

/// Evidence that one predicate of one statement matters.
#[derive(Debug, Clone)]
pub struct Witness {
    pub statement: &'static str,
    /// The predicate's text, whitespace collapsed, as in the SQL file; ` #2` suffix for the
    /// second occurrence of the same text in one statement. For a clause witness (see
    /// [`Witness::clause`]), the clause's text.
    pub predicate: &'static str,
    /// For a clause witness: what replaces the clause in the mutant.
    pub replacement: Option<&'static str>,
    /// Statements run before the rows are set up (in the rolled-back transaction).
    pub setup: Vec<&'static str>,
    /// Events inserted in this order (so ids ascend): a label, the SET list applied to a default
    /// pending event (see [`insert_row`]), and whether it has its queue row (false: delivered).
    pub rows: Vec<(&'static str, &'static str, bool)>,
    pub params: Vec<Param>,
    /// What the statement as written does.
    pub real: Outcome,
    /// What it does with the predicate replaced by `TRUE`.
    pub without: Outcome,
    pub legality: Legality,
    /// Set when no row state can make the predicate decide: why (it is then kept for an index,
    /// and the runner checks that removing it changes nothing on the witness's rows).
    pub implied: Option<&'static str>,
}

/// A witness of `predicate` of `statement`; the builder methods fill in the rest.
pub fn witness(statement: &'static str, predicate: &'static str) -> Witness {
    Witness {
        statement,
        predicate,
        replacement: None,
        setup: Vec::new(),
        rows: Vec::new(),
        params: Vec::new(),
        real: Outcome::Changed(Vec::new()),
        without: Outcome::Changed(Vec::new()),
        legality: Legality::Legal,
        implied: None,
    }
}

impl Witness {
    /// A witness of a clause that is not a WHERE predicate (the enqueue's `ON CONFLICT`): the
    /// mutant replaces `clause` (whitespace collapsed, as in the SQL file) by `replacement`.
    pub fn clause(mut self, replacement: &'static str) -> Self {
        self.replacement = Some(replacement);
        self
    }
    /// Run `sql` before the rows are set up.
    pub fn setup(mut self, sql: &'static str) -> Self {
        self.setup.push(sql);
        self
    }
    /// An event with its queue row: `set` assigns columns of either table (an aggregate goes to
    /// both, as the enqueue copies it).
    pub fn row(mut self, label: &'static str, set: &'static str) -> Self {
        self.rows.push((label, set, true));
        self
    }
    /// A delivered event: no queue row; `set` assigns event columns.
    pub fn delivered(mut self, label: &'static str, set: &'static str) -> Self {
        self.rows.push((label, set, false));
        self
    }
    pub fn params(mut self, params: impl IntoIterator<Item = Param>) -> Self {
        self.params = params.into_iter().collect();
        self
    }
    /// What the real statement changes (default: nothing).
    pub fn real(mut self, changes: impl IntoIterator<Item = Change>) -> Self {
        self.real = Outcome::Changed(changes.into_iter().collect());
        self
    }
    /// The real statement fails with `sqlstate`.
    pub fn real_fails(mut self, sqlstate: &'static str) -> Self {
        self.real = Outcome::Failed(sqlstate.to_owned());
        self
    }
    /// What the statement without the predicate changes.
    pub fn without(mut self, changes: impl IntoIterator<Item = Change>) -> Self {
        self.without = Outcome::Changed(changes.into_iter().collect());
        self
    }
    /// The statement without the predicate fails with `sqlstate`.
    pub fn without_fails(mut self, sqlstate: &'static str) -> Self {
        self.without = Outcome::Failed(sqlstate.to_owned());
        self
    }
    pub fn forbidden_by_schema(mut self) -> Self {
        self.legality = Legality::ForbiddenBySchema;
        self
    }
    pub fn implied(mut self, why: &'static str) -> Self {
        self.implied = Some(why);
        self
    }
    /// `statement / predicate`, for messages.
    pub fn name(&self) -> String {
        format!("{} / {}", self.statement, self.predicate)
    }
}

/// Columns of the event table a SET list may assign; every other column is the queue row's.
/// The aggregate is both's: the enqueue copies it to the queue row for the ordered claim.
const EVENT_COLUMNS: &[&str] = &[
    "operation_key",
    "event_type",
    "event_version",
    "aggregate_type",
    "aggregate_id",
    "aggregate_version",
    "payload",
    "headers",
    "created_at",
];
const SHARED_COLUMNS: &[&str] = &["aggregate_type", "aggregate_id"];

/// The assignments of a SET list, split at top-level commas (none of the witnesses' values
/// holds a comma outside parentheses or quotes).
fn assignments(set: &str) -> Vec<&str> {
    let (mut out, mut depth, mut quoted, mut start) = (Vec::new(), 0_i32, false, 0);
    for (at, c) in set.char_indices() {
        match c {
            '\'' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                out.push(set[start..at].trim());
                start = at + 1;
            }
            _ => {}
        }
    }
    out.push(set[start..].trim());
    out.retain(|a| !a.is_empty());
    out
}

/// `set`'s assignments to the event table and to the queue table, as two SET lists.
fn split_set(set: &str) -> (String, String) {
    let (mut event, mut queue) = (Vec::new(), Vec::new());
    for assignment in assignments(set) {
        let column = assignment.split('=').next().unwrap_or("").trim();
        if EVENT_COLUMNS.contains(&column) {
            event.push(assignment);
        }
        if !EVENT_COLUMNS.contains(&column) || SHARED_COLUMNS.contains(&column) {
            queue.push(assignment);
        }
    }
    (event.join(", "), queue.join(", "))
}

/// Insert a default pending event (event type `witness.event`, no aggregate) and, when
/// `queued`, keep its queue row (pending, max_attempts 3; without, the event reads as delivered), then apply `set` to them; returns
/// (id, event_id).
async fn insert_row(
    conn: &mut PgConnection,
    label: &str,
    set: &str,
    queued: bool,
) -> Result<(i64, uuid::Uuid), sqlx::Error> {
    let row = sqlx::query(
        "INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, \
         event_version, payload) \
         VALUES (gen_random_uuid(), $1, '\\x00', 'witness.event', 1, '{}') \
         RETURNING id, event_id",
    )
    .bind(label)
    .fetch_one(&mut *conn)
    .await?;
    let id: i64 = row.get(0);
    // The insert gave the event its pending queue row (the table's trigger): set its
    // attempts, or delete it for an event without one (delivered).
    let queue_row = if queued {
        "UPDATE outbox_queue SET max_attempts = 3 WHERE id = $1"
    } else {
        "DELETE FROM outbox_queue WHERE id = $1"
    };
    sqlx::query(queue_row).bind(id).execute(&mut *conn).await?;
    let (event_set, queue_set) = split_set(set);
    for (table, set) in [("outbox", event_set), ("outbox_queue", queue_set)] {
        if set.is_empty() {
            continue;
        }
        let done = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {table} SET {set} WHERE id = $1"
        )))
        .bind(id)
        .execute(&mut *conn)
        .await?;
        assert_eq!(
            done.rows_affected(),
            1,
            "`{label}`: {set} names the queue row of a delivered event"
        );
    }
    Ok((id, row.get(1)))
}

/// Every row of one table, as JSON by id.
async fn rows_of(conn: &mut PgConnection, table: &str) -> BTreeMap<i64, String> {
    sqlx::query_as::<_, (i64, String)>(sqlx::AssertSqlSafe(format!(
        "SELECT id, to_jsonb(t)::text FROM {table} t ORDER BY id"
    )))
    .fetch_all(&mut *conn)
    .await
    .unwrap_or_else(|e| panic!("reading {table}: {e}"))
    .into_iter()
    .collect()
}

/// The events and the queue rows.
#[derive(Debug, Clone, PartialEq)]
struct Snapshot {
    events: BTreeMap<i64, String>,
    queue: BTreeMap<i64, String>,
}

async fn snapshot(conn: &mut PgConnection) -> Snapshot {
    Snapshot {
        events: rows_of(conn, "outbox").await,
        queue: rows_of(conn, "outbox_queue").await,
    }
}

type Labels = BTreeMap<&'static str, (i64, uuid::Uuid)>;

fn changes(labels: &Labels, before: &Snapshot, after: &Snapshot) -> Vec<Change> {
    let mut out = Vec::new();
    for (label, (id, _)) in labels {
        let event = (before.events.get(id), after.events.get(id));
        let queue = (before.queue.get(id), after.queue.get(id));
        match (event, queue) {
            ((Some(_), None), _) => out.push(Change::Deleted(label)),
            (_, (Some(_), None)) => out.push(Change::Dequeued(label)),
            ((a, b), (c, d)) if a != b || c != d => out.push(Change::Updated(label)),
            _ => {}
        }
    }
    let added = |before: &BTreeMap<i64, String>, after: &BTreeMap<i64, String>| {
        after.keys().filter(|id| !before.contains_key(id)).count()
    };
    for (name, count) in [
        ("event", added(&before.events, &after.events)),
        ("queue row", added(&before.queue, &after.queue)),
    ] {
        out.extend(std::iter::repeat_n(Change::Added(name), count));
    }
    out.sort();
    out
}

/// Run `sql` with the witness's parameters; returns the SQLSTATE when it fails.
async fn execute(
    conn: &mut PgConnection,
    sql: &str,
    params: &[Param],
    labels: &Labels,
) -> Result<Option<String>, String> {
    let id_of = |label: &str| {
        labels.get(label).copied().ok_or_else(|| {
            format!("parameter names row `{label}`, which the witness does not set up")
        })
    };
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()));
    for param in params {
        query = match param {
            Param::Id(label) => query.bind(id_of(label)?.0),
            Param::Ids(list) => query.bind(
                list.iter()
                    .map(|l| id_of(l).map(|r| r.0))
                    .collect::<Result<Vec<i64>, _>>()?,
            ),
            Param::EventId(label) => query.bind(id_of(label)?.1),
            Param::NoEventId => query.bind(uuid::Uuid::nil()),
            Param::Int(v) => query.bind(*v),
            Param::Int4(v) => query.bind(*v),
            Param::Texts(v) => query.bind(v.to_vec()),
            Param::Int4s(v) => query.bind(v.to_vec()),
            Param::Bytes(v) => query.bind(v.to_vec()),
            Param::Json(v) => query.bind(
                serde_json::from_str::<serde_json::Value>(v)
                    .map_err(|e| format!("a JSON parameter does not parse: {e}"))?,
            ),
            Param::NullText => query.bind(None::<String>),
            Param::Ints(v) => query.bind(v.to_vec()),
            Param::Text(v) => query.bind(*v),
            Param::Bool(v) => query.bind(*v),
        };
    }
    match query.execute(&mut *conn).await {
        Ok(_) => Ok(None),
        Err(sqlx::Error::Database(e)) => Ok(Some(e.code().unwrap_or_default().into_owned())),
        Err(e) => Err(format!("running the statement failed: {e}")),
    }
}

async fn raw(conn: &mut PgConnection, sql: &'static str) {
    sqlx::raw_sql(sql)
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Drop the CHECK that ties the queue row's `status` to `exhausted_at` (inside the witness's
/// transaction, so the rollback brings it back).
async fn drop_status_checks(conn: &mut PgConnection) {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT conname::text FROM pg_constraint \
         WHERE conrelid = 'outbox_queue'::regclass AND contype = 'c' \
           AND pg_get_constraintdef(oid) ~ 'exhausted_at'",
    )
    .fetch_all(&mut *conn)
    .await
    .expect("listing the CHECK constraints");
    assert_eq!(names.len(), 1, "expected the status CHECK, found {names:?}");
    for name in names {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE outbox_queue DROP CONSTRAINT {name}"
        )))
        .execute(&mut *conn)
        .await
        .expect("dropping a CHECK constraint");
    }
}

async fn set_up(conn: &mut PgConnection, witness: &Witness) -> Result<Labels, sqlx::Error> {
    let mut labels = Labels::new();
    for (label, set, queued) in &witness.rows {
        labels.insert(label, insert_row(conn, label, set, *queued).await?);
    }
    Ok(labels)
}

/// Run `sql` in a savepoint that is rolled back, and say what it did.
async fn outcome(
    conn: &mut PgConnection,
    sql: &str,
    witness: &Witness,
    labels: &Labels,
) -> Result<Outcome, String> {
    raw(conn, "SAVEPOINT witness").await;
    let before = snapshot(conn).await;
    let outcome = match execute(conn, sql, &witness.params, labels).await? {
        Some(sqlstate) => Outcome::Failed(sqlstate),
        None => Outcome::Changed(changes(labels, &before, &snapshot(conn).await)),
    };
    raw(conn, "ROLLBACK TO SAVEPOINT witness").await;
    Ok(outcome)
}

fn sorted(outcome: &Outcome) -> Outcome {
    match outcome {
        Outcome::Changed(changes) => {
            let mut changes = changes.clone();
            changes.sort();
            Outcome::Changed(changes)
        }
        failed => failed.clone(),
    }
}

/// Play `witness` against `statement` (the rendered SQL, comment-free) and `mutant` (the same
/// with the predicate replaced by `TRUE`, or the clause by its replacement). Everything happens
/// in one transaction that is rolled back, so witnesses share a database without seeing each
/// other. Returns what went wrong.
pub async fn play(
    conn: &mut PgConnection,
    witness: &Witness,
    statement: &str,
    mutant: &str,
) -> Result<(), String> {
    let mut tx = conn.begin().await.map_err(|e| e.to_string())?;
    for sql in &witness.setup {
        raw(&mut tx, sql).await;
    }
    if witness.legality == Legality::ForbiddenBySchema {
        raw(&mut tx, "SAVEPOINT forbidden").await;
        match set_up(&mut tx, witness).await {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("23514") => {}
            Err(e) => {
                return Err(format!(
                    "the forbidden state failed otherwise than by a CHECK: {e}"
                ));
            }
            Ok(_) => {
                return Err(
                    "declared forbidden by the schema, but the schema accepts the state".to_owned(),
                );
            }
        }
        raw(&mut tx, "ROLLBACK TO SAVEPOINT forbidden").await;
        drop_status_checks(&mut tx).await;
    }
    let labels = set_up(&mut tx, witness)
        .await
        .map_err(|e| format!("setting up the rows failed: {e}"))?;
    let real = outcome(&mut tx, statement, witness, &labels).await?;
    let without = outcome(&mut tx, mutant, witness, &labels)
        .await
        .map_err(|e| format!("without the predicate: {e}"))?;
    tx.rollback().await.map_err(|e| e.to_string())?;

    let (expected_real, expected_without) = (sorted(&witness.real), sorted(&witness.without));
    if real != expected_real {
        return Err(format!(
            "the real statement did {real:?}, the witness expects {expected_real:?}"
        ));
    }
    if without != expected_without {
        return Err(format!(
            "without the predicate the statement did {without:?}, the witness expects {expected_without:?}"
        ));
    }
    match (witness.implied, real == without) {
        (None, true) => Err(format!(
            "the predicate does not decide here: both versions did {real:?}"
        )),
        (Some(_), false) => Err("declared implied, but removing it changed the outcome".to_owned()),
        _ => Ok(()),
    }
}

//! The machinery behind `tests/store_guards.rs`: a witness builder, and a runner that plays one
//! witness in a transaction of its own (rolled back), against the statement as written and
//! against the statement with one predicate replaced by `TRUE`.

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
    Ints(&'static [i64]),
    Text(&'static str),
    Bool(bool),
}

/// What a statement did to one row set up by the witness.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    Updated(&'static str),
    Deleted(&'static str),
}

/// Whether a witness state is one the schema allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Legality {
    /// Any row state the schema's constraints accept.
    Legal,
    /// The only state in which the predicate decides breaks the CHECKs that tie `status` to
    /// `delivered_at` / `exhausted_at`: the runner first shows the setup is refused (SQLSTATE
    /// 23514), then drops those CHECKs inside the rolled-back transaction and plays the witness.
    /// Such a predicate is implied by the status predicate beside it and is there for the
    /// partial index; the witness still shows it filters.
    ForbiddenBySchema,
}

/// Evidence that one predicate of one statement matters.
#[derive(Debug, Clone)]
pub struct Witness {
    pub statement: &'static str,
    /// The predicate's text, whitespace collapsed, as in the SQL file; ` #2` suffix for the
    /// second occurrence of the same text in one statement.
    pub predicate: &'static str,
    /// Rows inserted in this order (so ids ascend): a label and the SET list applied to a
    /// default pending row (see [`insert_row`]).
    pub rows: Vec<(&'static str, &'static str)>,
    pub params: Vec<Param>,
    /// What the statement as written changes.
    pub real: Vec<Change>,
    /// What it changes with the predicate replaced by `TRUE`.
    pub without: Vec<Change>,
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
        rows: Vec::new(),
        params: Vec::new(),
        real: Vec::new(),
        without: Vec::new(),
        legality: Legality::Legal,
        implied: None,
    }
}

impl Witness {
    pub fn row(mut self, label: &'static str, set: &'static str) -> Self {
        self.rows.push((label, set));
        self
    }
    pub fn params(mut self, params: impl IntoIterator<Item = Param>) -> Self {
        self.params = params.into_iter().collect();
        self
    }
    /// What the real statement changes (default: nothing).
    pub fn real(mut self, changes: impl IntoIterator<Item = Change>) -> Self {
        self.real = changes.into_iter().collect();
        self
    }
    /// What the statement without the predicate changes.
    pub fn without(mut self, changes: impl IntoIterator<Item = Change>) -> Self {
        self.without = changes.into_iter().collect();
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

/// Insert a default pending row (event type `witness.event`, no aggregate, max_attempts 3),
/// then apply `set` to it; returns (id, event_id).
async fn insert_row(
    conn: &mut PgConnection,
    label: &str,
    set: &str,
) -> Result<(i64, uuid::Uuid), sqlx::Error> {
    let row = sqlx::query(
        "INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, \
         event_version, payload, max_attempts) \
         VALUES (gen_random_uuid(), $1, '\\x00', 'witness.event', 1, '{}', 3) \
         RETURNING id, event_id",
    )
    .bind(label)
    .fetch_one(&mut *conn)
    .await?;
    let id: i64 = row.get(0);
    if !set.trim().is_empty() {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE outbox SET {set} WHERE id = $1"
        )))
        .bind(id)
        .execute(&mut *conn)
        .await?;
    }
    Ok((id, row.get(1)))
}

async fn snapshot(conn: &mut PgConnection) -> BTreeMap<i64, String> {
    sqlx::query_as::<_, (i64, String)>("SELECT id, to_jsonb(o)::text FROM outbox o ORDER BY id")
        .fetch_all(&mut *conn)
        .await
        .expect("reading the outbox table")
        .into_iter()
        .collect()
}

type Labels = BTreeMap<&'static str, (i64, uuid::Uuid)>;

fn changes(
    labels: &Labels,
    before: &BTreeMap<i64, String>,
    after: &BTreeMap<i64, String>,
) -> Vec<Change> {
    let mut out = Vec::new();
    for (label, (id, _)) in labels {
        match (before.get(id), after.get(id)) {
            (Some(_), None) => out.push(Change::Deleted(label)),
            (Some(a), Some(b)) if a != b => out.push(Change::Updated(label)),
            _ => {}
        }
    }
    out.sort();
    out
}

async fn execute(
    conn: &mut PgConnection,
    sql: &str,
    params: &[Param],
    labels: &Labels,
) -> Result<(), String> {
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
            Param::Ints(v) => query.bind(v.to_vec()),
            Param::Text(v) => query.bind(*v),
            Param::Bool(v) => query.bind(*v),
        };
    }
    query
        .execute(&mut *conn)
        .await
        .map(|_| ())
        .map_err(|e| format!("running the statement failed: {e}"))
}

async fn raw(conn: &mut PgConnection, sql: &'static str) {
    sqlx::raw_sql(sql)
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Drop the CHECKs that tie `status` to `delivered_at` / `exhausted_at` (inside the witness's
/// transaction, so the rollback brings them back).
async fn drop_status_checks(conn: &mut PgConnection) {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT conname::text FROM pg_constraint \
         WHERE conrelid = 'outbox'::regclass AND contype = 'c' \
           AND pg_get_constraintdef(oid) ~ '(delivered_at|exhausted_at)'",
    )
    .fetch_all(&mut *conn)
    .await
    .expect("listing the CHECK constraints");
    assert_eq!(
        names.len(),
        2,
        "expected the two status CHECKs, found {names:?}"
    );
    for name in names {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE outbox DROP CONSTRAINT {name}"
        )))
        .execute(&mut *conn)
        .await
        .expect("dropping a CHECK constraint");
    }
}

async fn set_up(conn: &mut PgConnection, witness: &Witness) -> Result<Labels, sqlx::Error> {
    let mut labels = Labels::new();
    for (label, set) in &witness.rows {
        labels.insert(label, insert_row(conn, label, set).await?);
    }
    Ok(labels)
}

/// Play `witness` against `statement` (the rendered SQL, comment-free) and `mutant` (the same
/// with the predicate replaced by `TRUE`). Everything happens in one transaction that is rolled
/// back, so witnesses share a database without seeing each other. Returns what went wrong.
pub async fn play(
    conn: &mut PgConnection,
    witness: &Witness,
    statement: &str,
    mutant: &str,
) -> Result<(), String> {
    let mut tx = conn.begin().await.map_err(|e| e.to_string())?;
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
    raw(&mut tx, "SAVEPOINT witness").await;
    let before = snapshot(&mut tx).await;
    execute(&mut tx, statement, &witness.params, &labels).await?;
    let real = changes(&labels, &before, &snapshot(&mut tx).await);
    raw(&mut tx, "ROLLBACK TO SAVEPOINT witness").await;
    execute(&mut tx, mutant, &witness.params, &labels)
        .await
        .map_err(|e| format!("without the predicate: {e}"))?;
    let without = changes(&labels, &before, &snapshot(&mut tx).await);
    tx.rollback().await.map_err(|e| e.to_string())?;

    let mut expected_real = witness.real.clone();
    expected_real.sort();
    let mut expected_without = witness.without.clone();
    expected_without.sort();
    if real != expected_real {
        return Err(format!(
            "the real statement changed {real:?}, the witness expects {expected_real:?}"
        ));
    }
    if without != expected_without {
        return Err(format!(
            "without the predicate the statement changed {without:?}, the witness expects {expected_without:?}"
        ));
    }
    match (witness.implied, real == without) {
        (None, true) => Err(format!(
            "the predicate does not decide here: both versions changed {real:?}"
        )),
        (Some(_), false) => Err("declared implied, but removing it changed the outcome".to_owned()),
        _ => Ok(()),
    }
}

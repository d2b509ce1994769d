//! From `pgoutput` messages to committed transactions of inserted rows.
//!
//! A logical slot hands out each committed transaction whole and in commit order: `Begin`, the
//! `Relation` of each table before its first change in the session, the changes, `Commit`
//! (protocol version 1 never interleaves transactions). [`Transactions`] follows that stream,
//! keeps the latest `Relation` of each table, and gives back each transaction at its `Commit`
//! with the rows it inserted into the tables it was asked for, in the order they were inserted,
//! and the commit's end position: the position a relay confirms to the slot once every row of
//! the transaction has a durable outcome.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use super::pgoutput::{self, DecodeError, Lsn, Message, PgTimestamp, Relation, Value};

/// One committed transaction's inserted rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The position of the commit record.
    pub commit_lsn: Lsn,
    /// The end of the commit record: what the slot is confirmed up to once these rows are done.
    pub end_lsn: Lsn,
    /// When the transaction committed, by the server's clock.
    pub commit_time: PgTimestamp,
    /// The transaction id.
    pub xid: u32,
    /// The rows inserted into the followed tables, in insert order (empty when the transaction
    /// touched other tables of the publication only).
    pub rows: Vec<Row>,
}

/// An inserted row, its values in text form by column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The table's name (without its schema).
    pub table: Arc<str>,
    columns: Arc<[String]>,
    values: Vec<Option<String>>,
}

impl Row {
    /// The text form of column `name`: `None` when the row has no such column or it is NULL.
    pub fn get(&self, name: &str) -> Option<&str> {
        let i = self.columns.iter().position(|c| c == name)?;
        self.values.get(i)?.as_deref()
    }

    /// The column names, in the table's order.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }
}

/// What could not be followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamError {
    /// A message did not decode.
    Decode(DecodeError),
    /// An insert into a table whose `Relation` message never came.
    UnknownRelation(u32),
    /// A change or a `Commit` outside a transaction, or a `Begin` inside one.
    OutOfTransaction(&'static str),
    /// A value in binary form or a TOAST placeholder where the relay asks for text.
    NotText {
        /// The table.
        table: String,
        /// The column.
        column: String,
    },
    /// A text value that is not UTF-8.
    NotUtf8 {
        /// The table.
        table: String,
        /// The column.
        column: String,
    },
    /// A tuple with another number of values than its relation has columns.
    ColumnCount {
        /// The table.
        table: String,
        /// Columns in its `Relation`.
        expected: usize,
        /// Values in the tuple.
        found: usize,
    },
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamError::Decode(e) => e.fmt(f),
            StreamError::UnknownRelation(oid) => write!(
                f,
                "insert into relation {oid} before its Relation message: the slot's stream was \
                 read from the middle of a session"
            ),
            StreamError::OutOfTransaction(what) => {
                write!(f, "pgoutput {what} outside the Begin/Commit order")
            }
            StreamError::NotText { table, column } => write!(
                f,
                "{table}.{column} did not come in text form: read the slot without the \
                 `binary` option"
            ),
            StreamError::NotUtf8 { table, column } => {
                write!(
                    f,
                    "{table}.{column} is not UTF-8 (the database encoding must be UTF8)"
                )
            }
            StreamError::ColumnCount {
                table,
                expected,
                found,
            } => write!(
                f,
                "insert into {table} has {found} values for {expected} columns"
            ),
        }
    }
}

impl std::error::Error for StreamError {}

impl From<DecodeError> for StreamError {
    fn from(e: DecodeError) -> StreamError {
        StreamError::Decode(e)
    }
}

/// Follows a slot's messages; see the module documentation.
#[derive(Debug, Default)]
pub struct Transactions {
    tables: Vec<String>,
    relations: HashMap<u32, (Arc<str>, Arc<[String]>)>,
    open: Option<Open>,
}

#[derive(Debug)]
struct Open {
    final_lsn: Lsn,
    xid: u32,
    rows: Vec<Row>,
}

impl Transactions {
    /// Follows the inserts into `tables` (names without schema); inserts into other tables of
    /// the publication are skipped.
    pub fn new<S: Into<String>>(tables: impl IntoIterator<Item = S>) -> Transactions {
        Transactions {
            tables: tables.into_iter().map(Into::into).collect(),
            ..Transactions::default()
        }
    }

    /// Takes the next message; returns the transaction it completes, if it is a `Commit`.
    pub fn push(&mut self, message: &[u8]) -> Result<Option<Committed>, StreamError> {
        match pgoutput::decode(message)? {
            Message::Begin(b) => {
                if self.open.is_some() {
                    return Err(StreamError::OutOfTransaction("Begin"));
                }
                self.open = Some(Open {
                    final_lsn: b.final_lsn,
                    xid: b.xid,
                    rows: Vec::new(),
                });
            }
            Message::Relation(r) => self.relation(r),
            Message::Insert(insert) => {
                let open = self
                    .open
                    .as_mut()
                    .ok_or(StreamError::OutOfTransaction("Insert"))?;
                let (table, columns) = self
                    .relations
                    .get(&insert.relation)
                    .ok_or(StreamError::UnknownRelation(insert.relation))?;
                if !self.tables.iter().any(|t| **t == **table) {
                    return Ok(None);
                }
                open.rows.push(row(table, columns, &insert.values)?);
            }
            Message::Commit(c) => {
                let open = self
                    .open
                    .take()
                    .ok_or(StreamError::OutOfTransaction("Commit"))?;
                debug_assert_eq!(open.final_lsn, c.commit_lsn);
                return Ok(Some(Committed {
                    commit_lsn: c.commit_lsn,
                    end_lsn: c.end_lsn,
                    commit_time: c.commit_time,
                    xid: open.xid,
                    rows: open.rows,
                }));
            }
            Message::Other(_) => {}
        }
        Ok(None)
    }

    fn relation(&mut self, r: Relation) {
        let columns: Arc<[String]> = r.columns.into_iter().map(|c| c.name).collect();
        self.relations.insert(r.oid, (r.name.into(), columns));
    }
}

fn row(
    table: &Arc<str>,
    columns: &Arc<[String]>,
    values: &[Value<'_>],
) -> Result<Row, StreamError> {
    if values.len() != columns.len() {
        return Err(StreamError::ColumnCount {
            table: table.to_string(),
            expected: columns.len(),
            found: values.len(),
        });
    }
    let text = values
        .iter()
        .zip(columns.iter())
        .map(|(value, column)| match value {
            Value::Null => Ok(None),
            Value::Text(bytes) => std::str::from_utf8(bytes)
                .map(|s| Some(s.to_owned()))
                .map_err(|_| StreamError::NotUtf8 {
                    table: table.to_string(),
                    column: column.clone(),
                }),
            Value::Binary(_) | Value::UnchangedToast => Err(StreamError::NotText {
                table: table.to_string(),
                column: column.clone(),
            }),
        })
        .collect::<Result<_, _>>()?;
    Ok(Row {
        table: Arc::clone(table),
        columns: Arc::clone(columns),
        values: text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn begin(lsn: u64, xid: u32) -> Vec<u8> {
        let mut m = vec![b'B'];
        m.extend(lsn.to_be_bytes());
        m.extend(5i64.to_be_bytes());
        m.extend(xid.to_be_bytes());
        m
    }

    fn commit(lsn: u64, end: u64) -> Vec<u8> {
        let mut m = vec![b'C', 0];
        m.extend(lsn.to_be_bytes());
        m.extend(end.to_be_bytes());
        m.extend(5i64.to_be_bytes());
        m
    }

    fn relation(oid: u32, name: &str) -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend(oid.to_be_bytes());
        m.extend(b"public\0");
        m.extend(name.as_bytes());
        m.extend(b"\0d");
        m.extend(2u16.to_be_bytes());
        for col in ["id", "aggregate_id"] {
            m.push(0);
            m.extend(col.as_bytes());
            m.push(0);
            m.extend(25u32.to_be_bytes());
            m.extend((-1i32).to_be_bytes());
        }
        m
    }

    fn insert(oid: u32, id: &str, aggregate: Option<&str>) -> Vec<u8> {
        let mut m = vec![b'I'];
        m.extend(oid.to_be_bytes());
        m.push(b'N');
        m.extend(2u16.to_be_bytes());
        for v in [Some(id), aggregate] {
            match v {
                Some(v) => {
                    m.push(b't');
                    m.extend(u32::try_from(v.len()).unwrap().to_be_bytes());
                    m.extend(v.as_bytes());
                }
                None => m.push(b'n'),
            }
        }
        m
    }

    #[test]
    fn a_transaction_comes_back_at_its_commit_with_its_rows_in_order() {
        let mut t = Transactions::new(["relay"]);
        assert_eq!(t.push(&begin(100, 7)).unwrap(), None);
        assert_eq!(t.push(&relation(1, "relay")).unwrap(), None);
        assert_eq!(t.push(&insert(1, "1", Some("a"))).unwrap(), None);
        assert_eq!(t.push(&insert(1, "2", None)).unwrap(), None);
        let done = t.push(&commit(100, 140)).unwrap().expect("committed");
        assert_eq!(
            (done.commit_lsn, done.end_lsn, done.xid),
            (Lsn(100), Lsn(140), 7)
        );
        let rows: Vec<_> = done
            .rows
            .iter()
            .map(|r| (r.get("id"), r.get("aggregate_id")))
            .collect();
        assert_eq!(rows, [(Some("1"), Some("a")), (Some("2"), None)]);
        assert_eq!(done.rows[0].get("no_such_column"), None);
        assert_eq!(&*done.rows[0].table, "relay");
    }

    #[test]
    fn inserts_into_other_tables_are_skipped() {
        let mut t = Transactions::new(["relay"]);
        t.push(&relation(2, "other")).unwrap();
        t.push(&begin(10, 1)).unwrap();
        t.push(&insert(2, "9", None)).unwrap();
        let done = t.push(&commit(10, 20)).unwrap().unwrap();
        assert!(done.rows.is_empty());
    }

    #[test]
    fn out_of_order_streams_are_refused() {
        let mut t = Transactions::new(["relay"]);
        assert_eq!(
            t.push(&commit(1, 2)),
            Err(StreamError::OutOfTransaction("Commit"))
        );
        t.push(&begin(1, 1)).unwrap();
        assert_eq!(
            t.push(&insert(3, "1", None)),
            Err(StreamError::UnknownRelation(3))
        );
        assert_eq!(
            t.push(&begin(2, 2)),
            Err(StreamError::OutOfTransaction("Begin"))
        );
    }
}

//! A decoder of `pgoutput` messages, logical replication protocol version 1.
//!
//! Written from PostgreSQL's documentation, "Logical Replication Message Formats" (chapter
//! 55.9 of the PostgreSQL 15 manual, `protocol-logicalrep-message-formats.html`) and "Message
//! Data Types" (55.6: `Int8/16/32/64` big-endian, `String` NUL-terminated, `Byte1` one byte).
//! Each message is one value of `data` from `pg_logical_slot_get_binary_changes` (or `peek`),
//! or the payload of one `XLogData` of the streaming protocol.
//!
//! Only what a relay of inserted events needs is decoded into fields: `Begin`, `Commit`,
//! `Relation` and `Insert`. Every other message of version 1 (`Origin`, `Type`, `Update`,
//! `Delete`, `Truncate`, `Message`) is recognised and returned as [`Message::Other`] with its tag,
//! so a caller can refuse or skip it knowingly; an unknown tag, or a message cut short, is an
//! error that names what was being read and where, never a panic. The streaming messages of
//! versions 2 and later (`S`, `E`, `c`, `A`) are not requested (the relay asks for version 1,
//! which sends a transaction only once it has committed) and decode as unknown tags.
//!
//! Column values are borrowed from the message: `pgoutput` sends them in text form unless the
//! `binary` option is given, and this decoder keeps either as bytes.

use std::fmt;

/// A log sequence number: a byte position in the write-ahead log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl fmt::Display for Lsn {
    /// PostgreSQL's text form, `XXX/XXXXXXXX` (what `pg_lsn` prints and accepts).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl std::str::FromStr for Lsn {
    type Err = DecodeError;

    /// Parses PostgreSQL's text form, `XXX/XXXXXXXX`.
    fn from_str(s: &str) -> Result<Lsn, DecodeError> {
        let bad = || DecodeError::BadLsn(s.to_owned());
        let (hi, lo) = s.split_once('/').ok_or_else(bad)?;
        let hi = u64::from_str_radix(hi, 16).map_err(|_| bad())?;
        let lo = u64::from_str_radix(lo, 16).map_err(|_| bad())?;
        if hi > u64::from(u32::MAX) || lo > u64::from(u32::MAX) {
            return Err(bad());
        }
        Ok(Lsn(hi << 32 | lo))
    }
}

/// Microseconds since 2000-01-01 00:00:00 UTC, PostgreSQL's epoch for timestamps.
pub type PgTimestamp = i64;

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
pub const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;

/// One decoded `pgoutput` message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<'a> {
    /// A transaction starts (`B`); its changes follow, then its [`Commit`].
    Begin(Begin),
    /// The transaction ends (`C`).
    Commit(Commit),
    /// The columns of a table (`R`), sent before the first change of that table in a session
    /// and again after its definition changes.
    Relation(Relation),
    /// A row was inserted (`I`).
    Insert(Insert<'a>),
    /// A message of protocol version 1 that this decoder does not take apart: `O` (origin),
    /// `Y` (type), `U` (update), `D` (delete), `T` (truncate) or `M` (logical message).
    Other(u8),
}

/// `Begin`: the start of a committed transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Begin {
    /// The position of the transaction's commit record.
    pub final_lsn: Lsn,
    /// When the transaction committed, by the server's clock.
    pub commit_time: PgTimestamp,
    /// The transaction id.
    pub xid: u32,
}

/// `Commit`: the end of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    /// The position of the commit record (the `final_lsn` of its `Begin`).
    pub commit_lsn: Lsn,
    /// The end of the commit record: the position a consumer confirms once the transaction's
    /// changes are durable on its side, so that decoding resumes after it.
    pub end_lsn: Lsn,
    /// When the transaction committed, by the server's clock.
    pub commit_time: PgTimestamp,
}

/// `Relation`: a table's identity and columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// The table's oid, which the changes refer to.
    pub oid: u32,
    /// The schema (empty for `pg_catalog`).
    pub namespace: String,
    /// The table name.
    pub name: String,
    /// The table's replica identity setting (`d`efault, `n`othing, `f`ull or `i`ndex).
    pub replica_identity: u8,
    /// The published columns, in the order the tuples carry them.
    pub columns: Vec<RelationColumn>,
}

/// One column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    /// Whether the column is part of the replica identity key.
    pub key: bool,
    /// The column name.
    pub name: String,
    /// The oid of the column's type.
    pub type_oid: u32,
    /// The type modifier.
    pub type_modifier: i32,
}

/// `Insert`: the new row of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insert<'a> {
    /// The oid of the table, as its [`Relation`] gave it.
    pub relation: u32,
    /// The row's values, in the order of the relation's columns.
    pub values: Vec<Value<'a>>,
}

/// One column value of a tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// SQL NULL.
    Null,
    /// A TOASTed value that did not change (updates only; an insert always carries its values).
    UnchangedToast,
    /// The value in the type's text form.
    Text(&'a [u8]),
    /// The value in the type's binary form (only with the `binary` option).
    Binary(&'a [u8]),
}

/// A message that could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The message was empty.
    Empty,
    /// The message ended before `what` could be read at byte `at`.
    Truncated {
        /// What was being read.
        what: &'static str,
        /// The byte offset it starts at.
        at: usize,
    },
    /// The message's first byte is not a message of protocol version 1.
    UnknownTag(u8),
    /// A tuple column's kind byte is none of `n`, `u`, `t`, `b`.
    UnknownValueKind {
        /// The byte found.
        kind: u8,
        /// Its offset.
        at: usize,
    },
    /// An `Insert` without its `N` (new tuple) marker.
    MissingNewTuple(u8),
    /// A string field is not UTF-8.
    NotUtf8(&'static str),
    /// Bytes were left after the message's last field.
    TrailingBytes {
        /// The message's tag.
        tag: u8,
        /// How many bytes were left.
        left: usize,
    },
    /// A log sequence number not in PostgreSQL's `XXX/XXXXXXXX` form.
    BadLsn(String),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Empty => write!(f, "empty pgoutput message"),
            DecodeError::Truncated { what, at } => write!(
                f,
                "pgoutput message cut short: {what} at byte {at} runs past its end"
            ),
            DecodeError::UnknownTag(tag) => write!(
                f,
                "pgoutput message of unknown type {:?} (0x{tag:02x}); the relay asks for \
                 proto_version '1', which never sends it",
                char::from(*tag)
            ),
            DecodeError::UnknownValueKind { kind, at } => write!(
                f,
                "pgoutput tuple column of unknown kind 0x{kind:02x} at byte {at} (expected n, u, t or b)"
            ),
            DecodeError::MissingNewTuple(found) => write!(
                f,
                "pgoutput Insert without its new tuple: expected 'N', found 0x{found:02x}"
            ),
            DecodeError::NotUtf8(what) => write!(f, "pgoutput {what} is not UTF-8"),
            DecodeError::TrailingBytes { tag, left } => write!(
                f,
                "pgoutput {:?} message has {left} bytes after its last field",
                char::from(*tag)
            ),
            DecodeError::BadLsn(s) => {
                write!(
                    f,
                    "{s:?} is not a log sequence number (expected XXX/XXXXXXXX)"
                )
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// Decodes one `pgoutput` message (protocol version 1).
pub fn decode(bytes: &[u8]) -> Result<Message<'_>, DecodeError> {
    let (&tag, _) = bytes.split_first().ok_or(DecodeError::Empty)?;
    let mut r = Reader { bytes, at: 1 };
    let message = match tag {
        b'B' => Message::Begin(Begin {
            final_lsn: Lsn(r.u64("Begin final LSN")?),
            commit_time: r.i64("Begin commit timestamp")?,
            xid: r.u32("Begin xid")?,
        }),
        b'C' => {
            let _flags = r.u8("Commit flags")?;
            Message::Commit(Commit {
                commit_lsn: Lsn(r.u64("Commit LSN")?),
                end_lsn: Lsn(r.u64("Commit end LSN")?),
                commit_time: r.i64("Commit timestamp")?,
            })
        }
        b'R' => Message::Relation(relation(&mut r)?),
        b'I' => {
            let relation = r.u32("Insert relation oid")?;
            let marker = r.u8("Insert tuple marker")?;
            if marker != b'N' {
                return Err(DecodeError::MissingNewTuple(marker));
            }
            Message::Insert(Insert {
                relation,
                values: tuple(&mut r)?,
            })
        }
        // Recognised, not taken apart: their bytes are not checked past the tag.
        b'O' | b'Y' | b'U' | b'D' | b'T' | b'M' => return Ok(Message::Other(tag)),
        other => return Err(DecodeError::UnknownTag(other)),
    };
    if r.at != bytes.len() {
        return Err(DecodeError::TrailingBytes {
            tag,
            left: bytes.len() - r.at,
        });
    }
    Ok(message)
}

fn relation(r: &mut Reader<'_>) -> Result<Relation, DecodeError> {
    let oid = r.u32("Relation oid")?;
    let namespace = r.string("Relation namespace")?;
    let name = r.string("Relation name")?;
    let replica_identity = r.u8("Relation replica identity")?;
    let count = r.u16("Relation column count")?;
    let mut columns = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        columns.push(RelationColumn {
            key: r.u8("Relation column flags")? & 1 == 1,
            name: r.string("Relation column name")?,
            type_oid: r.u32("Relation column type oid")?,
            type_modifier: r.i32("Relation column type modifier")?,
        });
    }
    Ok(Relation {
        oid,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

fn tuple<'a>(r: &mut Reader<'a>) -> Result<Vec<Value<'a>>, DecodeError> {
    let count = r.u16("TupleData column count")?;
    let mut values = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let at = r.at;
        values.push(match r.u8("TupleData column kind")? {
            b'n' => Value::Null,
            b'u' => Value::UnchangedToast,
            b't' => Value::Text(r.counted("TupleData text value")?),
            b'b' => Value::Binary(r.counted("TupleData binary value")?),
            kind => return Err(DecodeError::UnknownValueKind { kind, at }),
        });
    }
    Ok(values)
}

/// A cursor over one message.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(DecodeError::Truncated { what, at: self.at })?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    fn i32(&mut self, what: &'static str) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    fn i64(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array(what)?))
    }

    /// `Int32` length, then that many bytes.
    fn counted(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let at = self.at;
        let len = self.u32(what)?;
        let len = usize::try_from(len).map_err(|_| DecodeError::Truncated { what, at })?;
        self.take(len, what)
    }

    /// A NUL-terminated UTF-8 string.
    fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let rest = &self.bytes[self.at..];
        let nul = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::Truncated { what, at: self.at })?;
        let text = std::str::from_utf8(&rest[..nul]).map_err(|_| DecodeError::NotUtf8(what))?;
        self.at += nul + 1;
        Ok(text.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Message builders in the documented layout, so each test states its bytes field by field.
    fn begin(final_lsn: u64, ts: i64, xid: u32) -> Vec<u8> {
        let mut m = vec![b'B'];
        m.extend(final_lsn.to_be_bytes());
        m.extend(ts.to_be_bytes());
        m.extend(xid.to_be_bytes());
        m
    }

    fn commit(lsn: u64, end: u64, ts: i64) -> Vec<u8> {
        let mut m = vec![b'C', 0];
        m.extend(lsn.to_be_bytes());
        m.extend(end.to_be_bytes());
        m.extend(ts.to_be_bytes());
        m
    }

    fn relation_msg() -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend(16_384u32.to_be_bytes());
        m.extend(b"public\0relay\0d");
        m.extend(2u16.to_be_bytes());
        m.push(1);
        m.extend(b"id\0");
        m.extend(20u32.to_be_bytes());
        m.extend((-1i32).to_be_bytes());
        m.push(0);
        m.extend(b"payload\0");
        m.extend(3802u32.to_be_bytes());
        m.extend((-1i32).to_be_bytes());
        m
    }

    fn insert_msg() -> Vec<u8> {
        let mut m = vec![b'I'];
        m.extend(16_384u32.to_be_bytes());
        m.push(b'N');
        m.extend(3u16.to_be_bytes());
        m.push(b't');
        m.extend(2u32.to_be_bytes());
        m.extend(b"42");
        m.push(b'n');
        m.push(b'b');
        m.extend(1u32.to_be_bytes());
        m.push(7);
        m
    }

    #[test]
    fn begin_and_commit_carry_positions_and_times() {
        assert_eq!(
            decode(&begin(0x1_0000_00A0, 7, 735)).unwrap(),
            Message::Begin(Begin {
                final_lsn: Lsn(0x1_0000_00A0),
                commit_time: 7,
                xid: 735
            })
        );
        assert_eq!(
            decode(&commit(0xA0, 0xD8, -3)).unwrap(),
            Message::Commit(Commit {
                commit_lsn: Lsn(0xA0),
                end_lsn: Lsn(0xD8),
                commit_time: -3
            })
        );
    }

    #[test]
    fn relation_lists_its_columns_in_order() {
        let Message::Relation(r) = decode(&relation_msg()).unwrap() else {
            panic!("not a relation")
        };
        assert_eq!(
            (r.oid, &*r.namespace, &*r.name),
            (16_384, "public", "relay")
        );
        assert_eq!(r.replica_identity, b'd');
        let names: Vec<_> = r.columns.iter().map(|c| (c.name.as_str(), c.key)).collect();
        assert_eq!(names, [("id", true), ("payload", false)]);
        assert_eq!(
            (r.columns[1].type_oid, r.columns[1].type_modifier),
            (3802, -1)
        );
    }

    #[test]
    fn insert_values_are_text_null_or_binary() {
        assert_eq!(
            decode(&insert_msg()).unwrap(),
            Message::Insert(Insert {
                relation: 16_384,
                values: vec![Value::Text(b"42"), Value::Null, Value::Binary(&[7])],
            })
        );
    }

    #[test]
    fn every_cut_of_a_message_is_an_error_not_a_panic() {
        for message in [
            begin(1, 2, 3),
            commit(1, 2, 3),
            relation_msg(),
            insert_msg(),
        ] {
            for len in 0..message.len() {
                assert!(
                    decode(&message[..len]).is_err(),
                    "{len} of {} bytes of {:?} decoded",
                    message.len(),
                    char::from(message[0])
                );
            }
        }
    }

    #[test]
    fn bad_input_is_named() {
        assert_eq!(decode(b"Z"), Err(DecodeError::UnknownTag(b'Z')));
        let mut insert = insert_msg();
        insert[5] = b'K';
        assert_eq!(decode(&insert), Err(DecodeError::MissingNewTuple(b'K')));
        let mut insert = insert_msg();
        insert[8] = b'x';
        assert_eq!(
            decode(&insert),
            Err(DecodeError::UnknownValueKind { kind: b'x', at: 8 })
        );
        let mut long = begin(1, 2, 3);
        long.push(0);
        assert_eq!(
            decode(&long),
            Err(DecodeError::TrailingBytes { tag: b'B', left: 1 })
        );
        assert!(
            DecodeError::UnknownTag(b'S')
                .to_string()
                .contains("proto_version")
        );
        assert_eq!(decode(b"U\0\0"), Ok(Message::Other(b'U')));
    }

    #[test]
    fn lsn_text_form_round_trips() {
        let lsn: Lsn = "16/B374D848".parse().unwrap();
        assert_eq!(lsn, Lsn(0x16_B374_D848));
        assert_eq!(lsn.to_string(), "16/B374D848");
        assert!("16-B374D848".parse::<Lsn>().is_err());
        assert!("1/100000000".parse::<Lsn>().is_err());
    }
}

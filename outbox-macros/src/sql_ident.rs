//! The outbox table name rule, checked at compile time. The runtime's `validate_table_name` and
//! `Store::create_table` apply the same syntax, suffix and length rules. PostgreSQL's reserved
//! key words (`select`, `table`, ...) are listed once, in the runtime: the expansion refuses them
//! at compile time by evaluating `__private::refuse_reserved_table_name` in a constant.

/// The suffix of every outbox table's queue table (`{table}_queue`): a table named with it would
/// collide with the queue table of another.
const QUEUE_SUFFIX: &str = "_queue";

/// The longest name the toolkit can create a table for: the longest index name derived from it
/// (`{table}_queue_aggregate_idx`) must fit PostgreSQL's 63-byte identifier limit, which would
/// otherwise truncate two index names into one. The runtime computes the same bound
/// (`store::sql::LONGEST_INDEX_SUFFIX`); both sides' tests pin it at 43, so a change to one
/// fails until the other follows (this crate cannot depend on the runtime, which re-exports it).
const MAX_TABLE_NAME_LEN: usize = 63 - "_queue_aggregate_idx".len();

/// Why a table name is refused: each variant's message says what to do instead.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TableNameProblem {
    /// Empty, or a character outside `[a-z0-9_]`, or a leading digit: it would need quoting.
    NeedsQuoting,
    /// Ends in `_queue`, the queue table suffix.
    QueueSuffix,
    /// Longer than [`MAX_TABLE_NAME_LEN`].
    TooLong,
}

impl TableNameProblem {
    /// The compile error for `name`.
    pub(crate) fn message(&self, name: &str) -> String {
        match self {
            Self::NeedsQuoting => format!(
                "`{name}` is not a safe outbox table name: use 1 to {MAX_TABLE_NAME_LEN} lowercase ASCII letters, digits and \
                 underscores, starting with a letter or underscore (for example `table = \"billing_outbox\"`)"
            ),
            Self::QueueSuffix => format!(
                "outbox table name `{name}` ends in `{QUEUE_SUFFIX}`, the suffix of the queue table every outbox table has \
                 (`{name}` would be the queue table of `{}`): choose a name that does not end in `{QUEUE_SUFFIX}`",
                name.strip_suffix(QUEUE_SUFFIX).unwrap_or(name)
            ),
            Self::TooLong => format!(
                "outbox table name `{name}` is {} characters; its index names would exceed PostgreSQL's 63-character \
                 limit, so use a table name of at most {MAX_TABLE_NAME_LEN} characters",
                name.len()
            ),
        }
    }
}

/// `Ok` for a name that can be spliced into SQL unquoted and that the toolkit can create a table
/// for: `[a-z_][a-z0-9_]*`, at most [`MAX_TABLE_NAME_LEN`] bytes, not ending in `_queue`.
pub(crate) fn check_table_name(name: &str) -> Result<(), TableNameProblem> {
    let mut bytes = name.bytes();
    let plain = match bytes.next() {
        Some(first) => {
            (first.is_ascii_lowercase() || first == b'_')
                && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        }
        None => false,
    };
    if !plain {
        Err(TableNameProblem::NeedsQuoting)
    } else if name.ends_with(QUEUE_SUFFIX) {
        Err(TableNameProblem::QueueSuffix)
    } else if name.len() > MAX_TABLE_NAME_LEN {
        Err(TableNameProblem::TooLong)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_TABLE_NAME_LEN, TableNameProblem, check_table_name};

    #[test]
    fn accepts_plain_lowercase_names_up_to_the_limit() {
        assert_eq!(MAX_TABLE_NAME_LEN, 43);
        assert_eq!(check_table_name("outbox"), Ok(()));
        assert_eq!(check_table_name("_billing_outbox2"), Ok(()));
        assert_eq!(check_table_name("queue_outbox"), Ok(()));
        assert_eq!(check_table_name(&"a".repeat(MAX_TABLE_NAME_LEN)), Ok(()));
    }

    #[test]
    fn refuses_names_that_would_need_quoting() {
        for bad in [
            "",
            "Outbox",
            "1outbox",
            "out box",
            "outbox;drop",
            "out-box",
            "ö",
        ] {
            assert_eq!(
                check_table_name(bad),
                Err(TableNameProblem::NeedsQuoting),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn refuses_a_name_one_past_the_limit_and_the_queue_suffix() {
        assert_eq!(
            check_table_name(&"a".repeat(MAX_TABLE_NAME_LEN + 1)),
            Err(TableNameProblem::TooLong)
        );
        assert_eq!(
            check_table_name("orders_queue"),
            Err(TableNameProblem::QueueSuffix)
        );
        assert_eq!(
            check_table_name("_queue"),
            Err(TableNameProblem::QueueSuffix)
        );
        assert!(
            TableNameProblem::QueueSuffix
                .message("orders_queue")
                .contains("the queue table of `orders`")
        );
    }
}

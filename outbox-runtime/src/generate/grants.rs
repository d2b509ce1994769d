//! Least privilege: the grants for an enqueuer role and a worker role.
//!
//! The roles themselves are the operator's (`CREATE ROLE ... LOGIN PASSWORD ...`); this only
//! writes the GRANT statements, so they can go into a migration or be applied by hand.

use super::render::fill;
use crate::contract::shown;
use crate::error::{Error, Result};

/// Grants on one outbox table (template; `{table}`, `{enqueuer}`, `{worker}`).
const TABLE_GRANTS: &str = include_str!("sql/grants.sql");
/// Grants on the contract registry (template; `{worker}`, `{enqueuer}`).
const REGISTRY_GRANTS: &str = include_str!("sql/grants_registry.sql");
/// Grants on the consumer-side inbox (template; `{consumer}`).
const INBOX_GRANTS: &str = include_str!("sql/grants_inbox.sql");

/// The GRANT statements giving `enqueuer` the right to enqueue into `tables` and `worker` the
/// right to claim, complete, fail, retry and purge them.
///
/// Table and role names must be plain lowercase identifiers (`[a-z_][a-z0-9_]*`, at most 63
/// characters, not a reserved word); anything else is refused rather than quoted into SQL.
pub fn grants_sql(tables: &[&str], enqueuer: &str, worker: &str) -> Result<String> {
    validate_role_name(enqueuer)?;
    validate_role_name(worker)?;
    if enqueuer == worker {
        return Err(Error::Config(format!(
            "the enqueuer and the worker role are both `{enqueuer}`; use two roles, so a service that enqueues cannot \
             change delivery state"
        )));
    }
    let mut sql = String::new();
    for table in tables {
        // The same error as the store's, with the name escaped for the message.
        crate::store::validate_table_name(table).map_err(|e| match e {
            Error::InvalidTableName(_) => Error::InvalidTableName(shown(table)),
            other => other,
        })?;
        sql.push_str(&fill(
            TABLE_GRANTS,
            &[
                ("table", (*table).to_owned()),
                ("enqueuer", enqueuer.to_owned()),
                ("worker", worker.to_owned()),
            ],
        ));
        sql.push('\n');
    }
    sql.push_str(&fill(
        REGISTRY_GRANTS,
        &[
            ("worker", worker.to_owned()),
            ("enqueuer", enqueuer.to_owned()),
        ],
    ));
    Ok(sql)
}

/// The GRANT statements giving each of `consumers` the right to apply events once through
/// [`crate::inbox`] (record, check, purge its rows of `outbox_inbox`), and nothing else there.
pub fn inbox_grants_sql(consumers: &[&str]) -> Result<String> {
    let mut sql = String::new();
    for consumer in consumers {
        validate_role_name(consumer)?;
        sql.push_str(&fill(INBOX_GRANTS, &[("consumer", (*consumer).to_owned())]));
        sql.push('\n');
    }
    Ok(sql)
}

/// Names PostgreSQL reads as something other than a role where a role is expected (`GRANT ...
/// TO public` grants to every role; `current_user`, `current_role` and `session_user` name
/// whoever runs the statement; `none` is reserved for `SET ROLE NONE`), and `user`, a reserved
/// word that cannot stand for a role unquoted.
const SPECIAL_ROLE_NAMES: [&str; 6] = [
    "public",
    "current_user",
    "current_role",
    "session_user",
    "none",
    "user",
];

/// Role names follow the table name rule: spliced into SQL, so only plain identifiers that are
/// not reserved words (`current_user` unquoted would grant to whoever applies the SQL). A name
/// outside the rule is refused, not quoted: the same name goes on the operator's command line
/// and into `CREATE ROLE`, where a quoted, case-sensitive name is a trap.
/// Never one of [`SPECIAL_ROLE_NAMES`] nor a `pg_` name (PostgreSQL reserves those for its
/// predefined roles, such as `pg_write_all_data`).
fn validate_role_name(role: &str) -> Result<()> {
    if SPECIAL_ROLE_NAMES.contains(&role) || role.starts_with("pg_") {
        return Err(Error::Config(format!(
            "`{}` is not a role of its own: PostgreSQL reads `public`, `current_user`, `current_role`, `session_user`, \
             `none` and `user` specially (`public` means every role) and reserves `pg_` names for its predefined roles; \
             create a dedicated role (`CREATE ROLE shop_app LOGIN PASSWORD ...`) and name it here",
            shown(role)
        )));
    }
    crate::store::validate_table_name(role).map_err(|_| {
        Error::Config(format!(
            "`{}` is not a usable role name here: use 1 to 63 lowercase ASCII letters, digits and underscores, \
             starting with a letter or underscore, and not a reserved word",
            shown(role)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_unsafe_names() {
        assert!(grants_sql(&["outbox"], "app; DROP TABLE outbox", "w").is_err());
        assert!(grants_sql(&["Outbox"], "e", "w").is_err());
        assert!(grants_sql(&["outbox"], "same", "same").is_err());
        for special in SPECIAL_ROLE_NAMES.iter().chain(&["pg_write_all_data"]) {
            let err = grants_sql(&["outbox"], special, "w")
                .unwrap_err()
                .to_string();
            assert!(err.contains("is not a role of its own"), "{special}: {err}");
            assert!(grants_sql(&["outbox"], "e", special).is_err(), "{special}");
            assert!(inbox_grants_sql(&[special]).is_err(), "{special}");
        }
        let sql = grants_sql(&["outbox", "order_outbox"], "enq", "wrk").unwrap();
        assert!(sql.contains("ON order_outbox TO enq;"));
        assert!(sql.contains("GRANT SELECT ON outbox_contracts TO wrk;"));
        assert!(sql.contains(
            "GRANT SELECT (event_type, event_version, fingerprint, type_name) ON outbox_contracts TO enq;"
        ));
    }
}

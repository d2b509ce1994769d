//! Least privilege: the grants for an enqueuer role and a worker role.
//!
//! The roles themselves are the operator's (`CREATE ROLE ... LOGIN PASSWORD ...`); this only
//! writes the GRANT statements, so they can go into a migration or be applied by hand. The
//! upgrade of a table to the split layout gives the same grants again, on both tables, to the
//! roles that held them before ([`upgrade_grants_sql`]).

use super::render::fill;
use crate::contract::shown;
use crate::error::{Error, Result};

/// The enqueuer's grants on one outbox table and its queue table (template; `{table}`,
/// `{enqueuer}`).
const ENQUEUER_GRANTS: &str = include_str!("sql/grants_enqueuer.sql");
/// The worker's (template; `{table}`, `{worker}`).
const WORKER_GRANTS: &str = include_str!("sql/grants_worker.sql");
/// The grants of the roles that held the earlier ones, for an upgraded table (template;
/// `{table}`, `{enqueuer_grants}` and `{worker_grants}`, each with its role left to fill).
const UPGRADE_GRANTS: &str = include_str!("sql/grants_upgrade.sql");
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
        for (template, key, role) in [
            (ENQUEUER_GRANTS, "enqueuer", enqueuer),
            (WORKER_GRANTS, "worker", worker),
        ] {
            sql.push_str(&fill(
                template,
                &[("table", (*table).to_owned()), (key, role.to_owned())],
            ));
            sql.push('\n');
        }
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

/// For the migration that upgrades `table` to the split layout, after the upgrade: a block that
/// gives [`grants_sql`]'s grants on `table` and its queue table to every role that holds the
/// rights the earlier grants gave on `table` (an enqueuer: INSERT of the payload; a worker:
/// DELETE), so that neither role is refused by the queue table it has never been granted.
/// `table` must be a valid table name (the caller rendered its upgrade). The base schema's
/// `migrations/0004_split_layout.sql` ends with this for `outbox`.
pub fn upgrade_grants_sql(table: &str) -> String {
    // The statements only: the block's own comment says what they are for.
    let for_role = |template: &str| {
        let statements: Vec<&str> = template
            .lines()
            .filter(|line| !line.starts_with("--"))
            .collect();
        fill(&statements.join("\n"), &[("table", table.to_owned())])
    };
    fill(
        UPGRADE_GRANTS,
        &[
            ("table", table.to_owned()),
            ("enqueuer_grants", for_role(ENQUEUER_GRANTS)),
            ("worker_grants", for_role(WORKER_GRANTS)),
        ],
    )
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

/// Role names follow the identifier rule of table names (not their `_queue` rule, which is about
/// tables): spliced into SQL, so only plain identifiers that are not reserved words
/// (`current_user` unquoted would grant to whoever applies the SQL). A name outside the rule is
/// refused, not quoted: the same name goes on the operator's command line and into `CREATE
/// ROLE`, where a quoted, case-sensitive name is a trap.
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
    crate::store::sql::validate_identifier(role).map_err(|_| {
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
        // A table's queue is `{table}_queue`, so no outbox table ends in `_queue`; a role may.
        assert!(grants_sql(&["orders_queue"], "e", "w").is_err());
        assert!(grants_sql(&["outbox"], "billing_queue", "w").is_ok());
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
        assert!(sql.contains("ON order_outbox_queue TO enq;"));
        assert!(sql.contains("GRANT SELECT, DELETE ON order_outbox_queue TO wrk;"));
        assert!(sql.contains("GRANT SELECT ON outbox_contracts TO wrk;"));
        assert!(sql.contains(
            "GRANT SELECT (event_type, event_version, fingerprint, type_name) ON outbox_contracts TO enq;"
        ));
    }
}

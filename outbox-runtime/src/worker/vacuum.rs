//! Vacuums the outbox table from the maintenance leader when nothing else will.
//!
//! Every delivered event leaves dead row versions: its completion leaves the open index (not a
//! heap-only update) and its purge deletes the row. Claims and renewals are heap-only updates,
//! which PostgreSQL prunes page by page without a vacuum, but those dead versions are only
//! reclaimed by `VACUUM`. Autovacuum does that on a default server; where it is switched off
//! (server-wide or for the table) the table would grow for ever, so the leader does it, past
//! a threshold close to autovacuum's own.

use sqlx::PgConnection;

use crate::error::Result;

/// Dead versions below this never trigger a vacuum (a small table is cheap to scan).
const MIN_DEAD_ROWS: i64 = 10_000;
/// Beyond the minimum, vacuum when dead versions pass this fraction of the live rows
/// (autovacuum's default `autovacuum_vacuum_scale_factor`).
const DEAD_FRACTION: f64 = 0.2;

/// Whether autovacuum covers the table, its dead and live row counts, and whether this role
/// may vacuum it (owners and superusers may, in PostgreSQL 15).
const VACUUM_STATE: &str = "\
SELECT s.n_dead_tup, s.n_live_tup,
       current_setting('autovacuum')::boolean
         AND coalesce((SELECT o.option_value::boolean
                       FROM pg_options_to_table(c.reloptions) AS o
                       WHERE o.option_name = 'autovacuum_enabled'), true) AS autovacuum,
       coalesce((SELECT r.rolsuper FROM pg_roles AS r WHERE r.rolname = current_user), false)
         OR pg_has_role(current_user, c.relowner, 'USAGE') AS may_vacuum
FROM pg_class AS c
JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.oid = $1::text::regclass";

/// What a check did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VacuumOutcome {
    /// Autovacuum runs for the table, or too few dead rows yet: nothing to do.
    NotNeeded,
    /// `VACUUM` ran; this many dead row versions were counted before it.
    Vacuumed { dead_before: i64 },
    /// Needed, but this role may not vacuum the table.
    NotAllowed { dead: i64 },
}

/// Vacuum `table` on `conn` when autovacuum is off for it and enough dead rows piled up.
/// `table` must be a validated table name (it is interpolated into `VACUUM`).
pub(crate) async fn vacuum_if_needed(
    conn: &mut PgConnection,
    table: &str,
) -> Result<VacuumOutcome> {
    let Some((dead, live, autovacuum, may_vacuum)) =
        sqlx::query_as::<_, (i64, i64, bool, bool)>(VACUUM_STATE)
            .bind(table)
            .fetch_optional(&mut *conn)
            .await?
    else {
        // No statistics row yet (a table nobody wrote to since the server started).
        return Ok(VacuumOutcome::NotNeeded);
    };
    let threshold = MIN_DEAD_ROWS.max((live as f64 * DEAD_FRACTION) as i64);
    if autovacuum || dead < threshold {
        return Ok(VacuumOutcome::NotNeeded);
    }
    if !may_vacuum {
        return Ok(VacuumOutcome::NotAllowed { dead });
    }
    // VACUUM cannot run in a transaction block: sent alone, in autocommit, on the leader's own
    // connection, so no pooled connection is held for its duration.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("VACUUM {table}")))
        .execute(&mut *conn)
        .await?;
    Ok(VacuumOutcome::Vacuumed { dead_before: dead })
}

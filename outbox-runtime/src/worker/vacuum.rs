//! Vacuums an outbox table (the event table, or its queue table) from the maintenance leader
//! once dead row versions pile up.
//!
//! Every delivered event leaves dead row versions: its completion deletes its queue row, and its
//! purge deletes its event row. Claims and renewals are heap-only updates of the queue row,
//! which PostgreSQL prunes page by page without a vacuum, but deleted rows and their index
//! entries are only reclaimed by `VACUUM`. Where autovacuum is switched off (server-wide or for the table) the
//! table would grow for ever. Where it is on, it still falls behind an outbox: it visits a
//! database at most once per `autovacuum_naptime` (a minute by default) and is cost-throttled,
//! so at a few thousand events a second a minute of dead versions piles up between its runs and
//! the table and its indexes keep growing (measured in docs/benchmarks.md: 59 to 92 MiB in ten
//! minutes at ~1,000 events/s, where the leader's own vacuums kept it flat at 30 MiB). So the
//! leader vacuums past a threshold close to autovacuum's own whether or not autovacuum runs,
//! and yields to a vacuum already at work on the table (`SKIP_LOCKED`).
//!
//! The event table is insert-only until the purge starts, a retention after the first events,
//! so it has no dead rows to count for days; but its BRIN index on `created_at`, which the purge
//! reads, only covers the page ranges a vacuum has summarized, and every range it has not is
//! read whole by each purge (measured: 200,000 unsummarized events made a purge with nothing due
//! read 2,730 pages, all of them). So rows inserted since the last vacuum call for one too, past
//! the same minimum: a vacuum of an insert-only table reads only its new pages (the others are
//! all-visible) and summarizes their ranges.

use sqlx::PgConnection;

use crate::error::Result;

/// Dead versions below this never trigger a vacuum (a small table is cheap to scan).
const MIN_DEAD_ROWS: i64 = 10_000;
/// Beyond the minimum, vacuum when dead versions pass this fraction of the live rows
/// (autovacuum's default `autovacuum_vacuum_scale_factor`).
const DEAD_FRACTION: f64 = 0.2;

/// The table's dead and live row counts, the rows inserted since its last vacuum, whether
/// autovacuum covers it (for the log line when
/// this role may not vacuum), and whether this role may vacuum it (owners and superusers may,
/// in PostgreSQL 15).
const VACUUM_STATE: &str = "\
SELECT s.n_dead_tup, s.n_live_tup, s.n_ins_since_vacuum,
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
    /// Too few dead rows yet: nothing to do.
    NotNeeded,
    /// `VACUUM` ran (or found a vacuum already at work on the table and left it to that one);
    /// this many dead row versions, and rows inserted since the last vacuum, were counted before
    /// it.
    Vacuumed {
        dead_before: i64,
        inserted_before: i64,
    },
    /// Needed, but this role may not vacuum the table; `autovacuum` tells whether autovacuum
    /// covers it (late, but it does) or nothing does.
    NotAllowed { dead: i64, autovacuum: bool },
}

/// Whether `dead` row versions next to `live` ones call for a vacuum: at least
/// [`MIN_DEAD_ROWS`], and at least [`DEAD_FRACTION`] of the live rows.
fn past_threshold(dead: i64, live: i64) -> bool {
    dead >= MIN_DEAD_ROWS.max((live as f64 * DEAD_FRACTION) as i64)
}

/// Whether `inserted` rows since the last vacuum call for one: at least [`MIN_DEAD_ROWS`],
/// whatever the table's size, so that the unsummarized part of a BRIN index stays that small
/// (see the module comment).
fn enough_inserted(inserted: i64) -> bool {
    inserted >= MIN_DEAD_ROWS
}

/// Vacuum `table` on `conn` once enough dead rows piled up, whether or not autovacuum is on
/// (see the module comment). `table` must be a validated table name (it is interpolated into
/// `VACUUM`).
pub(crate) async fn vacuum_if_needed(
    conn: &mut PgConnection,
    table: &str,
) -> Result<VacuumOutcome> {
    let Some((dead, live, inserted, autovacuum, may_vacuum)) =
        sqlx::query_as::<_, (i64, i64, i64, bool, bool)>(VACUUM_STATE)
            .bind(table)
            .fetch_optional(&mut *conn)
            .await?
    else {
        // No statistics row yet (a table nobody wrote to since the server started).
        return Ok(VacuumOutcome::NotNeeded);
    };
    if !past_threshold(dead, live) && !enough_inserted(inserted) {
        return Ok(VacuumOutcome::NotNeeded);
    }
    if !may_vacuum {
        return Ok(VacuumOutcome::NotAllowed { dead, autovacuum });
    }
    // VACUUM cannot run in a transaction block: sent alone, in autocommit, on the leader's own
    // connection, so no pooled connection is held for its duration. SKIP_LOCKED: an autovacuum
    // (or an operator's VACUUM) already on the table is doing this work; waiting for it would
    // stall the leader's recovery and purge rounds, and our lock request would cancel an
    // autovacuum after deadlock_timeout.
    // A skipped table is reported as a WARNING notice, which sqlx would log at WARN each time
    // autovacuum happens to be on the table: expected here, so quieted for this one statement.
    sqlx::raw_sql("SET client_min_messages = error")
        .execute(&mut *conn)
        .await?;
    let vacuumed = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("VACUUM (SKIP_LOCKED) {table}")))
        .execute(&mut *conn)
        .await;
    sqlx::raw_sql("RESET client_min_messages")
        .execute(&mut *conn)
        .await?;
    vacuumed?;
    Ok(VacuumOutcome::Vacuumed {
        dead_before: dead,
        inserted_before: inserted,
    })
}

#[cfg(test)]
mod tests {
    use super::{enough_inserted, past_threshold};

    #[test]
    fn small_tables_wait_for_ten_thousand_dead_rows() {
        assert!(!past_threshold(0, 0));
        assert!(!past_threshold(9_999, 0));
        assert!(past_threshold(10_000, 0));
        assert!(!past_threshold(9_999, 40_000));
        assert!(past_threshold(10_000, 40_000));
    }

    #[test]
    fn inserts_call_for_a_vacuum_past_ten_thousand_whatever_the_size() {
        assert!(!enough_inserted(0));
        assert!(!enough_inserted(9_999));
        assert!(enough_inserted(10_000));
    }

    #[test]
    fn large_tables_wait_for_a_fifth_of_their_live_rows() {
        assert!(!past_threshold(19_999, 100_000));
        assert!(past_threshold(20_000, 100_000));
        assert!(!past_threshold(199_999, 1_000_000));
        assert!(past_threshold(200_000, 1_000_000));
    }
}

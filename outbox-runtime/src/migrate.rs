//! The base schema, embedded from this crate's own `migrations/` folder (inside the package, so
//! the crate builds from its published sources too).

use sqlx::PgPool;

/// The embedded migrator. sqlx takes an advisory lock while applying, so two processes calling
/// [`migrate`] at once apply each migration exactly once.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// The table that records which base-schema migrations are applied. Not sqlx's default
/// `_sqlx_migrations`: that one belongs to the service's own migrations folder (where the
/// generated outbox migration goes), and two migrators sharing one table would each see the
/// other's versions as missing or conflicting (both start at version 1).
pub const MIGRATIONS_TABLE: &str = "_outbox_migrations";

/// Apply the base schema (idempotent; safe to call concurrently from several processes).
///
/// Base migrations this version does not know are ignored: they were applied by a newer
/// release of the library, and during a rolling deploy the processes of the earlier release
/// still start (and call this) after the first process of the newer one migrated. Every base
/// migration keeps the earlier release working (expand before contract: docs/rolling-deploys.md
/// and the upgrade notes of each migration); a version it does know that differs from what it
/// applied is still refused.
pub async fn migrate(pool: &PgPool) -> crate::error::Result<()> {
    let mut migrator = sqlx::migrate::Migrator::with_migrations(MIGRATOR.iter().cloned().collect());
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator.set_ignore_missing(true);
    migrator.run(pool).await?;
    Ok(())
}

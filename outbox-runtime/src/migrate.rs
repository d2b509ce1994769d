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
pub async fn migrate(pool: &PgPool) -> crate::error::Result<()> {
    let mut migrator = sqlx::migrate::Migrator::with_migrations(MIGRATOR.iter().cloned().collect());
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator.run(pool).await?;
    Ok(())
}

//! The base schema, embedded from the workspace's `migrations/` folder.

use sqlx::PgPool;

/// The embedded migrator. sqlx takes an advisory lock while applying, so two processes calling
/// [`migrate`] at once apply each migration exactly once.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Apply the base schema (idempotent; safe to call concurrently from several processes).
pub async fn migrate(pool: &PgPool) -> crate::error::Result<()> {
    MIGRATOR.run(pool).await?;
    Ok(())
}

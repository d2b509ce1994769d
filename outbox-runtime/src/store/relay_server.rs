//! The server's side of a WAL relay: the settings and the role attribute it needs, read in one
//! statement (`sql/relay/server_settings.sql`). What they must be is decided by
//! `relay::preflight`, which has no SQL.

use sqlx::{PgExecutor, Row};

use super::sql::relay;
use crate::error::Result;

/// The server settings a relay depends on, as the server reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayServerSettings {
    /// `wal_level`: `logical` is required.
    pub wal_level: String,
    /// `max_replication_slots`.
    pub max_replication_slots: i32,
    /// Slots that exist now (active or not), of any kind.
    pub replication_slots_used: i32,
    /// Whether the relay's own slot exists already.
    pub slot_exists: bool,
    /// `max_wal_senders`.
    pub max_wal_senders: i32,
    /// Walsenders streaming now (`pg_stat_replication`).
    pub wal_senders_used: i32,
    /// `max_slot_wal_keep_size` in MB; -1 is unlimited.
    pub max_slot_wal_keep_size_mb: i64,
    /// Whether the connected role may read a slot (`REPLICATION` or superuser).
    pub can_replicate: bool,
    /// The connected role.
    pub role_name: String,
}

/// Reads [`RelayServerSettings`] on `executor`'s server, as its connected role, for the slot
/// named `slot`.
pub async fn relay_server_settings<'e>(
    executor: impl PgExecutor<'e>,
    slot: &str,
) -> Result<RelayServerSettings> {
    let row = sqlx::query(relay::SERVER_SETTINGS)
        .bind(slot)
        .fetch_one(executor)
        .await?;
    Ok(RelayServerSettings {
        wal_level: row.try_get("wal_level")?,
        max_replication_slots: row.try_get("max_replication_slots")?,
        replication_slots_used: row.try_get("replication_slots_used")?,
        slot_exists: row.try_get("slot_exists")?,
        max_wal_senders: row.try_get("max_wal_senders")?,
        wal_senders_used: row.try_get("wal_senders_used")?,
        max_slot_wal_keep_size_mb: row.try_get("max_slot_wal_keep_size_mb")?,
        can_replicate: row
            .try_get::<Option<bool>, _>("can_replicate")?
            .unwrap_or(false),
        role_name: row.try_get("role_name")?,
    })
}

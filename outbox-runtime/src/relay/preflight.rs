//! What a relay checks before it touches anything (docs/relay.md, "Failures and what
//! happens"): the server must decode logically, have room for the relay's slot and walsender,
//! and let the relay's role read a slot. Each problem is named with the command that fixes it;
//! an unbounded `max_slot_wal_keep_size` is a warning (the relay can run, but a relay that is
//! down would keep WAL for the whole cluster without bound).
//!
//! [`check`] decides from the settings alone (no SQL); [`preflight`] reads them first.

use std::fmt;

use sqlx::PgExecutor;

use crate::store::relay_server::{RelayServerSettings, relay_server_settings};

/// The slot of the relay of `table`: `outbox_relay_{table}`.
pub fn slot_name(table: &str) -> String {
    format!("outbox_relay_{table}")
}

/// A setting that keeps the relay from starting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// `wal_level` is not `logical`.
    WalLevel {
        /// What the server has.
        found: String,
    },
    /// Every replication slot is taken and the relay's own does not exist yet.
    NoSlotLeft {
        /// `max_replication_slots`.
        max: i32,
        /// Slots that exist.
        used: i32,
    },
    /// Every walsender is taken (or there are none).
    NoWalSender {
        /// `max_wal_senders`.
        max: i32,
        /// Walsenders streaming now.
        used: i32,
    },
    /// The role may not read a slot.
    NoReplicationRole {
        /// The connected role.
        role: String,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::WalLevel { found } => write!(
                f,
                "wal_level is {found}, and a relay reads the WAL through logical decoding: run \
                 `ALTER SYSTEM SET wal_level = logical;` and restart PostgreSQL"
            ),
            Problem::NoSlotLeft { max, used } => write!(
                f,
                "all {max} replication slots are taken ({used} exist) and the relay needs one: \
                 drop an unused slot (`SELECT pg_drop_replication_slot('name');`, see \
                 pg_replication_slots) or raise max_replication_slots \
                 (`ALTER SYSTEM SET max_replication_slots = {};` and restart PostgreSQL)",
                max + 1
            ),
            Problem::NoWalSender { max, used } => write!(
                f,
                "no walsender is free ({used} of max_wal_senders = {max} stream now) and the \
                 relay streams through one: `ALTER SYSTEM SET max_wal_senders = {};` and \
                 restart PostgreSQL",
                max + 1
            ),
            Problem::NoReplicationRole { role } => write!(
                f,
                "role {role} may not read a replication slot: `ALTER ROLE {role} REPLICATION;`"
            ),
        }
    }
}

/// A setting that lets the relay run but should be changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// `max_slot_wal_keep_size` is -1.
    UnboundedSlotWal,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::UnboundedSlotWal => write!(
                f,
                "max_slot_wal_keep_size is -1 (unlimited): while the relay is down its slot keeps \
                 every WAL segment of the cluster; cap it at the outage to ride out (WAL rate \
                 times time), e.g. `ALTER SYSTEM SET max_slot_wal_keep_size = '10GB'; SELECT \
                 pg_reload_conf();` (past the cap the slot is invalidated and the relay rebuilds \
                 it)"
            ),
        }
    }
}

/// Why a relay cannot start.
#[derive(Debug)]
pub enum PreflightError {
    /// The settings could not be read.
    Unreadable(crate::error::Error),
    /// The server or the role is not fit for a relay of `table`; every problem is listed.
    Unfit {
        /// The relay table.
        table: String,
        /// What is wrong, each with its fix.
        problems: Vec<Problem>,
    },
}

impl fmt::Display for PreflightError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PreflightError::Unreadable(e) => {
                write!(f, "reading the server settings a relay needs: {e}")
            }
            PreflightError::Unfit { table, problems } => {
                write!(f, "the relay of table {table} cannot start:")?;
                for p in problems {
                    write!(f, "\n  - {p}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for PreflightError {}

/// Decides from `settings` whether the relay of `table` can start; its warnings if it can.
pub fn check(table: &str, settings: &RelayServerSettings) -> Result<Vec<Warning>, PreflightError> {
    let mut problems = Vec::new();
    if settings.wal_level != "logical" {
        problems.push(Problem::WalLevel {
            found: settings.wal_level.clone(),
        });
    }
    if !settings.slot_exists && settings.replication_slots_used >= settings.max_replication_slots {
        problems.push(Problem::NoSlotLeft {
            max: settings.max_replication_slots,
            used: settings.replication_slots_used,
        });
    }
    if settings.wal_senders_used >= settings.max_wal_senders {
        problems.push(Problem::NoWalSender {
            max: settings.max_wal_senders,
            used: settings.wal_senders_used,
        });
    }
    if !settings.can_replicate {
        problems.push(Problem::NoReplicationRole {
            role: settings.role_name.clone(),
        });
    }
    if !problems.is_empty() {
        return Err(PreflightError::Unfit {
            table: table.to_owned(),
            problems,
        });
    }
    let mut warnings = Vec::new();
    if settings.max_slot_wal_keep_size_mb < 0 {
        warnings.push(Warning::UnboundedSlotWal);
    }
    Ok(warnings)
}

/// Reads the server's settings on `executor` and [`check`]s them for the relay of `table`.
pub async fn preflight<'e>(
    executor: impl PgExecutor<'e>,
    table: &str,
) -> Result<Vec<Warning>, PreflightError> {
    let settings = relay_server_settings(executor, &slot_name(table))
        .await
        .map_err(PreflightError::Unreadable)?;
    check(table, &settings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fit() -> RelayServerSettings {
        RelayServerSettings {
            wal_level: "logical".into(),
            max_replication_slots: 4,
            replication_slots_used: 1,
            slot_exists: false,
            max_wal_senders: 4,
            wal_senders_used: 0,
            max_slot_wal_keep_size_mb: 1024,
            can_replicate: true,
            role_name: "app".into(),
        }
    }

    #[test]
    fn a_fit_server_passes_without_warnings() {
        assert_eq!(check("payments", &fit()).unwrap(), []);
    }

    #[test]
    fn replica_wal_level_is_refused_with_the_command_that_fixes_it() {
        let settings = RelayServerSettings {
            wal_level: "replica".into(),
            ..fit()
        };
        let err = check("payments", &settings).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("the relay of table payments cannot start:"),
            "{text}"
        );
        assert!(text.contains("wal_level is replica"), "{text}");
        assert!(
            text.contains("ALTER SYSTEM SET wal_level = logical;"),
            "{text}"
        );
        assert!(text.contains("restart PostgreSQL"), "{text}");
    }

    #[test]
    fn every_problem_is_listed_at_once() {
        let settings = RelayServerSettings {
            wal_level: "minimal".into(),
            max_replication_slots: 2,
            replication_slots_used: 2,
            max_wal_senders: 0,
            can_replicate: false,
            ..fit()
        };
        let Err(PreflightError::Unfit { problems, .. }) = check("t", &settings) else {
            panic!("an unfit server passed");
        };
        assert_eq!(
            problems,
            [
                Problem::WalLevel {
                    found: "minimal".into()
                },
                Problem::NoSlotLeft { max: 2, used: 2 },
                Problem::NoWalSender { max: 0, used: 0 },
                Problem::NoReplicationRole { role: "app".into() },
            ]
        );
        assert!(
            problems[1]
                .to_string()
                .contains("max_replication_slots = 3")
        );
        assert!(
            problems[3]
                .to_string()
                .contains("ALTER ROLE app REPLICATION;")
        );
    }

    #[test]
    fn the_relays_own_slot_needs_no_free_one() {
        let settings = RelayServerSettings {
            replication_slots_used: 4,
            slot_exists: true,
            ..fit()
        };
        assert!(check("t", &settings).is_ok());
    }

    #[test]
    fn unbounded_slot_wal_is_a_warning() {
        let settings = RelayServerSettings {
            max_slot_wal_keep_size_mb: -1,
            ..fit()
        };
        let warnings = check("t", &settings).unwrap();
        assert_eq!(warnings, [Warning::UnboundedSlotWal]);
        assert!(warnings[0].to_string().contains("max_slot_wal_keep_size"));
    }
}

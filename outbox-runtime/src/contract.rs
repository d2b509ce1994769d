//! Payload contracts: (name, version, shape) and the shape's fingerprint.
//!
//! Owned by the macros work (issue 3) and used by the migration generator (issue 5).

/// The contract of one event version: its name, version, Rust type and canonical payload shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Contract {
    /// Event name.
    pub name: &'static str,
    /// Event version.
    pub version: u32,
    /// Rust type path, for error messages naming both sides of a conflict.
    pub type_name: &'static str,
    /// Canonical description of the payload (a JSON Schema), nested types included.
    pub shape: serde_json::Value,
}

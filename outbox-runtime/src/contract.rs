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

impl Contract {
    /// The shape serialized canonically (object keys sorted, no whitespace).
    pub fn canonical_shape(&self) -> String {
        // serde_json's default map is a BTreeMap, so keys serialize sorted.
        serde_json::to_string(&self.shape).expect("a JSON value always serializes")
    }

    /// SHA-256 of [`Contract::canonical_shape`], lowercase hex: what the contract lock records.
    pub fn fingerprint(&self) -> String {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(self.canonical_shape().as_bytes()))
    }
}

/// One event type linked into the binary, submitted by `#[derive(Event)]` through `inventory`.
///
/// The generator (issue 5) reads these to write migrations and the contract lock; the
/// dispatcher (issue 3) reads them to decode and upcast stored versions.
pub struct EventRegistration {
    /// Event name.
    pub name: &'static str,
    /// Event version.
    pub version: u32,
    /// Outbox table the event is written to.
    pub table: &'static str,
    /// Rust type path.
    pub type_name: &'static str,
    /// Whether this is the current version (it declares no upcast).
    pub is_current: bool,
    /// Builds the contract (the shape is computed on demand).
    pub contract: fn() -> Contract,
}

inventory::collect!(EventRegistration);

/// Every event type linked into the binary, sorted by (table, name, version).
pub fn registered_events() -> Vec<&'static EventRegistration> {
    let mut all: Vec<_> = inventory::iter::<EventRegistration>.into_iter().collect();
    all.sort_by(|a, b| (a.table, a.name, a.version).cmp(&(b.table, b.name, b.version)));
    all
}

//! Payload contracts: (name, version, shape) and the shape's fingerprint.
//!
//! Owned by the macros work (issue 3) and used by the migration generator (issue 5).

use std::any::{Any, TypeId};

use crate::event::Event;

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
    /// The shape serialized canonically (object keys sorted at every level, no whitespace).
    pub fn canonical_shape(&self) -> String {
        let mut out = String::new();
        write_canonical(&self.shape, &mut out);
        out
    }

    /// SHA-256 of [`Contract::canonical_shape`], lowercase hex: what the contract lock records.
    pub fn fingerprint(&self) -> String {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(self.canonical_shape().as_bytes()))
    }
}

/// Sorts keys explicitly instead of relying on serde_json's map type: another crate in the
/// build enabling serde_json's `preserve_order` must not change any fingerprint.
fn write_canonical(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Schema keywords that document a payload without constraining it. They are dropped from the
/// shape, so editing a doc comment or renaming a Rust type is not a contract change.
const ANNOTATIONS: &[&str] = &["$schema", "title", "description", "examples", "$comment"];

/// The canonical shape of `T`: its JSON Schema (draft 2020-12, as deserialized) with nested
/// types inlined and annotations removed. Recursive types keep `$defs`/`$ref` for the cycle.
pub fn shape_of<T: schemars::JsonSchema + ?Sized>() -> serde_json::Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator();
    let mut shape = serde_json::Value::from(generator.into_root_schema_for::<T>());
    strip_annotations(&mut shape, false);
    shape
}

/// Remove [`ANNOTATIONS`] from every schema object. `in_properties` marks a map of field names,
/// whose keys are data (a field may be called `title`) and are kept.
fn strip_annotations(value: &mut serde_json::Value, in_properties: bool) {
    match value {
        serde_json::Value::Object(map) => {
            if !in_properties {
                map.retain(|k, _| !ANNOTATIONS.contains(&k.as_str()));
            }
            for (key, child) in map.iter_mut() {
                let names_fields = !in_properties
                    && matches!(
                        key.as_str(),
                        "properties" | "$defs" | "definitions" | "patternProperties"
                    );
                strip_annotations(child, names_fields);
            }
        }
        serde_json::Value::Array(items) => {
            items.iter_mut().for_each(|v| strip_annotations(v, false))
        }
        _ => {}
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
    /// `TypeId` of this type.
    pub type_id: fn() -> TypeId,
    /// `TypeId` of its current version (`Event::Current`).
    pub current_type_id: fn() -> TypeId,
    /// Rust type path of its current version.
    pub current_type_name: fn() -> &'static str,
    /// Decode a stored payload of this version and upcast it to the current version, boxed
    /// as `Box<Event::Current>` (used by the dispatcher).
    pub decode_current: DecodeCurrent,
}

/// Decodes a stored payload of one version into its current version, type-erased.
pub type DecodeCurrent = fn(serde_json::Value) -> Result<Box<dyn Any + Send>, serde_json::Error>;

impl EventRegistration {
    /// The registration of `E`; `type_name` is its path, `is_current` whether it declares no
    /// upcast. Used by `#[derive(Event)]`.
    pub const fn of<E: Event>(type_name: &'static str, is_current: bool) -> Self {
        EventRegistration {
            name: E::NAME,
            version: E::VERSION,
            table: E::TABLE,
            type_name,
            is_current,
            contract: E::contract,
            type_id: TypeId::of::<E>,
            current_type_id: TypeId::of::<E::Current>,
            current_type_name: std::any::type_name::<E::Current>,
            decode_current: decode_current::<E>,
        }
    }
}

fn decode_current<E: Event>(
    payload: serde_json::Value,
) -> Result<Box<dyn Any + Send>, serde_json::Error> {
    let stored: E = serde_json::from_value(payload)?;
    Ok(Box::new(stored.into_current()))
}

inventory::collect!(EventRegistration);

/// Every event type linked into the binary, sorted by (table, name, version).
pub fn registered_events() -> Vec<&'static EventRegistration> {
    let mut all: Vec<_> = inventory::iter::<EventRegistration>.into_iter().collect();
    all.sort_by(|a, b| (a.table, a.name, a.version).cmp(&(b.table, b.name, b.version)));
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn contract(shape: serde_json::Value) -> Contract {
        Contract {
            name: "x",
            version: 1,
            type_name: "x::X",
            shape,
        }
    }

    #[test]
    fn the_canonical_shape_sorts_keys_at_every_level() {
        let a = contract(json!({"b": 1, "a": {"d": [{"z": 1, "y": 2}], "c": null}}));
        assert_eq!(
            a.canonical_shape(),
            r#"{"a":{"c":null,"d":[{"y":2,"z":1}]},"b":1}"#
        );
        let reordered = contract(json!({"a": {"c": null, "d": [{"y": 2, "z": 1}]}, "b": 1}));
        assert_eq!(a.fingerprint(), reordered.fingerprint());
        assert_ne!(a.fingerprint(), contract(json!({"b": 2})).fingerprint());
    }

    #[test]
    fn annotations_are_stripped_but_fields_named_like_them_are_kept() {
        let mut shape = json!({
            "title": "Order",
            "description": "docs",
            "type": "object",
            "properties": {
                "title": {"type": "string", "description": "the order's title"},
                "total": {"type": "integer", "examples": [1]}
            },
            "required": ["title", "total"]
        });
        strip_annotations(&mut shape, false);
        assert_eq!(
            shape,
            json!({
                "type": "object",
                "properties": {"title": {"type": "string"}, "total": {"type": "integer"}},
                "required": ["title", "total"]
            })
        );
    }
}

//! Payload contracts: (name, version, shape) and the shape's fingerprint.
//!
//! Owned by the macros work (issue 3) and used by the migration generator (issue 5).

use std::any::{Any, TypeId};

use crate::error::{Error, Result};
use crate::event::Event;

/// The longest event name (and aggregate type) accepted, in bytes.
pub const MAX_EVENT_NAME_LEN: usize = 128;

/// The event name rule in words; `#[derive(Event)]` checks the same rule at compile time.
pub const EVENT_NAME_RULE: &str = "1 to 128 characters: lowercase ASCII letters, digits, `_` and `-`, in parts \
                                   separated by single dots, each part starting with a letter or digit \
                                   (for example `order.confirmed`)";

/// Refuse an event name outside [`EVENT_NAME_RULE`].
///
/// A name is stored, written into generated migrations and the contract lock, logged, and mapped
/// to a NATS subject token by token; names of this set need no quoting in any of them.
/// `#[derive(Event)]` refuses other names at compile time; this is the check for names that
/// arrive otherwise (an `Event` impl written by hand, a contract built at run time, the
/// contract registry or lock read back).
pub fn validate_event_name(name: &str) -> Result<()> {
    validate_name("event name", name)
}

/// Refuse an aggregate type outside [`EVENT_NAME_RULE`] (aggregate types follow the event name
/// rule).
pub fn validate_aggregate_type(aggregate_type: &str) -> Result<()> {
    validate_name("aggregate type", aggregate_type)
}

fn validate_name(kind: &'static str, name: &str) -> Result<()> {
    match name_problem(name) {
        None => Ok(()),
        Some(problem) => Err(Error::InvalidEventName {
            kind,
            name: shown(name),
            problem,
        }),
    }
}

/// What is wrong with `name`, or `None` when it follows [`EVENT_NAME_RULE`].
fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("it is empty".to_owned());
    }
    if let Some(c) = name.chars().find(|c| !is_name_char(*c)) {
        return Some(format!("it contains {}", describe(c)));
    }
    if name.len() > MAX_EVENT_NAME_LEN {
        return Some(format!("it is {} characters long", name.len()));
    }
    if name.split('.').any(str::is_empty) {
        return Some("it has an empty part (a leading, trailing or doubled `.`)".to_owned());
    }
    if let Some(part) = name.split('.').find(|p| p.starts_with(['_', '-'])) {
        return Some(format!(
            "its part `{part}` does not start with a letter or digit"
        ));
    }
    None
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-' | '.')
}

fn describe(c: char) -> String {
    if c.is_ascii_uppercase() {
        format!("the uppercase letter `{c}`")
    } else if c.is_control() || c.is_whitespace() || !c.is_ascii() {
        format!("the character U+{:04X}", u32::from(c))
    } else {
        format!("`{c}`")
    }
}

/// Untrusted text for a message or a log line: escaped (a line break shows as `\n`) and cut
/// after 160 characters, so neither a hostile nor a huge value can shape the message.
pub fn shown(text: &str) -> String {
    let escaped: String = text.escape_debug().collect();
    match escaped.char_indices().nth(160) {
        Some((cut, _)) => format!("{}...", &escaped[..cut]),
        None => escaped,
    }
}

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
    fn event_names_follow_the_rule_of_the_derive() {
        for good in [
            "order.confirmed",
            "cart.checked_out",
            "v2.order-placed",
            "invoice_paid",
        ] {
            validate_event_name(good).unwrap();
        }
        validate_event_name(&"a".repeat(MAX_EVENT_NAME_LEN)).unwrap();
        let cases = [
            (
                "x\nDROP TABLE victim; --",
                "it contains the character U+000A",
            ),
            ("a*/b", "it contains `*`"),
            ("it's", "it contains `'`"),
            ("a$$b", "it contains `$`"),
            ("a\"b", "it contains `\"`"),
            ("a\\b", "it contains `\\`"),
            ("a\0b", "it contains the character U+0000"),
            ("a\u{2028}b", "it contains the character U+2028"),
            ("a\u{85}b", "it contains the character U+0085"),
            ("Order", "it contains the uppercase letter `O`"),
            ("", "it is empty"),
            ("a..b", "it has an empty part"),
            ("a._b", "its part `_b` does not start"),
        ];
        for (name, problem) in cases {
            let message = validate_event_name(name).unwrap_err().to_string();
            assert!(message.contains(problem), "{name:?}: {message}");
            assert!(message.contains("lowercase ASCII letters"), "{message}");
            assert!(
                !message.contains('\n') && !message.contains('\0'),
                "{message}"
            );
        }
        let huge = "a".repeat(10_000);
        let message = validate_event_name(&huge).unwrap_err().to_string();
        assert!(message.contains("it is 10000 characters long"), "{message}");
        assert!(
            message.len() < 600,
            "the name is cut in the message: {message}"
        );
        let message = validate_aggregate_type("Order").unwrap_err().to_string();
        assert!(message.contains("aggregate type"), "{message}");
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

    /// The rule of [`EVENT_NAME_RULE`], written independently of `name_problem`.
    fn follows_the_rule(name: &str) -> bool {
        (1..=MAX_EVENT_NAME_LEN).contains(&name.len())
            && name.split('.').all(|part| {
                part.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && part.chars().all(|c| {
                        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-'
                    })
            })
    }

    proptest::proptest! {
        /// Names written by the rule are accepted, as event names and as aggregate types.
        #[test]
        fn names_by_the_rule_are_accepted(
            name in "[a-z0-9][a-z0-9_-]{0,20}(\\.[a-z0-9][a-z0-9_-]{0,20}){0,4}",
        ) {
            proptest::prop_assert!(validate_event_name(&name).is_ok(), "{}", name);
            proptest::prop_assert!(validate_aggregate_type(&name).is_ok(), "{}", name);
        }

        /// Arbitrary text (hostile characters, line breaks, unicode) is accepted exactly when
        /// it follows the rule; a refusal names the text escaped and short, on one line.
        #[test]
        fn arbitrary_names_are_accepted_only_by_the_rule(
            name in "\\PC{0,40}|[a-z0-9._\\n'\"*/$-]{0,40}|[a-z]{120,140}",
        ) {
            let verdict = validate_event_name(&name);
            proptest::prop_assert_eq!(verdict.is_ok(), follows_the_rule(&name), "{:?}", name);
            if let Err(error) = verdict {
                let message = error.to_string();
                proptest::prop_assert!(!message.contains(['\n', '\r', '\u{2028}', '\u{85}']), "{}", message);
                proptest::prop_assert!(message.len() < 1_000, "{}", message);
            }
        }
    }

    proptest::proptest! {
        /// Doc comments (descriptions, titles, examples) anywhere in a shape are not part of it,
        /// while fields named like those keywords stay fields.
        #[test]
        fn annotations_never_change_a_shape(
            fields in proptest::collection::btree_map(
                "[a-z]{1,6}|title|description|examples",
                proptest::sample::select(&["integer", "string", "boolean"][..]),
                1..6,
            ),
            doc in "\\PC{0,30}",
        ) {
            let plain = |annotate: bool| {
                let properties: serde_json::Map<String, serde_json::Value> = fields
                    .iter()
                    .map(|(name, ty)| {
                        let mut field = json!({ "type": ty });
                        if annotate {
                            field["description"] = json!(doc);
                            field["examples"] = json!([doc]);
                        }
                        (name.clone(), field)
                    })
                    .collect();
                let mut shape = json!({ "type": "object", "properties": properties });
                if annotate {
                    shape["title"] = json!(doc);
                    shape["$comment"] = json!(doc);
                }
                shape
            };
            let mut annotated = plain(true);
            strip_annotations(&mut annotated, false);
            proptest::prop_assert_eq!(annotated, plain(false));
        }
    }
}

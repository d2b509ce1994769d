//! Which fields of a payload shape changed: a structural diff of two JSON Schemas.
//!
//! A fingerprint only says *that* a shape changed. To tell a developer what to fix, the
//! generator compares the shape recorded in the contract lock with the compiled one and names
//! each field that was added, removed, retyped, or made (non-)required, nested types included
//! (`$defs`, `definitions`), array items and map values too.

use std::collections::BTreeSet;
use std::fmt;

use serde_json::{Map, Value};

/// One difference between two payload shapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeChange {
    /// Where: a field path such as `total_cents`, `lines[].sku` or `Address.city` (a field of
    /// the nested type `Address`); empty for the payload itself.
    pub path: String,
    /// The nested type the path starts in, when the change is inside a `$defs` entry.
    pub nested_type: Option<String>,
    /// What changed, in words (`was added`, `changed type from "integer" to "string"`).
    pub what: String,
}

impl fmt::Display for ShapeChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(ty) = &self.nested_type {
            write!(f, "nested type `{ty}`: ")?;
        }
        if self.path.is_empty() {
            write!(f, "the payload {}", self.what)
        } else {
            write!(f, "field `{}` {}", self.path, self.what)
        }
    }
}

/// The differences between the `old` and the `new` shape, in a stable order (fields sorted by
/// name, nested types after the payload's own fields). Empty when the shapes are equal.
pub fn diff_shapes(old: &Value, new: &Value) -> Vec<ShapeChange> {
    let mut changes = Vec::new();
    let root = Location {
        nested_type: None,
        path: String::new(),
    };
    diff_schema(old, new, &root, &mut changes);
    if changes.is_empty() && old != new {
        // Not reachable for schemas this module understands; never report "no change" for two
        // shapes whose fingerprints differ.
        changes.push(ShapeChange {
            path: String::new(),
            nested_type: None,
            what: "changed".into(),
        });
    }
    changes
}

/// Where in the shape a schema node sits.
#[derive(Clone)]
struct Location {
    nested_type: Option<String>,
    path: String,
}

impl Location {
    fn field(&self, name: &str) -> Location {
        let path = if self.path.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.path)
        };
        Location {
            nested_type: self.nested_type.clone(),
            path,
        }
    }

    fn suffixed(&self, suffix: &str) -> Location {
        Location {
            nested_type: self.nested_type.clone(),
            path: format!("{}{suffix}", self.path),
        }
    }

    fn nested(name: &str) -> Location {
        Location {
            nested_type: Some(name.to_owned()),
            path: String::new(),
        }
    }

    fn change(&self, what: impl Into<String>) -> ShapeChange {
        ShapeChange {
            path: self.path.clone(),
            nested_type: self.nested_type.clone(),
            what: what.into(),
        }
    }
}

/// Keywords holding sub-schemas that are walked structurally; every other keyword is compared
/// as a value.
const STRUCTURAL: &[&str] = &[
    "properties",
    "required",
    "$defs",
    "definitions",
    "items",
    "additionalProperties",
    "anyOf",
    "oneOf",
    "allOf",
];

fn diff_schema(old: &Value, new: &Value, at: &Location, out: &mut Vec<ShapeChange>) {
    let (Value::Object(old), Value::Object(new)) = (old, new) else {
        if old != new {
            out.push(at.change(format!("changed from {} to {}", brief(old), brief(new))));
        }
        return;
    };

    diff_keywords(old, new, at, out);
    diff_properties(old, new, at, out);
    diff_sub_schema(
        old.get("items"),
        new.get("items"),
        &at.suffixed("[]"),
        "item schema",
        out,
    );
    diff_sub_schema(
        old.get("additionalProperties"),
        new.get("additionalProperties"),
        &at.suffixed("{}"),
        "map value schema",
        out,
    );
    for keyword in ["anyOf", "oneOf", "allOf"] {
        diff_variants(keyword, old.get(keyword), new.get(keyword), at, out);
    }
    for keyword in ["$defs", "definitions"] {
        diff_definitions(old.get(keyword), new.get(keyword), out);
    }
}

/// Plain keywords (`type`, `format`, `enum`, `$ref`, `minimum`, `description`, ...).
fn diff_keywords(
    old: &Map<String, Value>,
    new: &Map<String, Value>,
    at: &Location,
    out: &mut Vec<ShapeChange>,
) {
    let keys: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    for key in keys
        .into_iter()
        .filter(|k| !STRUCTURAL.contains(&k.as_str()))
    {
        match (old.get(key), new.get(key)) {
            (Some(o), Some(n)) if o == n => {}
            (Some(o), Some(n)) if key == "type" => {
                out.push(at.change(format!("changed type from {} to {}", brief(o), brief(n))));
            }
            (Some(o), Some(n)) if key == "$ref" => {
                out.push(at.change(format!(
                    "now refers to {} instead of {}",
                    brief(n),
                    brief(o)
                )));
            }
            (Some(o), Some(n)) => {
                out.push(at.change(format!("changed `{key}` from {} to {}", brief(o), brief(n))))
            }
            (Some(o), None) => out.push(at.change(format!("lost `{key}` (was {})", brief(o)))),
            (None, Some(n)) => out.push(at.change(format!("gained `{key}` ({})", brief(n)))),
            (None, None) => {}
        }
    }
}

/// Fields: added, removed, changed, and their `required` status.
fn diff_properties(
    old: &Map<String, Value>,
    new: &Map<String, Value>,
    at: &Location,
    out: &mut Vec<ShapeChange>,
) {
    let empty = Map::new();
    let old_props = old
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let new_props = new
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let old_required = required_set(old);
    let new_required = required_set(new);

    let names: BTreeSet<&String> = old_props.keys().chain(new_props.keys()).collect();
    for name in names {
        let field = at.field(name);
        match (old_props.get(name), new_props.get(name)) {
            (Some(o), Some(n)) => {
                diff_schema(o, n, &field, out);
                match (
                    old_required.contains(name.as_str()),
                    new_required.contains(name.as_str()),
                ) {
                    (false, true) => out.push(field.change("became required")),
                    (true, false) => out.push(field.change("is no longer required")),
                    _ => {}
                }
            }
            (Some(_), None) => out.push(field.change("was removed")),
            (None, Some(n)) => {
                let required = if new_required.contains(name.as_str()) {
                    "required"
                } else {
                    "optional"
                };
                out.push(field.change(format!("was added ({required}, {})", describe_type(n))));
            }
            (None, None) => {}
        }
    }
}

fn diff_sub_schema(
    old: Option<&Value>,
    new: Option<&Value>,
    at: &Location,
    label: &str,
    out: &mut Vec<ShapeChange>,
) {
    match (old, new) {
        (Some(o), Some(n)) => diff_schema(o, n, at, out),
        (Some(o), None) => out.push(at.change(format!("lost its {label} (was {})", brief(o)))),
        (None, Some(n)) => out.push(at.change(format!("gained an {label} ({})", brief(n)))),
        (None, None) => {}
    }
}

/// `anyOf` / `oneOf` / `allOf`: compared variant by variant when the count is unchanged (the
/// usual case for an `Option<T>` or an enum whose variants changed inside).
fn diff_variants(
    keyword: &str,
    old: Option<&Value>,
    new: Option<&Value>,
    at: &Location,
    out: &mut Vec<ShapeChange>,
) {
    match (old.and_then(Value::as_array), new.and_then(Value::as_array)) {
        (Some(o), Some(n)) if o.len() == n.len() => {
            for (i, (o, n)) in o.iter().zip(n).enumerate() {
                diff_schema(o, n, &at.suffixed(&format!("<{keyword} {}>", i + 1)), out);
            }
        }
        (Some(o), Some(n)) => {
            out.push(at.change(format!(
                "changed `{keyword}` from {} to {} variants",
                o.len(),
                n.len()
            )));
        }
        (Some(_), None) => out.push(at.change(format!("lost `{keyword}`"))),
        (None, Some(_)) => out.push(at.change(format!("gained `{keyword}`"))),
        (None, None) => {}
    }
}

/// Nested types: the schema of every type the payload refers to.
fn diff_definitions(old: Option<&Value>, new: Option<&Value>, out: &mut Vec<ShapeChange>) {
    let empty = Map::new();
    let old = old.and_then(Value::as_object).unwrap_or(&empty);
    let new = new.and_then(Value::as_object).unwrap_or(&empty);
    let names: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    for name in names {
        let at = Location::nested(name);
        match (old.get(name), new.get(name)) {
            (Some(o), Some(n)) => diff_schema(o, n, &at, out),
            (Some(_), None) => out.push(at.change("was removed")),
            (None, Some(_)) => out.push(at.change("was added")),
            (None, None) => {}
        }
    }
}

fn required_set(schema: &Map<String, Value>) -> BTreeSet<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// A short description of a field's type for "was added" messages.
fn describe_type(schema: &Value) -> String {
    if let Some(ty) = schema.get("type") {
        return format!("type {}", brief(ty));
    }
    if let Some(target) = schema.get("$ref").and_then(Value::as_str) {
        return format!("type `{}`", target.rsplit('/').next().unwrap_or(target));
    }
    "any type".to_owned()
}

/// A value in a message: compact JSON, cut short when long.
fn brief(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 80 {
        let cut: String = text.chars().take(77).collect();
        format!("{cut}...")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(old: Value, new: Value) -> Vec<String> {
        diff_shapes(&old, &new)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn equal_shapes_have_no_changes() {
        let shape =
            json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
        assert!(diff_shapes(&shape, &shape).is_empty());
    }

    #[test]
    fn names_retyped_added_removed_and_required_fields() {
        let old = json!({"type": "object",
            "properties": {"total": {"type": "integer"}, "note": {"type": "string"}, "gone": {"type": "boolean"}},
            "required": ["total"]});
        let new = json!({"type": "object",
            "properties": {"total": {"type": "string"}, "note": {"type": "string"}, "fresh": {"type": "integer"}},
            "required": ["total", "note", "fresh"]});
        assert_eq!(
            messages(old, new),
            [
                "field `fresh` was added (required, type \"integer\")",
                "field `gone` was removed",
                "field `note` became required",
                "field `total` changed type from \"integer\" to \"string\"",
            ]
        );
    }

    #[test]
    fn walks_nested_types_arrays_and_options() {
        let old = json!({"type": "object",
            "properties": {"lines": {"type": "array", "items": {"$ref": "#/$defs/Line"}},
                           "address": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}]}},
            "$defs": {"Line": {"type": "object", "properties": {"sku": {"type": "string"}}},
                      "Address": {"type": "object", "properties": {"city": {"type": "string"}}}}});
        let new = json!({"type": "object",
            "properties": {"lines": {"type": "array", "items": {"$ref": "#/$defs/Line"}},
                           "address": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}]}},
            "$defs": {"Line": {"type": "object", "properties": {"sku": {"type": "integer"}}},
                      "Address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}}}}});
        assert_eq!(
            messages(old, new),
            [
                "nested type `Address`: field `zip` was added (optional, type \"string\")",
                "nested type `Line`: field `sku` changed type from \"string\" to \"integer\"",
            ]
        );
    }

    #[test]
    fn inline_nested_objects_get_dotted_paths() {
        let old = json!({"properties": {"items": {"type": "array", "items": {"properties": {"qty": {"type": "integer"}}}}}});
        let new = json!({"properties": {"items": {"type": "array", "items": {"properties": {"qty": {"type": "number"}}}}}});
        assert_eq!(
            messages(old, new),
            ["field `items[].qty` changed type from \"integer\" to \"number\""]
        );
    }

    /// An object schema with the given fields (name -> JSON type), every field required.
    fn object_shape(fields: &std::collections::BTreeMap<String, &str>) -> Value {
        let properties: serde_json::Map<String, Value> = fields
            .iter()
            .map(|(name, ty)| (name.clone(), serde_json::json!({ "type": ty })))
            .collect();
        serde_json::json!({
            "type": "object",
            "properties": properties,
            "required": fields.keys().collect::<Vec<_>>(),
        })
    }

    const TYPES: [&str; 4] = ["integer", "string", "boolean", "number"];

    fn fields()
    -> impl proptest::strategy::Strategy<Value = std::collections::BTreeMap<String, &'static str>>
    {
        proptest::collection::btree_map("[a-z]{1,6}", proptest::sample::select(&TYPES[..]), 1..6)
    }

    proptest::proptest! {
        /// A shape compared with itself has no change.
        #[test]
        fn a_shape_equals_itself(fields in fields()) {
            let shape = object_shape(&fields);
            proptest::prop_assert!(diff_shapes(&shape, &shape).is_empty());
        }

        /// Any field whose type changes is reported, by its name.
        #[test]
        fn a_changed_field_type_is_reported_by_name(fields in fields(), pick in 0usize..6, shift in 1usize..4) {
            let name = fields.keys().nth(pick % fields.len()).unwrap().clone();
            let old_type = fields[&name];
            let new_type = TYPES[(TYPES.iter().position(|t| *t == old_type).unwrap() + shift) % TYPES.len()];
            let mut changed = fields.clone();
            changed.insert(name.clone(), new_type);
            let changes = diff_shapes(&object_shape(&fields), &object_shape(&changed));
            proptest::prop_assert!(changes.iter().any(|c| c.path == name), "{:?} -> {:?}: {:?}", fields, changed, changes.iter().map(ToString::to_string).collect::<Vec<_>>());
        }

        /// A field added or removed is reported, by its name, in both directions.
        #[test]
        fn an_added_or_removed_field_is_reported_by_name(fields in fields(), extra in "[a-z]{7,9}") {
            let mut grown = fields.clone();
            grown.insert(extra.clone(), "string");
            let (old, new) = (object_shape(&fields), object_shape(&grown));
            proptest::prop_assert!(diff_shapes(&old, &new).iter().any(|c| c.path == extra));
            proptest::prop_assert!(diff_shapes(&new, &old).iter().any(|c| c.path == extra));
        }
    }
}

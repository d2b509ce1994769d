//! What `#[derive(Event)]` generates: constants, aggregate accessors, upcasts, the contract
//! shape and its registration. No database needed.

use outbox_runtime::Event;
use outbox_runtime::contract::{Contract, registered_events};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "order.confirmed", version = 2)]
pub struct OrderConfirmed {
    #[outbox(aggregate_id)]
    pub order_id: Uuid,
    #[outbox(aggregate_version)]
    pub revision: i32,
    pub total_cents: i64,
    pub lines: Vec<Line>,
}

/// A nested type: its fields are part of the contract shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Line {
    pub sku: String,
    pub quantity: u32,
}

/// Version 1 had no lines and no revision; it inherits name and table from the target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1, upcast = OrderConfirmed)]
pub struct OrderConfirmedV1 {
    #[outbox(aggregate_id)]
    pub order_id: Uuid,
    pub total_cents: i64,
}

impl From<OrderConfirmedV1> for OrderConfirmed {
    fn from(v1: OrderConfirmedV1) -> Self {
        OrderConfirmed {
            order_id: v1.order_id,
            revision: 0,
            total_cents: v1.total_cents,
            lines: Vec::new(),
        }
    }
}

/// Defaults: name from the type, table `outbox`, no aggregate.
#[derive(Debug, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1)]
pub struct CacheFlushed {}

/// An enum payload, written to another table, with the aggregate type given explicitly.
#[derive(Debug, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1, table = "billing_outbox")]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PaymentChanged {
    Captured { amount_cents: i64 },
    Refunded { amount_cents: i64, reason: String },
}

#[derive(Debug, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(version = 1, aggregate = "customer")]
pub struct AddressChanged {
    #[outbox(aggregate_id)]
    pub id: u64,
    /// A doc comment is documentation, not contract.
    pub street: String,
}

#[test]
fn constants_follow_the_attributes_and_the_documented_defaults() {
    assert_eq!(OrderConfirmed::NAME, "order.confirmed");
    assert_eq!(OrderConfirmed::VERSION, 2);
    assert_eq!(OrderConfirmed::TABLE, "outbox");
    assert_eq!(
        OrderConfirmed::AGGREGATE_TYPE,
        Some("order"),
        "from `order_id`"
    );

    assert_eq!(
        OrderConfirmedV1::NAME,
        "order.confirmed",
        "inherited from the upcast target"
    );
    assert_eq!(OrderConfirmedV1::VERSION, 1);
    assert_eq!(OrderConfirmedV1::AGGREGATE_TYPE, Some("order"));

    assert_eq!(
        CacheFlushed::NAME,
        "cache_flushed",
        "snake_case of the type name"
    );
    assert_eq!(CacheFlushed::TABLE, "outbox");
    assert_eq!(CacheFlushed::AGGREGATE_TYPE, None);

    assert_eq!(PaymentChanged::TABLE, "billing_outbox");
    assert_eq!(PaymentChanged::AGGREGATE_TYPE, None);
    assert_eq!(AddressChanged::AGGREGATE_TYPE, Some("customer"));
}

#[test]
fn aggregate_accessors_read_the_marked_fields() {
    let id = Uuid::new_v4();
    let event = OrderConfirmed {
        order_id: id,
        revision: 7,
        total_cents: 100,
        lines: vec![],
    };
    assert_eq!(event.aggregate_id(), Some(id.to_string()));
    assert_eq!(event.aggregate_version(), Some(7));
    assert_eq!(CacheFlushed {}.aggregate_id(), None);
    assert_eq!(
        AddressChanged {
            id: 42,
            street: "Main".into()
        }
        .aggregate_id()
        .as_deref(),
        Some("42")
    );
}

#[test]
fn an_older_version_upcasts_to_the_current_type_through_from() {
    let id = Uuid::new_v4();
    let current: OrderConfirmed = OrderConfirmedV1 {
        order_id: id,
        total_cents: 250,
    }
    .into_current();
    assert_eq!(
        current,
        OrderConfirmed {
            order_id: id,
            revision: 0,
            total_cents: 250,
            lines: vec![]
        }
    );
    // The current version upcasts to itself.
    let same = current.clone().into_current();
    assert_eq!(same, current);
}

fn property_names(contract: &Contract) -> Vec<String> {
    let mut names: Vec<String> = contract.shape["properties"]
        .as_object()
        .expect("an object schema")
        .keys()
        .cloned()
        .collect();
    names.sort();
    names
}

#[test]
fn the_contract_shape_includes_nested_types_and_is_canonical() {
    let contract = OrderConfirmed::contract();
    assert_eq!((contract.name, contract.version), ("order.confirmed", 2));
    assert!(
        contract
            .type_name
            .ends_with("events_contract::OrderConfirmed"),
        "{}",
        contract.type_name
    );
    assert_eq!(
        property_names(&contract),
        ["lines", "order_id", "revision", "total_cents"]
    );
    // The nested `Line` is inlined, so its fields are part of this contract.
    let line = &contract.shape["properties"]["lines"]["items"];
    let mut line_fields: Vec<&String> = line["properties"]
        .as_object()
        .expect("Line inlined")
        .keys()
        .collect();
    line_fields.sort();
    assert_eq!(line_fields, ["quantity", "sku"]);

    // Deterministic: the same text and fingerprint every time, keys sorted.
    let canonical = contract.canonical_shape();
    assert_eq!(canonical, OrderConfirmed::contract().canonical_shape());
    assert!(!canonical.contains(char::is_whitespace), "{canonical}");
    assert_eq!(contract.fingerprint().len(), 64);
    assert_ne!(
        contract.fingerprint(),
        OrderConfirmedV1::contract().fingerprint(),
        "different shapes"
    );
}

#[test]
fn doc_comments_and_type_names_are_not_part_of_the_shape() {
    let shape = AddressChanged::contract().canonical_shape();
    assert!(!shape.contains("doc comment"), "{shape}");
    assert!(!shape.contains("AddressChanged"), "{shape}");
    assert!(
        !shape.contains("OrderConfirmed"),
        "{}",
        OrderConfirmed::contract().canonical_shape()
    );
}

#[test]
fn enum_payloads_have_a_shape_covering_every_variant() {
    let shape = PaymentChanged::contract().canonical_shape();
    for needle in ["captured", "refunded", "amount_cents", "reason"] {
        assert!(shape.contains(needle), "{needle} missing from {shape}");
    }
}

#[test]
fn every_derived_type_is_registered_with_its_current_version() {
    let registered: Vec<(&str, u32, &str, bool)> = registered_events()
        .iter()
        .map(|r| (r.name, r.version, r.table, r.is_current))
        .collect();
    for expected in [
        ("order.confirmed", 1, "outbox", false),
        ("order.confirmed", 2, "outbox", true),
        ("cache_flushed", 1, "outbox", true),
        ("payment_changed", 1, "billing_outbox", true),
    ] {
        assert!(
            registered.contains(&expected),
            "{expected:?} not in {registered:?}"
        );
    }
    let v1 = registered_events()
        .into_iter()
        .find(|r| r.name == "order.confirmed" && r.version == 1)
        .unwrap();
    assert_eq!(
        (v1.current_type_id)(),
        std::any::TypeId::of::<OrderConfirmed>()
    );
    assert_eq!((v1.contract)(), OrderConfirmedV1::contract());
    // The type-erased decoder decodes a stored v1 payload and upcasts it.
    let id = Uuid::new_v4();
    let decoded =
        (v1.decode_current)(serde_json::json!({"order_id": id, "total_cents": 5})).unwrap();
    let current = decoded
        .downcast::<OrderConfirmed>()
        .expect("boxed current type");
    assert_eq!(current.total_cents, 5);
}

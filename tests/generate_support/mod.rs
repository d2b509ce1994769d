//! Shared helpers of the `generate_*` and `cli_*` tests: contracts built by hand (so a test
//! states the exact shape it changes), a temporary migrations folder, a derived event type
//! (`#[derive(Event)]`) for rows in the database, whose contract is the derive's, and login
//! roles for the grants.
#![allow(dead_code)] // each test file uses a different subset

use std::path::{Path, PathBuf};

use outbox_runtime::Event;
use outbox_runtime::contract::Contract;
use outbox_runtime::generate::CompiledEvent;
use outbox_runtime::testing::TestDatabase;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// A migrations folder of its own for one test, removed on drop.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new() -> TempDir {
        let path =
            std::env::temp_dir().join(format!("outbox-gen-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path).expect("creating a temporary folder");
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// File name -> contents of every file in the folder.
    pub fn files(&self) -> Vec<(String, String)> {
        let mut files: Vec<(String, String)> = std::fs::read_dir(&self.path)
            .expect("reading the folder")
            .map(|e| {
                let e = e.expect("a folder entry");
                let name = e.file_name().to_string_lossy().into_owned();
                (
                    name,
                    std::fs::read_to_string(e.path()).expect("a text file"),
                )
            })
            .collect();
        files.sort();
        files
    }

    pub fn names(&self) -> Vec<String> {
        self.files().into_iter().map(|(n, _)| n).collect()
    }

    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path.join(name))
            .unwrap_or_else(|e| panic!("reading {name}: {e}"))
    }

    pub fn write(&self, name: &str, text: &str) {
        std::fs::write(self.path.join(name), text)
            .unwrap_or_else(|e| panic!("writing {name}: {e}"));
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A compiled event version with an explicit shape.
pub fn event(
    name: &'static str,
    version: u32,
    table: &str,
    type_name: &'static str,
    shape: Value,
) -> CompiledEvent {
    CompiledEvent {
        contract: Contract {
            name,
            version,
            type_name,
            shape,
        },
        table: table.to_owned(),
    }
}

/// `order.confirmed` v1: { order_id: string, total_cents: integer, address: { city } }.
pub fn order_confirmed_v1() -> CompiledEvent {
    event(
        "order.confirmed",
        1,
        "outbox",
        "shop::OrderConfirmedV1",
        order_confirmed_v1_shape(),
    )
}

pub fn order_confirmed_v1_shape() -> Value {
    json!({
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "format": "uuid"},
            "total_cents": {"type": "integer", "format": "int64"},
            "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        },
        "required": ["order_id", "total_cents", "address"]
    })
}

/// `order.confirmed` v2: total_cents became a string amount, and currency was added.
pub fn order_confirmed_v2() -> CompiledEvent {
    event(
        "order.confirmed",
        2,
        "outbox",
        "shop::OrderConfirmed",
        json!({
            "type": "object",
            "properties": {
                "order_id": {"type": "string", "format": "uuid"},
                "amount": {"type": "string"},
                "currency": {"type": "string"},
                "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
            },
            "required": ["order_id", "amount", "currency", "address"]
        }),
    )
}

/// `shipment.sent` v1, written to its own outbox table `shipping_outbox`.
pub fn shipment_sent() -> CompiledEvent {
    event(
        "shipment.sent",
        1,
        "shipping_outbox",
        "shop::ShipmentSent",
        json!({"type": "object", "properties": {"tracking": {"type": "string"}}, "required": ["tracking"]}),
    )
}

/// An event type for rows in the database: `parcel.sent` v1, no aggregate, default table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "parcel.sent", version = 1)]
pub struct Parcel {
    pub tracking: String,
}

/// The generator's view of [`Parcel`], built from its derived contract.
pub fn parcel_event() -> CompiledEvent {
    CompiledEvent {
        contract: Parcel::contract(),
        table: Parcel::TABLE.to_owned(),
    }
}

/// Enqueue `n` parcels in one transaction; returns their event ids.
pub async fn enqueue_parcels(pool: &sqlx::PgPool, prefix: &str, n: usize) -> Vec<uuid::Uuid> {
    let mut tx = pool.begin().await.expect("begin");
    let mut ids = Vec::new();
    for i in 0..n {
        let parcel = Parcel {
            tracking: format!("{prefix}-{i}"),
        };
        ids.push(
            parcel
                .enqueue(&mut tx, &format!("{prefix}-{i}"))
                .await
                .expect("enqueue"),
        );
    }
    tx.commit().await.expect("commit");
    ids
}

/// Texts an attacker would put into a name: SQL after a line break (`\n`, `\r`, U+2028,
/// U+0085), a block comment's end, each quote PostgreSQL knows (`'`, `"`, `$$`, `E'\'`), NUL,
/// and a 10 kB name.
pub fn hostile_texts() -> Vec<String> {
    let mut texts: Vec<String> = [
        "x\nDROP TABLE victim; --",
        "x\rDROP TABLE victim; --",
        "x\u{2028}DROP TABLE victim; --",
        "x\u{85}DROP TABLE victim; --",
        "x */ DROP TABLE victim; /*",
        "x'); DROP TABLE victim; --",
        "x\\'); DROP TABLE victim; --",
        "x$$); DROP TABLE victim; --$$",
        "x$shape$); DROP TABLE victim; --",
        "x\"; DROP TABLE victim; --",
        "x\0DROP TABLE victim; --",
        "{shape}",
    ]
    .iter()
    .map(|t| (*t).to_owned())
    .collect();
    texts.push(format!("x{}\nDROP TABLE victim; --", "a".repeat(10_000)));
    texts
}

/// `text` with a `'static` lifetime, as a contract holds it (a test builds a few).
pub fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

/// Two login roles with unique names (roles are cluster-wide; tests run in parallel), dropped
/// at the end of the test.
pub struct Roles {
    pub enqueuer: String,
    pub worker: String,
}

impl Roles {
    pub async fn create(db: &TestDatabase) -> Roles {
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let roles = Roles {
            enqueuer: format!("enq_{}", &suffix[..12]),
            worker: format!("wrk_{}", &suffix[..12]),
        };
        for role in [&roles.enqueuer, &roles.worker] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE ROLE {role} LOGIN")))
                .execute(db.pool())
                .await
                .unwrap();
        }
        roles
    }

    pub async fn drop_all(self, db: &TestDatabase) {
        for role in [&self.enqueuer, &self.worker] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP OWNED BY {role}; DROP ROLE {role}"
            )))
            .execute(db.pool())
            .await
            .unwrap();
        }
    }
}

/// A pool of connections logged in as `role`.
pub async fn pool_as(db: &TestDatabase, role: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect_with(db.connect_options().clone().username(role))
        .await
        .unwrap()
}

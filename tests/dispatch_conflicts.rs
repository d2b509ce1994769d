//! `DispatcherBuilder::build` refuses, before anything is delivered, two types claiming one
//! (name, version), and two current versions of one event. Each error names the types.

use outbox_runtime::{Delivery, Dispatcher, Event, HandlerError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Two teams picked the same name and version.
#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "parcel.sent", version = 1)]
pub struct ParcelSent {
    pub tracking: String,
}

mod shipping {
    use super::*;

    #[derive(Serialize, Deserialize, JsonSchema, Event)]
    #[outbox(name = "parcel.sent", version = 1)]
    pub struct ParcelDispatched {
        pub carrier: String,
    }
}

/// Version 2 was added but version 1 was not told to upcast.
#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "refund.issued", version = 1)]
pub struct RefundIssuedV1 {
    pub cents: i64,
}

#[derive(Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "refund.issued", version = 2)]
pub struct RefundIssued {
    pub cents: i64,
    pub reason: String,
}

async fn on_parcel_sent(_e: ParcelSent, _ctx: Delivery) -> Result<(), HandlerError> {
    Ok(())
}

async fn on_refund(_e: RefundIssued, _ctx: Delivery) -> Result<(), HandlerError> {
    Ok(())
}

#[test]
fn two_types_with_the_same_name_and_version_are_named_in_the_error() {
    let msg = Dispatcher::builder()
        .handler(on_parcel_sent)
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("both claim event `parcel.sent` version 1"),
        "{msg}"
    );
    assert!(msg.contains("ParcelSent"), "{msg}");
    assert!(msg.contains("shipping::ParcelDispatched"), "{msg}");
}

#[test]
fn two_current_versions_of_one_event_are_refused() {
    let msg = Dispatcher::builder()
        .handler(on_refund)
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("event `refund.issued` version 1 (`dispatch_conflicts::RefundIssuedV1`)"),
        "{msg}"
    );
    assert!(msg.contains("upcast = NewerType"), "{msg}");
}

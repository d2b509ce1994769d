//! `crate = path`: generated code reaches the runtime through a re-export, as a service that
//! wraps the runtime in its own crate would (serde's `test_serde_path.rs` idea).

mod platform {
    /// A service's own facade over the runtime.
    pub mod outbox {
        pub use outbox_runtime::*;
    }
}

use platform::outbox as ob;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, ob::Event)]
#[outbox(crate = crate::platform::outbox, name = "user.renamed", version = 2)]
pub struct UserRenamed {
    #[outbox(aggregate_id)]
    pub user_id: u64,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, ob::Event)]
#[outbox(crate = "crate::platform::outbox", version = 1, upcast = UserRenamed)]
pub struct UserRenamedV1 {
    #[outbox(aggregate_id)]
    pub user_id: u64,
}

impl From<UserRenamedV1> for UserRenamed {
    fn from(v1: UserRenamedV1) -> Self {
        UserRenamed {
            user_id: v1.user_id,
            name: String::new(),
        }
    }
}

#[ob::handler(crate = crate::platform::outbox)]
async fn on_user_renamed(event: UserRenamed, _ctx: ob::Delivery) -> Result<(), ob::HandlerError> {
    let _ = event;
    Ok(())
}

#[ob::catalogue(crate = crate::platform::outbox, handler = UserEvents)]
pub mod users {
    use super::ob;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Serialize, Deserialize, JsonSchema, ob::Event)]
    #[outbox(crate = crate::platform::outbox, version = 1)]
    pub struct UserDeleted {
        pub user_id: u64,
    }
}

struct Users;

impl users::UserEvents for Users {
    async fn user_deleted(
        &self,
        _event: users::UserDeleted,
        _ctx: ob::Delivery,
    ) -> Result<(), ob::HandlerError> {
        Ok(())
    }
}

#[test]
fn every_macro_works_through_a_re_export() {
    use ob::Event;
    assert_eq!(UserRenamed::NAME, "user.renamed");
    assert_eq!(UserRenamedV1::NAME, "user.renamed");
    assert_eq!(UserRenamed::AGGREGATE_TYPE, Some("user"));
    assert_eq!(
        UserRenamedV1 { user_id: 4 }.into_current(),
        UserRenamed {
            user_id: 4,
            name: String::new()
        }
    );
    let by_inventory = ob::Dispatcher::from_inventory().unwrap();
    assert_eq!(
        by_inventory.routes(),
        [("user.renamed", 1), ("user.renamed", 2)]
    );
    let by_catalogue = users::dispatcher(Users).unwrap();
    assert_eq!(by_catalogue.routes(), [("user_deleted", 1)]);
}

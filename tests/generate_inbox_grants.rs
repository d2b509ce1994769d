//! Least privilege for consumers: the generated inbox grants, applied to a real role. The
//! consumer role applies an event once, checks it and purges old records through
//! `outbox_runtime::inbox`; rewriting a record or touching the outbox is refused.

use std::time::Duration;

use outbox_runtime::generate::inbox_grants_sql;
use outbox_runtime::inbox::{self, ApplyOutcome};
use outbox_runtime::testing::TestDatabase;
use sqlx::postgres::PgPoolOptions;

const DENIED: &str = "42501";

#[tokio::test]
async fn an_inbox_consumer_role_applies_checks_and_purges_and_nothing_else() {
    let db = TestDatabase::new().await;
    let role = format!("inbox_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE ROLE {role} LOGIN")))
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(inbox_grants_sql(&[&role]).unwrap()))
        .execute(db.pool())
        .await
        .unwrap();
    let consumer = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(db.connect_options().clone().username(&role))
        .await
        .unwrap();

    let event = uuid::Uuid::new_v4();
    for expected in [ApplyOutcome::Applied, ApplyOutcome::Duplicate] {
        let mut tx = consumer.begin().await.unwrap();
        let outcome = inbox::apply_once(&mut tx, "billing", event).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(outcome, expected);
    }
    assert!(
        inbox::is_applied(&consumer, "billing", event)
            .await
            .unwrap()
    );
    sqlx::query("UPDATE outbox_inbox SET received_at = now() - interval '2 days'")
        .execute(db.pool())
        .await
        .unwrap();
    assert_eq!(
        inbox::purge(&consumer, Duration::from_secs(3600))
            .await
            .unwrap(),
        1
    );

    // Rewriting a record, or reading or writing the outbox, is not the consumer's business.
    for forbidden in [
        "UPDATE outbox_inbox SET consumer = 'other'",
        "SELECT count(*) FROM outbox",
        "DELETE FROM outbox",
        "SELECT count(*) FROM outbox_queue",
        "DELETE FROM outbox_queue",
    ] {
        let error = sqlx::query(forbidden)
            .execute(&consumer)
            .await
            .expect_err(forbidden);
        let code = error
            .as_database_error()
            .and_then(|d| d.code())
            .map(|c| c.into_owned());
        assert_eq!(code.as_deref(), Some(DENIED), "{forbidden}: {error}");
    }

    consumer.close().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP OWNED BY {role}; DROP ROLE {role}"
    )))
    .execute(db.pool())
    .await
    .unwrap();
}

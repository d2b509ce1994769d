//! No property of one row affects another row's delivery: a claimed row whose payload or headers
//! cannot be decoded is exhausted with its own reason while the rest of its batch is delivered,
//! enqueue refuses such payloads with a typed error (the caller's transaction stays usable), and
//! an expired lease backs off before its event is claimable again, so a payload that kills or
//! stalls workers does not hot-loop.

mod worker_support;

use std::collections::HashSet;
use std::time::Duration;

use outbox_runtime::error::{PayloadPart, PayloadProblem};
use outbox_runtime::payload_limits::MAX_JSON_DEPTH;
use outbox_runtime::store::{EnqueueOptions, RecoveryBackoff, UndecodableOutcome};
use outbox_runtime::worker::{RetryPolicy, Worker, WorkerBuilder, WorkerEvent};
use outbox_runtime::{Error, Event, Store};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Row};
use worker_support::receiver::{Knobs, Receiver};
use worker_support::*;

const WAIT: Duration = Duration::from_secs(90);

/// An event whose payload can be nested as deep as a caller likes.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, Event)]
#[outbox(name = "tree", version = 1)]
pub struct Tree {
    pub root: serde_json::Value,
}

/// `depth` nested arrays around `1`: `[[1]]` is depth 2.
fn arrays(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

/// `depth` nested objects around `1`: `{"n":{"n":1}}` is depth 2.
fn objects(depth: usize) -> String {
    format!("{}1{}", "{\"n\":".repeat(depth), "}".repeat(depth))
}

/// A `job` event written by raw SQL (enqueue refuses these payloads), with its queue row as
/// the enqueue writes it; returns (id, event_id).
async fn insert_raw_job(
    pool: &PgPool,
    key: &str,
    payload: &str,
    headers: &str,
) -> (i64, uuid::Uuid) {
    let row = sqlx::query(
        "WITH e AS (
             INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload, headers)
             VALUES (gen_random_uuid(), $1, '\\x00', 'job', 1, $2::text::jsonb, $3::text::jsonb)
             RETURNING id, event_id, aggregate_type, aggregate_id
         ), q AS (
             INSERT INTO outbox_queue (id, aggregate_type, aggregate_id)
             SELECT id, aggregate_type, aggregate_id FROM e
         )
         SELECT id, event_id FROM e",
    )
    .bind(key)
    .bind(payload)
    .bind(headers)
    .fetch_one(pool)
    .await
    .expect("PostgreSQL stores the poison row");
    (row.get("id"), row.get("event_id"))
}

/// A poison row and the words its own reason must contain.
struct Poison {
    id: i64,
    event_id: uuid::Uuid,
    reason: &'static str,
}

async fn insert_poison(pool: &PgPool, prefix: &str) -> Vec<Poison> {
    let too_deep = "deeper than 64 levels";
    let cases: Vec<(String, String, &'static str)> = vec![
        // Beyond serde_json's own recursion limit (128): used to fail the whole batch.
        (arrays(200), "{}".into(), too_deep),
        (arrays(129), "{}".into(), too_deep),
        // Between the shared limit and serde_json's: refused by the same rule as enqueue.
        (objects(MAX_JSON_DEPTH + 1), "{}".into(), too_deep),
        // Headers, not the payload.
        ("{\"n\": 1}".into(), objects(200), "undecodable headers"),
        (
            "{\"n\": 2}".into(),
            arrays(MAX_JSON_DEPTH + 1),
            "undecodable headers",
        ),
        // jsonb stores numbers serde_json cannot represent.
        ("{\"n\": 1e400}".into(), "{}".into(), "number out of range"),
    ];
    let mut rows = Vec::new();
    for (i, (payload, headers, reason)) in cases.into_iter().enumerate() {
        let (id, event_id) =
            insert_raw_job(pool, &format!("{prefix}-{i}"), &payload, &headers).await;
        rows.push(Poison {
            id,
            event_id,
            reason,
        });
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_rows_are_exhausted_with_their_own_reason_and_every_good_event_is_delivered_once() {
    let db = database().await;
    let pool = db.pool().clone();
    // Poison rows between good ones, so every claim batch that meets one also holds good rows.
    enqueue_jobs(&pool, 0, 500, false).await;
    let mut poison = insert_poison(&pool, "poison-a").await;
    enqueue_jobs(&pool, 500, 1000, false).await;
    poison.extend(insert_poison(&pool, "poison-b").await);

    let worker = Worker::builder(
        pool.clone(),
        Receiver::new(pool.clone(), "w", Knobs::default()),
    )
    .lease(Duration::from_secs(2))
    .maintenance_interval(Duration::from_millis(200))
    .poll_interval(Duration::from_millis(100))
    .retry(RetryPolicy {
        base: Duration::from_millis(50),
        max: Duration::from_millis(200),
        jitter: true,
    })
    .start()
    .await
    .unwrap();
    wait_until(WAIT, "no event is pending or processing", || async {
        count_status(&pool, "pending").await + count_status(&pool, "processing").await == 0
    })
    .await;
    worker.shutdown().await;

    let log = received(&pool).await;
    let poison_ids: HashSet<uuid::Uuid> = poison.iter().map(|p| p.event_id).collect();
    let delivered_ids: HashSet<uuid::Uuid> = log.iter().map(|r| r.event_id).collect();
    assert_eq!(
        log.len(),
        1000,
        "every good event reaches the receiver exactly once"
    );
    assert_eq!(
        delivered_ids.len(),
        1000,
        "no good event is delivered twice"
    );
    assert!(log.iter().all(|r| r.outcome == "ok" && r.attempt == 1));
    assert!(
        delivered_ids.is_disjoint(&poison_ids),
        "no poison row reaches the receiver"
    );
    assert_eq!(effects(&pool).await, 1000);
    assert_eq!(count_status(&pool, "delivered").await, 1000);

    // No lease expired: not the good events' (delivered, they keep no queue row; each delivery
    // saw none counted on its row), nor the poison rows'.
    assert!(
        log.iter().all(|r| r.lease_expiries == Some(0)),
        "a good event's lease expired: {:?}",
        log.iter()
            .filter(|r| r.lease_expiries != Some(0))
            .take(3)
            .collect::<Vec<_>>()
    );
    let all = queue_rows(&pool).await;
    assert_eq!(all.len(), poison.len(), "{all:?}");
    assert!(
        all.iter().all(|r| r.lease_expiries == 0),
        "no lease expired: {:?}",
        all.iter()
            .filter(|r| r.lease_expiries > 0)
            .take(3)
            .collect::<Vec<_>>()
    );
    for p in &poison {
        let row = all.iter().find(|r| r.id == p.id).unwrap();
        assert_eq!(row.status, "exhausted", "{row:?}");
        assert_eq!((row.attempts, row.handler_failures), (1, 0), "{row:?}");
        let reason = row.last_error.as_deref().unwrap_or_default();
        assert!(
            reason.contains(p.reason) && !reason.contains("lease expired"),
            "row {} keeps its own reason (`{}`), got: {reason}",
            p.id,
            p.reason
        );
    }
    let c = worker.counters();
    assert_eq!(
        (c.delivered, c.undecodable, c.exhausted, c.retried),
        (1000, 12, 12, 0)
    );
}

#[tokio::test]
async fn claim_batch_returns_the_good_rows_of_a_batch_holding_a_poison_row() {
    let db = database().await;
    let pool = db.pool().clone();
    let store = Store::new(pool.clone());
    enqueue_jobs(&pool, 0, 2, false).await;
    let (poison_id, poison_event) = insert_raw_job(&pool, "deep", &arrays(200), "{}").await;
    enqueue_jobs(&pool, 2, 4, false).await;

    let claimed = store
        .claim_batch("w", 10, Duration::from_secs(30), false)
        .await
        .expect("a poison row does not fail the claim of its batch");
    let ns: Vec<i64> = claimed
        .iter()
        .map(|e| e.payload["n"].as_i64().unwrap())
        .collect();
    assert_eq!(ns, vec![0, 1, 2, 3]);
    let row = queue_rows(&pool)
        .await
        .into_iter()
        .find(|r| r.id == poison_id)
        .unwrap();
    assert_eq!(
        (row.status.as_str(), row.attempts),
        ("exhausted", 1),
        "{row:?}"
    );
    assert!(row.last_error.unwrap().contains("deeper than 64 levels"));

    // The detailed claim reports the row it exhausted, by its claim and event id.
    let (second, second_event) = insert_raw_job(&pool, "deep-headers", "{}", &objects(100)).await;
    enqueue_jobs(&pool, 4, 5, false).await;
    let batch = store
        .claim_batch_outcome("w", 10, Duration::from_secs(30), false)
        .await
        .unwrap();
    assert_eq!(batch.events.len(), 1);
    assert_eq!(batch.undecodable.len(), 1);
    let u = &batch.undecodable[0];
    assert_eq!((u.claim.id, u.event_id), (second, second_event));
    assert_eq!(u.outcome, UndecodableOutcome::Exhausted);
    assert!(u.reason.contains("undecodable headers"), "{}", u.reason);
    assert_ne!(poison_event, second_event);
    // Exhausted rows are never claimed again.
    assert!(
        store
            .claim_batch("w", 10, Duration::from_secs(30), false)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn enqueue_refuses_what_a_worker_could_not_decode_and_the_transaction_stays_usable() {
    let db = database().await;
    let pool = db.pool().clone();
    let deepest: serde_json::Value = serde_json::from_str(&arrays(MAX_JSON_DEPTH - 1)).unwrap();
    let too_deep: serde_json::Value = serde_json::from_str(&arrays(MAX_JSON_DEPTH)).unwrap();

    let mut tx = pool.begin().await.unwrap();
    // {"root": ...} adds one level: MAX_JSON_DEPTH - 1 arrays inside it is exactly the limit.
    Tree {
        root: deepest.clone(),
    }
    .enqueue(&mut tx, "at-the-limit")
    .await
    .expect("a payload at the limit is accepted");
    let refused = Tree {
        root: too_deep.clone(),
    }
    .enqueue(&mut tx, "too-deep")
    .await
    .unwrap_err();
    match &refused {
        Error::PayloadRejected {
            event_type,
            part: PayloadPart::Payload,
            problem: PayloadProblem::TooDeep { limit },
        } => assert_eq!((event_type.as_str(), *limit), ("tree", MAX_JSON_DEPTH)),
        other => panic!("expected PayloadRejected(TooDeep), got {other:?}"),
    }
    let message = refused.to_string();
    assert!(
        message.contains("deeper than 64 levels") && message.contains("flatten"),
        "the message says what is wrong and what to do: {message}"
    );

    let options = EnqueueOptions {
        headers: Some(serde_json::json!({ "trace": too_deep })),
        ..Default::default()
    };
    let refused = Tree {
        root: serde_json::json!(1),
    }
    .enqueue_with(&mut tx, "deep-headers", &options)
    .await
    .unwrap_err();
    assert!(
        matches!(
            refused,
            Error::PayloadRejected {
                part: PayloadPart::Headers,
                ..
            }
        ),
        "{refused:?}"
    );

    // PostgreSQL's jsonb cannot store U+0000: refused before the insert could abort `tx`.
    let refused = Tree {
        root: serde_json::json!("a\u{0}b"),
    }
    .enqueue(&mut tx, "nul")
    .await
    .unwrap_err();
    assert!(
        matches!(
            refused,
            Error::PayloadRejected {
                problem: PayloadProblem::NulCharacter,
                ..
            }
        ),
        "{refused:?}"
    );

    // The transaction is still usable: more writes, and the commit, succeed.
    Job { n: 7 }
        .enqueue(&mut tx, "after-refusals")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let keys: Vec<String> = sqlx::query_scalar("SELECT operation_key FROM outbox ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(keys, vec!["at-the-limit", "after-refusals"]);

    // And the deepest accepted payload is delivered like any other.
    let store = Store::new(pool.clone());
    let claimed = store
        .claim_batch("w", 10, Duration::from_secs(30), false)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    assert_eq!(claimed[0].payload["root"], deepest);
}

/// Seconds between a row's available_at and its updated_at (both set by one statement's now()).
async fn backoff_of(pool: &PgPool, id: i64) -> (String, f64) {
    sqlx::query_as(
        "SELECT status, extract(epoch FROM available_at - updated_at)::float8 FROM outbox_queue WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn expire_lease(pool: &PgPool, id: i64) {
    sqlx::query("UPDATE outbox_queue SET lease_until = now() - interval '1 second' WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn recovery_backs_off_exponentially_and_the_event_is_not_claimable_until_then() {
    let db = database().await;
    let pool = db.pool().clone();
    let store = Store::new(pool.clone());
    enqueue_jobs_with_attempts(&pool, 0, 1, 3).await;
    let backoff = RecoveryBackoff {
        base: Duration::from_millis(700),
        max: Duration::from_millis(1000),
        jitter: false,
    };
    let lease = Duration::from_secs(30);

    // Attempt 1 expires: back to pending after base (by the database clock).
    let first = store.claim_batch("w", 1, lease, false).await.unwrap();
    let id = first[0].id;
    expire_lease(&pool, id).await;
    assert_eq!(
        store.recover_expired(10, backoff).await.unwrap().requeued,
        1
    );
    let (status, after) = backoff_of(&pool, id).await;
    assert_eq!(status, "pending");
    assert!(
        (after - 0.7).abs() < 1e-6,
        "first backoff is the base: {after}"
    );
    assert!(
        store
            .claim_batch("w", 1, lease, false)
            .await
            .unwrap()
            .is_empty(),
        "the recovered event is not claimable before its backoff ends"
    );
    // Claimable again once the database clock passes available_at, and not before.
    let available_at: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT available_at FROM outbox_queue WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if !store
            .claim_batch("w", 1, lease, false)
            .await
            .unwrap()
            .is_empty()
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the event never became claimable again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let claimed_at: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT updated_at FROM outbox_queue WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(
        claimed_at >= available_at,
        "claimed at {claimed_at}, available at {available_at}"
    );

    // Attempt 2 expires: the backoff doubles, capped at max (1.4 s -> 1 s).
    expire_lease(&pool, id).await;
    assert_eq!(
        store.recover_expired(10, backoff).await.unwrap().requeued,
        1
    );
    let (_, after) = backoff_of(&pool, id).await;
    assert!(
        (after - 1.0).abs() < 1e-6,
        "second backoff is capped: {after}"
    );

    // The third and last attempt expires: exhausted, not requeued.
    sqlx::query("UPDATE outbox_queue SET available_at = now() - interval '1 second' WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    let third = store.claim_batch("w", 1, lease, false).await.unwrap();
    assert_eq!(third[0].attempts, 3);
    expire_lease(&pool, id).await;
    let counts = store.recover_expired(10, backoff).await.unwrap();
    assert_eq!((counts.requeued, counts.exhausted), (0, 1));
}

#[tokio::test]
async fn jittered_recovery_backoff_stays_in_the_upper_half() {
    let db = database().await;
    let pool = db.pool().clone();
    let store = Store::new(pool.clone());
    enqueue_jobs(&pool, 0, 50, false).await;
    let claimed = store
        .claim_batch("w", 50, Duration::from_secs(30), false)
        .await
        .unwrap();
    sqlx::query("UPDATE outbox_queue SET lease_until = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    let backoff = RecoveryBackoff {
        base: Duration::from_secs(4),
        max: Duration::from_secs(60),
        jitter: true,
    };
    assert_eq!(
        store.recover_expired(100, backoff).await.unwrap().requeued,
        50
    );
    let mut delays = Vec::new();
    for e in &claimed {
        let (status, after) = backoff_of(&pool, e.id).await;
        assert_eq!(status, "pending");
        assert!((2.0..=4.0).contains(&after), "jittered delay {after}");
        delays.push(after);
    }
    let distinct: HashSet<u64> = delays.iter().map(|d| (d * 1e6) as u64).collect();
    assert!(distinct.len() > 1, "jitter spreads the rows: {delays:?}");
}

/// A worker whose handler (3 s) outlives its unrenewed 300 ms lease, like a worker that stalls
/// on a payload, with maintenance every 100 ms; it reports to `events`.
fn stalling_worker(
    pool: &PgPool,
    events: tokio::sync::mpsc::UnboundedSender<WorkerEvent>,
) -> WorkerBuilder {
    let knobs = Knobs {
        delay: Duration::from_secs(3),
        ..Default::default()
    };
    Worker::builder(pool.clone(), Receiver::new(pool.clone(), "w", knobs))
        .lease(Duration::from_millis(300))
        .renewal(false)
        .maintenance_interval(Duration::from_millis(100))
        .poll_interval(Duration::from_millis(50))
        .events(events)
}

/// `n` jobs on their last attempt, claimed by a worker that is gone, their leases ended.
async fn expired_last_attempts(pool: &PgPool, n: i64) {
    enqueue_jobs_with_attempts(pool, 0, n, 1).await;
    let claimed = Store::new(pool.clone())
        .claim_batch("gone", n, Duration::from_secs(30), false)
        .await
        .unwrap();
    assert_eq!(claimed.len() as i64, n);
    sqlx::query("UPDATE outbox_queue SET lease_until = now() - interval '1 second'")
        .execute(pool)
        .await
        .unwrap();
}

/// From now on, record in the table `log` the number of rows of every `event` statement
/// (`UPDATE` or `DELETE`) on `table` (`outbox` or `outbox_queue`) whose text contains
/// `marker`, a statement that touches no row included; [`statement_sizes`] reads them back in
/// order.
async fn record_statement_sizes(pool: &PgPool, log: &str, table: &str, event: &str, marker: &str) {
    let rows = if event == "DELETE" { "OLD" } else { "NEW" };
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {log} (n bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
         CREATE FUNCTION {log}() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF current_query() LIKE '%{marker}%' THEN
                 INSERT INTO {log} (n) SELECT count(*) FROM statement_rows;
             END IF;
             RETURN NULL;
         END $$;
         CREATE TRIGGER {log} AFTER {event} ON {table}
             REFERENCING {rows} TABLE AS statement_rows
             FOR EACH STATEMENT EXECUTE FUNCTION {log}();"
    )))
    .execute(pool)
    .await
    .unwrap();
}

/// The sizes [`record_statement_sizes`] recorded in `log` so far, in order.
async fn statement_sizes(pool: &PgPool, log: &str) -> Vec<i64> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT n FROM {log} ORDER BY at"
    )))
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_maintenance_applies_its_retry_policy_to_expired_leases() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 1, false).await;
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let worker = stalling_worker(&pool, tx)
        .retry(RetryPolicy {
            base: Duration::from_secs(2),
            max: Duration::from_secs(10),
            jitter: false,
        })
        .start()
        .await
        .unwrap();
    wait_event(
        &mut events,
        Duration::from_secs(20),
        "recovery of the expired lease",
        |e| matches!(e, WorkerEvent::MaintenanceRan { requeued: 1, .. }),
    )
    .await;
    let row = queue_rows(&pool).await.remove(0);
    worker.shutdown().await;
    assert_eq!(
        (row.status.as_str(), row.lease_expiries),
        ("pending", 1),
        "{row:?}"
    );
    assert!(
        row.available_in_secs > 1.0,
        "the worker's 2 s base backoff applies after a lease expiry: available in {} s",
        row.available_in_secs
    );
}

/// An expired lease on the last attempt is exhausted by maintenance, and the pass reports it
/// as exhausted, not requeued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_exhausts_an_expired_lease_on_its_last_attempt_and_says_so() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs_with_attempts(&pool, 0, 1, 1).await;
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let worker = stalling_worker(&pool, tx).start().await.unwrap();
    wait_event(
        &mut events,
        Duration::from_secs(20),
        "a maintenance pass that exhausted the expired lease",
        |e| {
            matches!(
                e,
                WorkerEvent::MaintenanceRan {
                    requeued: 0,
                    exhausted: 1,
                    ..
                }
            )
        },
    )
    .await;
    let row = queue_rows(&pool).await.remove(0);
    worker.shutdown().await;
    assert_eq!(
        (row.status.as_str(), row.attempts, row.lease_expiries),
        ("exhausted", 1, 1),
        "{row:?}"
    );
}

/// A maintenance pass does not stop at one batch: it keeps recovering and purging, a batch a
/// statement, until a statement finds less than a batch (up to ten statements of each kind), and
/// its counts add every statement up. 25 expired leases on their last attempt and 25 delivered
/// events past retention, with batches of 10: one pass handles all 50.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_maintenance_pass_recovers_and_purges_more_than_a_batch() {
    let db = database().await;
    let pool = db.pool().clone();
    expired_last_attempts(&pool, 25).await;
    enqueue_jobs(&pool, 25, 50, false).await;
    // Delivered (the queue rows gone) and enqueued an hour ago: past the retention, which counts
    // from the enqueue.
    sqlx::raw_sql(
        "UPDATE outbox SET created_at = now() - interval '1 hour'
         WHERE id IN (SELECT id FROM outbox_queue WHERE status = 'pending');
         DELETE FROM outbox_queue WHERE status = 'pending'",
    )
    .execute(&pool)
    .await
    .unwrap();
    // Events are deleted by the purge only (and by completions with a retention of zero, which
    // this worker does not have); the marker is the purge's retention test.
    record_statement_sizes(
        &pool,
        "purge_sizes",
        "outbox",
        "DELETE",
        "e.created_at < now() -",
    )
    .await;
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::builder(
        pool.clone(),
        Receiver::new(pool.clone(), "w", Knobs::default()),
    )
    .maintenance_batch(10)
    .maintenance_interval(Duration::from_secs(3))
    .retention(Some(Duration::from_secs(60)))
    .events(tx)
    .start()
    .await
    .unwrap();
    let first_pass = wait_event(
        &mut events,
        Duration::from_secs(20),
        "a maintenance pass",
        |e| matches!(e, WorkerEvent::MaintenanceRan { .. }),
    )
    .await;
    // Read before the next pass, a maintenance interval (3 s) later.
    let purges = statement_sizes(&pool, "purge_sizes").await;
    worker.shutdown().await;
    assert_eq!(
        purges,
        vec![10, 10, 5],
        "purge statements of the pass: whole batches until one finds less, then no more"
    );
    assert_eq!(
        first_pass,
        WorkerEvent::MaintenanceRan {
            requeued: 0,
            exhausted: 25,
            purged: 25
        }
    );
    let left: Vec<String> = worker_support::events(&pool)
        .await
        .into_iter()
        .map(|e| e.status)
        .collect();
    assert!(
        left.len() == 25 && left.iter().all(|s| s == "exhausted"),
        "{left:?}"
    );
}

/// After a failed maintenance statement the next one is half a batch (a slow database is not
/// hammered with statements that time out), and once one succeeds the batch is whole again; a
/// statement that finds less than a batch ends the pass's recovery. Triggers make the first
/// pass's recovery fail and record the size of every recovery statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_recovery_halves_the_next_batch_and_a_success_restores_it() {
    let db = database().await;
    let pool = db.pool().clone();
    expired_last_attempts(&pool, 50).await;
    record_statement_sizes(
        &pool,
        "recovery_sizes",
        "outbox_queue",
        "UPDATE",
        "lease_expiries = o.lease_expiries + 1",
    )
    .await;
    // Recovery fails while `fail_recovery` holds a row; each failure takes a sequence value,
    // which the failed transaction does not take back.
    sqlx::raw_sql(
        "CREATE TABLE fail_recovery (reason text NOT NULL);
         INSERT INTO fail_recovery VALUES ('the test fails the first recovery');
         CREATE SEQUENCE failed_recoveries;
         CREATE FUNCTION fail_recovery() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF EXISTS (SELECT 1 FROM fail_recovery) AND NEW.lease_expiries > OLD.lease_expiries THEN
                 PERFORM nextval('failed_recoveries');
                 RAISE EXCEPTION 'recovery fails on purpose';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER fail_recovery BEFORE UPDATE ON outbox_queue
             FOR EACH ROW EXECUTE FUNCTION fail_recovery();",
    )
    .execute(&pool)
    .await
    .unwrap();
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::builder(
        pool.clone(),
        Receiver::new(pool.clone(), "w", Knobs::default()),
    )
    .maintenance_batch(30)
    .maintenance_interval(Duration::from_secs(3))
    .events(tx)
    .start()
    .await
    .unwrap();
    wait_until(
        Duration::from_secs(20),
        "the first recovery failed",
        || async {
            sqlx::query_scalar::<_, bool>("SELECT is_called FROM failed_recoveries")
                .fetch_one(&pool)
                .await
                .unwrap()
        },
    )
    .await;
    sqlx::query("DELETE FROM fail_recovery")
        .execute(&pool)
        .await
        .unwrap();
    wait_event(
        &mut events,
        Duration::from_secs(20),
        "the next maintenance pass",
        |e| matches!(e, WorkerEvent::MaintenanceRan { .. }),
    )
    .await;
    // The pass after the next starts a maintenance interval (3 s) later.
    let sizes = statement_sizes(&pool, "recovery_sizes").await;
    worker.shutdown().await;
    assert_eq!(
        sizes,
        vec![15, 30, 5],
        "recovery statements after the failure: half a batch, then whole ones, until one finds less"
    );
}

#[tokio::test]
async fn an_undecodable_row_whose_lease_already_ended_is_left_to_recovery() {
    let db = database().await;
    let pool = db.pool().clone();
    let store = Store::new(pool.clone());
    let (id, _) = insert_raw_job(&pool, "deep", &arrays(200), "{}").await;
    // A zero lease ends with the claim statement, before the row could be exhausted: the
    // fenced statement must not touch a row its claim no longer owns.
    let batch = store
        .claim_batch_outcome("w", 10, Duration::ZERO, false)
        .await
        .unwrap();
    assert!(batch.events.is_empty());
    assert_eq!(batch.undecodable.len(), 1);
    assert_eq!(batch.undecodable[0].outcome, UndecodableOutcome::Lost);
    let row = queue_rows(&pool)
        .await
        .into_iter()
        .find(|r| r.id == id)
        .unwrap();
    assert_eq!((row.status.as_str(), row.last_error), ("processing", None));
}

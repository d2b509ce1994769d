//! In-process workers: shutdown (unstarted claims handed back uncharged, in-flight deliveries
//! finished, the deadline cancelling the rest), lease loss found by the renewer, and the
//! maintenance leader (one at a time, recovery, purge, hand-over).

mod worker_support;

use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::worker::{SessionRole, Worker, WorkerEvent, application_name};
use tokio::sync::Semaphore;
use worker_support::receiver::{Knobs, Receiver};
use worker_support::*;

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_hands_back_unstarted_claims_without_charging_an_attempt() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 6, false).await;
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    // A closed gate: claimed deliveries wait before the sink, i.e. claimed but not started.
    let worker = Worker::builder(
        pool.clone(),
        Receiver::new(pool.clone(), "gated", Knobs::default()),
    )
    .name("gated")
    .concurrency(4)
    .start_gate(Arc::new(Semaphore::new(0)))
    .events(tx)
    .start()
    .await
    .unwrap();
    let claimed = wait_event(&mut events, WAIT, "a claimed batch", |e| {
        matches!(e, WorkerEvent::ClaimedBatch(_))
    })
    .await;
    let WorkerEvent::ClaimedBatch(claims) = claimed else {
        unreachable!()
    };
    assert_eq!(claims.len(), 4, "claims only its 4 free slots");
    assert_eq!(count_claimed_by(&pool, "gated", "processing").await, 4);
    worker.shutdown().await;
    worker.shutdown().await; // idempotent

    let after = queue_rows(&pool).await;
    assert!(
        after.len() == 6
            && after
                .iter()
                .all(|r| r.status == "pending" && r.attempts == 0),
        "{after:?}"
    );
    assert_eq!(
        received(&pool).await.len(),
        0,
        "the receiver never saw them"
    );
    assert_eq!(worker.counters().released, 4);

    let next = Worker::builder(
        pool.clone(),
        Receiver::new(pool.clone(), "next", Knobs::default()),
    )
    .start()
    .await
    .unwrap();
    wait_until(WAIT, "another worker delivers all 6", || async {
        count_status(&pool, "delivered").await == 6
    })
    .await;
    next.shutdown().await;
    // Each delivered on the attempt the next worker's claim charged, the first.
    let log = received(&pool).await;
    assert_eq!(log.len(), 6);
    assert!(
        log.iter().all(|r| r.attempt == 1 && r.outcome == "ok"),
        "{log:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_running_deliveries_finish() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 4, false).await;
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let knobs = Knobs {
        delay: Duration::from_millis(800),
        ..Default::default()
    };
    let receiver = Receiver::new(pool.clone(), "w", knobs);
    let worker = Worker::builder(pool.clone(), receiver.clone())
        .concurrency(4)
        .events(tx)
        .start()
        .await
        .unwrap();
    wait_event(
        &mut events,
        WAIT,
        "a claimed batch",
        |e| matches!(e, WorkerEvent::ClaimedBatch(c) if c.len() == 4),
    )
    .await;
    // Shut down only once all four reached the receiver: unstarted ones would (rightly) be
    // handed back instead.
    wait_until(WAIT, "all four deliveries started", || async {
        receiver.started() == 4
    })
    .await;
    assert!(
        !worker.is_stopped(),
        "a worker with four deliveries running says it has stopped"
    );
    worker.shutdown().await;
    assert!(worker.is_stopped());
    assert_eq!(
        count_status(&pool, "delivered").await,
        4,
        "in-flight deliveries were finished and completed"
    );
    assert_eq!(received(&pool).await.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_deadline_running_deliveries_are_told_to_stop_and_handed_back() {
    let db = database().await;
    let pool = db.pool().clone();
    // On their last attempt: a delivery the worker itself stopped must not use it up.
    enqueue_jobs_with_attempts(&pool, 0, 2, 1).await;
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let knobs = Knobs {
        delay: Duration::from_secs(60),
        stop_on_lease_lost: true,
        ..Default::default()
    };
    let receiver = Receiver::new(pool.clone(), "w", knobs);
    let worker = Worker::builder(pool.clone(), receiver.clone())
        .shutdown_deadline(Duration::from_millis(300))
        .events(tx)
        .start()
        .await
        .unwrap();
    wait_event(
        &mut events,
        WAIT,
        "a claimed batch",
        |e| matches!(e, WorkerEvent::ClaimedBatch(c) if c.len() == 2),
    )
    .await;
    wait_until(WAIT, "both deliveries started", || async {
        receiver.started() == 2
    })
    .await;
    worker.shutdown().await;
    // The handlers stopped because shutdown told them to (and said so with a retryable error):
    // handed back like unstarted claims, no attempt charged and no handler failure recorded.
    let after = queue_rows(&pool).await;
    assert!(
        after.len() == 2
            && after
                .iter()
                .all(|r| r.status == "pending" && r.attempts == 0 && r.handler_failures == 0),
        "{after:?}"
    );
    let c = worker.counters();
    assert_eq!((c.released, c.retried, c.exhausted), (2, 0, 0), "{c:?}");
    let log = received(&pool).await;
    assert_eq!(
        log.iter()
            .filter(|r| r.outcome == "stopped_lease_lost")
            .count(),
        2,
        "{log:?}"
    );
}

/// A handler that ignores the cancelled `lease_lost` token is abandoned after the grace. On its
/// last attempt it must be handed back (pending, attempt refunded), not exhausted, and no
/// handler failure is recorded: the handler never failed, the worker left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_abandoned_at_shutdown_on_its_last_attempt_is_handed_back_uncharged() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs_with_attempts(&pool, 0, 1, 1).await;
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let knobs = Knobs {
        delay: Duration::from_secs(120),
        stop_on_lease_lost: false,
        ..Default::default()
    };
    let receiver = Receiver::new(pool.clone(), "stubborn", knobs);
    let worker = Worker::builder(pool.clone(), receiver.clone())
        .name("stubborn")
        .shutdown_deadline(Duration::from_millis(100))
        .events(tx)
        .start()
        .await
        .unwrap();
    wait_event(&mut events, WAIT, "a claimed batch", |e| {
        matches!(e, WorkerEvent::ClaimedBatch(_))
    })
    .await;
    wait_until(WAIT, "the delivery started", || async {
        receiver.started() == 1
    })
    .await;
    worker.shutdown().await;

    let row = queue_rows(&pool).await.remove(0);
    assert_eq!(
        (
            row.status.as_str(),
            row.attempts,
            row.handler_failures,
            row.lease_expiries
        ),
        ("pending", 0, 0, 0),
        "{row:?}"
    );
    let c = worker.counters();
    assert_eq!(
        (c.released, c.retried, c.exhausted, c.stale_completions),
        (1, 0, 0, 0),
        "{c:?}"
    );
    // Handed back means deliverable: another worker delivers it on its one attempt.
    let next = Worker::builder(
        pool.clone(),
        Receiver::new(pool.clone(), "next", Knobs::default()),
    )
    .start()
    .await
    .unwrap();
    wait_until(WAIT, "the next worker delivers it", || async {
        count_status(&pool, "delivered").await == 1
    })
    .await;
    next.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_renewer_tells_a_handler_its_lease_was_lost() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 1, false).await;
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let knobs = Knobs {
        delay: Duration::from_secs(60),
        stop_on_lease_lost: true,
        ..Default::default()
    };
    // A lease long enough that the local clock would not end it during the test (108 s, see
    // `inflight`): the handler can only hear of the loss from a renewal.
    let lease = Duration::from_secs(120);
    let worker = Worker::builder(pool.clone(), Receiver::new(pool.clone(), "w", knobs))
        .lease(lease)
        .renew_interval(Duration::from_millis(200))
        .maintenance(false)
        .events(tx)
        .start()
        .await
        .unwrap();
    wait_event(&mut events, WAIT, "a claimed batch", |e| {
        matches!(e, WorkerEvent::ClaimedBatch(_))
    })
    .await;
    let claimed = std::time::Instant::now();
    // Another claim takes the row (as after recovery): the fencing token moves on.
    sqlx::query("UPDATE outbox_queue SET claim_version = claim_version + 1, claimed_by = 'thief'")
        .execute(&pool)
        .await
        .unwrap();
    wait_event(&mut events, WAIT, "lease lost", |e| {
        matches!(e, WorkerEvent::LeaseLost(_))
    })
    .await;
    assert!(
        claimed.elapsed() < lease - lease / 10,
        "the handler was told only when the lease ended by the local clock, not by the renewal"
    );
    wait_until(WAIT, "the handler stopped", || async {
        received(&pool).await.len() == 1
    })
    .await;
    worker.shutdown().await;
    let row = queue_rows(&pool).await.remove(0);
    assert_eq!(
        (
            row.status.as_str(),
            row.claimed_by.as_deref(),
            row.handler_failures
        ),
        ("processing", Some("thief"), 0)
    );
    assert_eq!(received(&pool).await[0].outcome, "stopped_lease_lost");
    let c = worker.counters();
    assert_eq!(c.lease_lost, 1);
    assert_eq!(c.stale_completions, 1, "its failure report was refused too");
    // The renewal that found the claim lost renewed nothing, and says nothing of renewals.
    while let Ok(e) = events.try_recv() {
        assert!(
            !matches!(e, WorkerEvent::Renewed(0)),
            "a renewal that renewed nothing reported {e:?}"
        );
    }
}

/// A row another transaction holds (an operator's `SELECT ... FOR UPDATE`, a long migration)
/// costs the worker's other claims nothing: the renewal skips the held row and renews the rest,
/// so only the held event's lease runs out, and the other event, whose handler runs three times
/// its lease, is delivered on its first attempt.
#[tokio::test]
async fn a_row_held_by_another_transaction_does_not_stop_the_other_renewals() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 2, false).await;
    let both = events(&pool).await;
    let (held, free) = (both[0].id, both[1].id);
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let knobs = Knobs {
        delay: Duration::from_secs(6),
        stop_on_lease_lost: true,
        ..Default::default()
    };
    let receiver = Receiver::new(pool.clone(), "w", knobs);
    let worker = Worker::builder(pool.clone(), receiver.clone())
        .lease(Duration::from_secs(2))
        .renew_interval(Duration::from_millis(200))
        .maintenance(false)
        .events(tx)
        .start()
        .await
        .unwrap();
    wait_until(WAIT, "both handlers run", || async {
        receiver.started() == 2
    })
    .await;
    let mut holder = db.connect().await;
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    // The queue row: the one the renewal updates (the event row is never written).
    sqlx::query("SELECT 1 FROM outbox_queue WHERE id = $1 FOR UPDATE")
        .bind(held)
        .execute(&mut holder)
        .await
        .unwrap();

    // The held event's lease ends by the local clock; no other lease may end before it.
    let lost = wait_event(&mut events, WAIT, "a lease lost", |e| {
        matches!(e, WorkerEvent::LeaseLost(_))
    })
    .await;
    assert!(
        matches!(lost, WorkerEvent::LeaseLost(c) if c.id == held),
        "the held row stopped the renewal of another claim: {lost:?}"
    );
    wait_until(WAIT, "both handlers finished", || async {
        received(&pool).await.len() == 2
    })
    .await;
    sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();
    worker.shutdown().await;
    while let Ok(e) = events.try_recv() {
        assert!(
            !matches!(e, WorkerEvent::LeaseLost(c) if c.id == free),
            "the free event's lease was lost: {e:?}"
        );
    }
    let outcomes: Vec<(i32, String)> = received(&pool)
        .await
        .into_iter()
        .map(|r| (r.attempt, r.outcome))
        .collect();
    assert!(
        outcomes.contains(&(1, "ok".to_owned()))
            && outcomes.contains(&(1, "stopped_lease_lost".to_owned())),
        "{outcomes:?}"
    );
    let states = worker_support::events(&pool).await;
    let free_event = both[1].event_id;
    let delivered_on: Vec<i32> = accepted(&pool)
        .await
        .iter()
        .filter(|r| r.event_id == free_event)
        .map(|r| r.attempt)
        .collect();
    assert!(
        states.contains(&EventRow {
            id: free,
            event_id: free_event,
            status: "delivered".to_owned()
        }) && delivered_on == [1],
        "the free event was not delivered on its first claim: {states:?}, attempts {delivered_on:?}"
    );
    assert_eq!(worker.counters().lease_lost, 1);
}

async fn maintenance_leaders(pool: &sqlx::PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'advisory' AND l.granted AND a.datname = current_database()",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_maintenance_leader_recovers_purges_and_hands_over() {
    let db = database().await;
    let pool = db.pool().clone();
    // One channel for all three workers' hooks.
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let start = |name: &str| {
        Worker::builder(
            pool.clone(),
            Receiver::new(pool.clone(), name, Knobs::default()),
        )
        .name(name)
        .maintenance_interval(Duration::from_millis(100))
        .retention(Some(Duration::from_secs(1)))
        .poll_interval(Duration::from_millis(100))
        .events(tx.clone())
        .start()
    };
    // An orphaned claim (a worker that died): claimed with a short lease by nobody alive, before
    // any worker runs (a running worker, woken by the enqueue, could claim the rows first).
    enqueue_jobs(&pool, 0, 3, false).await;
    let store = outbox_runtime::Store::new(pool.clone());
    let orphans = store
        .claim_batch("dead-worker", 3, Duration::from_millis(300), false)
        .await
        .unwrap();
    assert_eq!(orphans.len(), 3);
    let a = start("m-a").await.unwrap();
    let b = start("m-b").await.unwrap();
    let c = start("m-c").await.unwrap();
    // Five maintenance passes of the leader: the other two, on the same interval, tried to
    // take the lock about as often in that time, and none of them became a leader too.
    let (mut elected, mut passes) = (0, 0);
    while passes < 5 {
        match wait_event(&mut events, WAIT, "maintenance passes", |e| {
            matches!(
                e,
                WorkerEvent::MaintenanceLeader | WorkerEvent::MaintenanceRan { .. }
            )
        })
        .await
        {
            WorkerEvent::MaintenanceLeader => elected += 1,
            _ => passes += 1,
        }
    }
    assert_eq!(elected, 1, "exactly one worker became the leader");
    let leaders = maintenance_leaders(&pool).await;
    assert_eq!(leaders.len(), 1, "exactly one leader: {leaders:?}");

    wait_until(WAIT, "recovered and delivered", || async {
        received(&pool).await.len() == 3
    })
    .await;
    // Each delivered by a claim taken after recovery counted its orphaned lease.
    for r in received(&pool).await {
        assert_eq!(
            (r.outcome.as_str(), r.lease_expiries),
            ("ok", Some(1)),
            "{r:?}"
        );
    }
    // Delivered events go after retention (1 s from their enqueue).
    wait_until(WAIT, "delivered events purged", || async {
        worker_support::events(&pool).await.is_empty()
    })
    .await;
    assert_eq!(effects(&pool).await, 3);

    // The leader stops: another worker takes over.
    let leader = leaders[0].clone();
    let (stop_first, rest): (Vec<_>, Vec<_>) = [a, b, c]
        .into_iter()
        .partition(|w| leader.ends_with(w.name()));
    for w in &stop_first {
        w.shutdown().await;
    }
    wait_until(WAIT, "a new leader", || async {
        let now = maintenance_leaders(&pool).await;
        now.len() == 1 && now[0] != leader
    })
    .await;
    for w in &rest {
        w.shutdown().await;
    }
    assert!(
        maintenance_leaders(&pool).await.is_empty(),
        "leadership released at shutdown"
    );
}

/// The retention counts from the enqueue, and only delivered events (without a queue row) are
/// purged: of five events, four enqueued an hour ago (one delivered, one pending but not due,
/// one claimed by a live worker elsewhere, one exhausted) and one delivered just now, a purge
/// with a minute's retention takes the old delivered one alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purge_takes_old_delivered_events_and_never_an_open_or_exhausted_one() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 5, false).await;
    let ids: Vec<i64> = events(&pool).await.iter().map(|e| e.id).collect();
    let (old_delivered, not_due, held, exhausted, new_delivered) =
        (ids[0], ids[1], ids[2], ids[3], ids[4]);
    for (statement, id) in [
        ("DELETE FROM outbox_queue WHERE id = $1", old_delivered),
        (
            "UPDATE outbox_queue SET available_at = now() + interval '1 hour' WHERE id = $1",
            not_due,
        ),
        (
            "UPDATE outbox_queue SET status = 'processing', claimed_by = 'elsewhere', claim_version = 1,
                                     attempts = 1, lease_until = now() + interval '1 hour'
             WHERE id = $1",
            held,
        ),
        (
            "UPDATE outbox_queue SET status = 'exhausted', exhausted_at = now() WHERE id = $1",
            exhausted,
        ),
        ("DELETE FROM outbox_queue WHERE id = $1", new_delivered),
        // Enqueued an hour ago, all but the one delivered just now.
        (
            "UPDATE outbox SET created_at = now() - interval '1 hour' WHERE id <> $1",
            new_delivered,
        ),
    ] {
        sqlx::query(statement).bind(id).execute(&pool).await.unwrap();
    }
    let (tx, mut hook) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::builder(
        pool.clone(),
        Receiver::new(pool.clone(), "w", Knobs::default()),
    )
    .retention(Some(Duration::from_secs(60)))
    .maintenance_interval(Duration::from_millis(100))
    .events(tx)
    .start()
    .await
    .unwrap();
    let is_pass = |e: &WorkerEvent| matches!(e, WorkerEvent::MaintenanceRan { .. });
    let first = wait_event(&mut hook, WAIT, "a maintenance pass", is_pass).await;
    // And one more: it would purge anything the first one left that was due.
    let second = wait_event(&mut hook, WAIT, "another maintenance pass", is_pass).await;
    worker.shutdown().await;
    assert_eq!(
        (first, second),
        (
            WorkerEvent::MaintenanceRan {
                requeued: 0,
                exhausted: 0,
                purged: 1
            },
            WorkerEvent::MaintenanceRan {
                requeued: 0,
                exhausted: 0,
                purged: 0
            }
        )
    );
    let left: Vec<(i64, String)> = events(&pool)
        .await
        .into_iter()
        .map(|e| (e.id, e.status))
        .collect();
    assert_eq!(
        left,
        [
            (not_due, "pending".to_owned()),
            (held, "processing".to_owned()),
            (exhausted, "exhausted".to_owned()),
            (new_delivered, "delivered".to_owned()),
        ]
    );
    assert!(
        received(&pool).await.is_empty(),
        "nothing was due for delivery"
    );
}

/// Two outbox tables, both named `outbox`, in two schemas (each worker's pool has its own
/// `search_path`): two tables, so two maintenance leaders at the same time. A lock key derived
/// from the table name alone makes them share one leader, and the other schema's expired leases
/// are never recovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_tables_in_two_schemas_each_get_their_own_maintenance_leader() {
    let db = database().await;
    let pool = db.pool().clone();
    let ddl = outbox_runtime::store::create_table_sql("outbox").unwrap();
    let schemas = ["tenant_a", "tenant_b"];
    let mut schema_pools = Vec::new();
    for schema in schemas {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&pool)
            .await
            .unwrap();
        let options = db
            .connect_options()
            .clone()
            .options([("search_path", format!("{schema},public"))]);
        let schema_pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(6)
            .connect_with(options)
            .await
            .unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.clone()))
            .execute(&schema_pool)
            .await
            .unwrap();
        let resolved: String = sqlx::query_scalar(
            "SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = to_regclass('outbox')",
        )
        .fetch_one(&schema_pool)
        .await
        .unwrap();
        assert_eq!(
            resolved, schema,
            "`outbox` resolves to the schema's own table"
        );
        // Orphaned claims (a worker that died) for the leader of this schema to recover.
        enqueue_jobs(&schema_pool, 0, 2, false).await;
        let orphans = outbox_runtime::Store::new(schema_pool.clone())
            .claim_batch("dead-worker", 2, Duration::from_millis(200), false)
            .await
            .unwrap();
        assert_eq!(orphans.len(), 2);
        schema_pools.push(schema_pool);
    }

    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let mut workers = Vec::new();
    for (schema, schema_pool) in schemas.iter().zip(&schema_pools) {
        workers.push(
            // The receiver on the schema's pool: its log (public) records the queue row of the
            // schema's own table as each delivery saw it.
            Worker::builder(
                schema_pool.clone(),
                Receiver::new(schema_pool.clone(), schema, Knobs::default()),
            )
            .name(*schema)
            .maintenance_interval(Duration::from_millis(100))
            .poll_interval(Duration::from_millis(100))
            .events(tx.clone())
            .start()
            .await
            .unwrap(),
        );
    }
    for _ in schemas {
        wait_event(&mut events, WAIT, "a maintenance leader per schema", |e| {
            matches!(e, WorkerEvent::MaintenanceLeader)
        })
        .await;
    }
    assert_eq!(
        maintenance_leaders(&pool).await.len(),
        2,
        "both leaders hold their locks at once"
    );
    for (schema, schema_pool) in schemas.iter().zip(&schema_pools) {
        wait_until(
            WAIT,
            &format!("{schema}: orphans recovered and delivered"),
            || async {
                // Delivered (no queue row left), each by a claim that saw its orphaned lease
                // counted.
                let recovered = accepted(&pool)
                    .await
                    .iter()
                    .filter(|r| r.worker == *schema && r.lease_expiries == Some(1))
                    .count();
                recovered == 2 && count_status(schema_pool, "delivered").await == 2
            },
        )
        .await;
    }
    for w in &workers {
        w.shutdown().await;
    }
}

/// Sessions open in the test's database whose `application_name` matches the LIKE `pattern`.
async fn sessions_like(pool: &sqlx::PgPool, pattern: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name LIKE $1",
    )
    .bind(pattern)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Sessions of the worker named `worker` open in the test's database, whatever their role.
async fn open_sessions(pool: &sqlx::PgPool, worker: &str) -> i64 {
    sessions_like(pool, &format!("outbox-% {worker}")).await
}

/// Sessions of the worker named `worker` open for `role`.
async fn role_sessions(pool: &sqlx::PgPool, role: SessionRole, worker: &str) -> i64 {
    sessions_like(pool, &application_name(role, worker)).await
}

/// `start` returns with the claimer's and the completer's first sessions open (opened together
/// with the contract check): neither the first claim nor the first completion waits for a
/// connection, which with TLS is a handshake each. Before, the completer's first session was
/// opened by the first completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_returns_with_the_claimer_and_the_completer_sessions_open() {
    let db = database().await;
    let pool = db.pool().clone();
    let receiver = Receiver::new(pool.clone(), "w", Knobs::default());
    let worker = Worker::builder(pool.clone(), receiver)
        .name("warm")
        .maintenance(false)
        .start()
        .await
        .unwrap();
    // Nothing is enqueued: no completion has run, so only the start can have opened these.
    assert_eq!(role_sessions(&pool, SessionRole::Claimer, "warm").await, 1);
    assert_eq!(
        role_sessions(&pool, SessionRole::Completer, "warm").await,
        1
    );
    assert_eq!(worker.counters().delivered, 0);
    worker.shutdown().await;
}

/// The claimer keeps its session from one claim to the next (no pool checkout, so no liveness
/// pings in front of a claim), but not beyond the service pool's `max_lifetime`: a service that
/// rotates its connections sees the claimer's rotate too. With a lifetime of one second and a
/// claim every 20 ms, the claimer's session must change; one kept for good never would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_claimer_session_goes_back_to_the_pool_after_its_max_lifetime() {
    let db = database().await;
    let rotating = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .max_lifetime(Duration::from_secs(1))
        .connect(&db.url())
        .await
        .unwrap();
    let pool = db.pool().clone();
    let receiver = Receiver::new(pool.clone(), "w", Knobs::default());
    let worker = Worker::builder(rotating.clone(), receiver)
        .name("rotating")
        .maintenance(false)
        .listen(false)
        .poll_interval(Duration::from_millis(20))
        .start()
        .await
        .unwrap();
    let claimer = application_name(SessionRole::Claimer, "rotating");
    let first = session_pids(&pool, &claimer).await;
    assert_eq!(first.len(), 1, "{first:?}");
    wait_until(WAIT, "the claimer's session was replaced", || async {
        let now = session_pids(&pool, &claimer).await;
        now.len() == 1 && now != first
    })
    .await;
    // Still claiming on the new one.
    enqueue_jobs(&pool, 0, 3, false).await;
    wait_until(WAIT, "the events are delivered", || async {
        count_status(&pool, "delivered").await == 3
    })
    .await;
    worker.shutdown().await;
    rotating.close().await;
}

/// A start the contract check refuses closes the sessions it opened beside the check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_start_leaves_no_session_open() {
    let db = database().await;
    let pool = db.pool().clone();
    // A registry row no binary can match: the start-up check refuses every worker.
    sqlx::query(
        "INSERT INTO outbox_contracts (event_type, event_version, fingerprint, type_name, table_name, shape) \
         VALUES ('not a valid name', 1, repeat('a', 64), 't', 'outbox', '{}')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let receiver = Receiver::new(pool.clone(), "w", Knobs::default());
    let refused = Worker::builder(pool.clone(), receiver)
        .name("refused")
        .start()
        .await
        .unwrap_err();
    assert!(
        matches!(refused, outbox_runtime::Error::ContractMismatch(_)),
        "{refused}"
    );
    wait_until(WAIT, "the refused worker's sessions closed", || async {
        open_sessions(&pool, "refused").await == 0
    })
    .await;
}

/// Dropping the handle starts the same shutdown in the background: the worker's sessions
/// (claimer, renewer, completer, listener, maintenance) all close, with no one left to call
/// `shutdown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_handle_shuts_the_worker_down() {
    let db = database().await;
    let pool = db.pool().clone();
    let receiver = Receiver::new(pool.clone(), "w", Knobs::default());
    let worker = Worker::builder(pool.clone(), receiver)
        .name("dropped")
        .start()
        .await
        .unwrap();
    wait_until(WAIT, "the worker's sessions open", || async {
        open_sessions(&pool, "dropped").await > 0
    })
    .await;
    drop(worker);
    wait_until(
        WAIT,
        "every session of the dropped worker closed",
        || async { open_sessions(&pool, "dropped").await == 0 },
    )
    .await;
}

/// A worker that has shut down holds no session, though its handle (and so its pools) is still
/// alive: the service's connection limit is not spent on a stopped worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_every_session_of_the_worker() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 20, false).await;
    let receiver = Receiver::new(pool.clone(), "w", Knobs::default());
    let worker = Worker::builder(pool.clone(), receiver)
        .name("stopping")
        .start()
        .await
        .unwrap();
    wait_until(WAIT, "the jobs are delivered", || async {
        count_status(&pool, "delivered").await == 20
    })
    .await;
    assert!(open_sessions(&pool, "stopping").await > 0);
    worker.shutdown().await;
    wait_until(
        WAIT,
        "every session of the stopped worker closed",
        || async { open_sessions(&pool, "stopping").await == 0 },
    )
    .await;
    assert!(worker.is_stopped());
}

/// `run_until` starts the worker, delivers until the signal, shuts down, and returns what the
/// worker counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_until_delivers_until_the_signal_and_returns_the_counts() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 12, false).await;
    let receiver = Receiver::new(pool.clone(), "w", Knobs::default());
    let all_delivered = {
        let pool = pool.clone();
        async move {
            wait_until(WAIT, "every job delivered", || async {
                count_status(&pool, "delivered").await == 12
            })
            .await;
        }
    };
    let counts = Worker::builder(pool.clone(), receiver)
        .build()
        .unwrap()
        .run_until(all_delivered)
        .await
        .unwrap();
    assert_eq!(counts.delivered, 12, "{counts:?}");
    assert_eq!(received(&pool).await.len(), 12);
}

//! Process-level faults against real worker processes (`examples/crash_target.rs`): SIGKILL
//! after claiming, a lease that runs out under a slow handler, renewal keeping a long delivery
//! single, a lost response, a killed LISTEN connection, killed claimer and completer sessions,
//! graceful shutdown mid-stream, and
//! per-aggregate ordering across four processes. Each test checks the outbox rows and what the
//! receiver recorded (a delivered event keeps no queue row: what the claim that delivered it
//! had, its attempt, claim version, lease expiries and failures, the receiver's log records).

mod worker_support;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use outbox_runtime::worker::{SessionRole, application_name};
use worker_support::*;

const WAIT: Duration = Duration::from_secs(60);

fn by_event(log: &[Received]) -> HashMap<uuid::Uuid, Vec<Received>> {
    let mut m: HashMap<uuid::Uuid, Vec<Received>> = HashMap::new();
    for r in log {
        m.entry(r.event_id).or_default().push(r.clone());
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_claiming_leaves_nothing_lost() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 20, false).await;

    // A claims 8 (its free slots) and is killed while its receiver is still working on them.
    let mut a = WorkerProcess::spawn(
        &db.url(),
        "killed",
        &[
            "--concurrency",
            "8",
            "--delay-ms",
            "30000",
            "--lease-ms",
            "1500",
        ],
    );
    wait_until(WAIT, "the first worker holds 8 claims", || async {
        count_claimed_by(&pool, "killed", "processing").await == 8
    })
    .await;
    a.kill();
    let orphaned: Vec<uuid::Uuid> = queue_rows(&pool)
        .await
        .into_iter()
        .filter(|r| r.status == "processing")
        .map(|r| r.event_id)
        .collect();
    assert_eq!(
        orphaned.len(),
        8,
        "the killed worker's claims are still processing (nobody completed them)"
    );

    let _b = WorkerProcess::spawn(&db.url(), "survivor", &["--lease-ms", "1500"]);
    wait_until(WAIT, "all 20 events are delivered", || async {
        count_status(&pool, "delivered").await == 20
    })
    .await;

    for r in accepted(&pool).await {
        assert_eq!(r.claimed_by.as_deref(), Some("survivor"));
        if orphaned.contains(&r.event_id) {
            assert_eq!(
                (r.attempt, r.lease_expiries),
                (2, Some(1)),
                "event {} was recovered after its lease: {r:?}",
                r.event_id
            );
        } else {
            assert_eq!(
                (r.attempt, r.lease_expiries),
                (1, Some(0)),
                "event {} was delivered at once: {r:?}",
                r.event_id
            );
        }
    }
    let log = received(&pool).await;
    assert_eq!(
        log.len(),
        20,
        "the killed worker's receiver never finished; the survivor delivered each once"
    );
    assert!(
        log.iter()
            .all(|r| r.worker == "survivor" && r.outcome == "ok")
    );
    assert_eq!(by_event(&log).len(), 20);
    assert_eq!(effects(&pool).await, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handler_without_renewal_is_redelivered_and_its_completion_rejected() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 1, false).await;

    // One slot: while its handler runs, the slow worker cannot claim the event again itself.
    let mut slow = WorkerProcess::spawn(
        &db.url(),
        "slow",
        &[
            "--no-renewal",
            "--concurrency",
            "1",
            "--lease-ms",
            "1000",
            "--delay-ms",
            "4000",
        ],
    );
    wait_until(WAIT, "the slow worker claimed the event", || async {
        count_claimed_by(&pool, "slow", "processing").await == 1
    })
    .await;
    let mut fast = WorkerProcess::spawn(&db.url(), "fast", &["--lease-ms", "1000"]);
    wait_until(WAIT, "the second worker delivered it", || async {
        delivered_by(&pool, "fast").await == 1
    })
    .await;
    wait_until(
        WAIT,
        "the slow worker's completion is rejected as stale",
        || async { worker_events(&pool, "slow", "stale").await == 1 },
    )
    .await;

    assert_eq!(count_status(&pool, "delivered").await, 1);
    // The fast worker's claim delivered it: the second, after the slow one's lease ran out.
    let by_fast: Vec<Received> = accepted(&pool)
        .await
        .into_iter()
        .filter(|r| r.worker == "fast")
        .collect();
    assert_eq!(by_fast.len(), 1, "{by_fast:?}");
    let row = &by_fast[0];
    assert_eq!(
        (row.attempt, row.claim_version, row.lease_expiries),
        (2, 2, Some(1)),
        "{row:?}"
    );
    assert_eq!(row.claimed_by.as_deref(), Some("fast"));
    // At least once, visibly: the receiver saw both workers, with one idempotency key, and kept
    // one effect.
    let log = received(&pool).await;
    let seen: Vec<(&str, i32)> = log.iter().map(|r| (r.worker.as_str(), r.attempt)).collect();
    assert_eq!(seen, vec![("fast", 2), ("slow", 1)], "{log:?}");
    assert_eq!(log[0].idempotency_key, log[1].idempotency_key);
    assert_eq!(effects(&pool).await, 1);

    slow.terminate();
    assert!(slow.wait_exit(WAIT).await);
    assert_eq!(
        slow.reported("stale").as_deref(),
        Some("1"),
        "the slow worker counts its stale completion"
    );
    assert_eq!(slow.reported("delivered").as_deref(), Some("0"));
    fast.terminate();
    assert!(fast.wait_exit(WAIT).await);
    assert_eq!(fast.reported("delivered").as_deref(), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_handler_with_renewal_is_delivered_once() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 1, false).await;

    let mut long = WorkerProcess::spawn(
        &db.url(),
        "long",
        &["--lease-ms", "1000", "--delay-ms", "4000"],
    );
    wait_until(WAIT, "the long worker claimed the event", || async {
        count_claimed_by(&pool, "long", "processing").await == 1
    })
    .await;
    // A competitor that would take the event the moment its lease ran out.
    let _rival = WorkerProcess::spawn(&db.url(), "rival", &["--lease-ms", "1000"]);
    wait_until(WAIT, "the event is delivered", || async {
        count_status(&pool, "delivered").await == 1
    })
    .await;

    // The row as the delivery saw it when the handler finished, four leases after the claim.
    let row = accepted(&pool).await.remove(0);
    assert_eq!(row.claimed_by.as_deref(), Some("long"));
    assert_eq!(
        (row.attempt, row.claim_version, row.lease_expiries),
        (1, 1, Some(0)),
        "renewal kept the one claim alive: {row:?}"
    );
    let log = received(&pool).await;
    assert_eq!(log.len(), 1, "exactly one delivery: {log:?}");
    assert_eq!(
        (log[0].worker.as_str(), log[0].outcome.as_str()),
        ("long", "ok")
    );
    assert_eq!(worker_events(&pool, "long", "lease_lost").await, 0);
    long.terminate();
    assert!(long.wait_exit(WAIT).await);
    assert_eq!(long.reported("stale").as_deref(), Some("0"));
    let renewals_seen = long.reported("delivered");
    assert_eq!(renewals_seen.as_deref(), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_response_is_redelivered_with_the_same_key_and_the_receiver_keeps_one_effect() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 5, false).await;

    let _w = WorkerProcess::spawn(
        &db.url(),
        "w",
        &["--lose-response-first", "1", "--retry-base-ms", "100"],
    );
    wait_until(WAIT, "all 5 events are delivered", || async {
        count_status(&pool, "delivered").await == 5
    })
    .await;

    let delivering = accepted(&pool).await;
    assert_eq!(delivering.len(), 5);
    for r in delivering {
        assert_eq!((r.attempt, r.handler_failures), (2, Some(1)), "{r:?}");
    }
    let per_event = by_event(&received(&pool).await);
    assert_eq!(per_event.len(), 5);
    for (event_id, deliveries) in per_event {
        let seen: Vec<(i32, &str)> = deliveries
            .iter()
            .map(|d| (d.attempt, d.outcome.as_str()))
            .collect();
        assert_eq!(
            seen,
            vec![(1, "lost_response"), (2, "ok")],
            "event {event_id}"
        );
        assert!(
            deliveries
                .iter()
                .all(|d| d.idempotency_key == event_id.to_string()),
            "same key on every attempt"
        );
    }
    assert_eq!(
        effects(&pool).await,
        5,
        "the receiver deduplicated the redelivery by its key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_listen_connection_reconnects_and_delivery_continues() {
    let db = database().await;
    let pool = db.pool().clone();
    let _w = listening_worker_with_one_delivery(&db.url(), &pool, "listener", &[]).await;

    for round in 1..=2i64 {
        assert_eq!(
            terminate_sessions(&pool, &application_name(SessionRole::Listener, "listener")).await,
            1,
            "exactly one LISTEN session, terminated"
        );
        // Enqueued right after the kill: its notification may well be lost.
        enqueue_jobs(&pool, round * 10, round * 10 + 3, true).await;
        wait_until(WAIT, "the listener reconnected", || async {
            worker_events(&pool, "listener", "listener_connected").await == 1 + round
        })
        .await;
        wait_until(
            WAIT,
            "the events enqueued around the kill are delivered",
            || async { count_status(&pool, "delivered").await == 1 + 3 * round },
        )
        .await;
    }
    enqueue_jobs(&pool, 100, 101, true).await;
    wait_until(
        WAIT,
        "an event enqueued after reconnecting is delivered",
        || async { count_status(&pool, "delivered").await == 8 },
    )
    .await;
    let log = received(&pool).await;
    assert_eq!(log.len(), 8);
    assert_eq!(by_event(&log).len(), 8);
    assert_eq!(effects(&pool).await, 8);
}

/// A worker process named `name` that polls every 10 minutes (so anything it delivers promptly
/// came through NOTIFY, or the claim that follows a reconnect), once it listens and has
/// delivered one event.
async fn listening_worker_with_one_delivery(
    url: &str,
    pool: &sqlx::PgPool,
    name: &str,
    args: &[&str],
) -> WorkerProcess {
    let args: Vec<&str> = ["--poll-ms", "600000"]
        .iter()
        .chain(args)
        .copied()
        .collect();
    let worker = WorkerProcess::spawn(url, name, &args);
    wait_until(WAIT, "the worker listens", || async {
        worker_events(pool, name, "listener_connected").await == 1
    })
    .await;
    enqueue_jobs(pool, 0, 1, true).await;
    wait_until(WAIT, "the first event is delivered", || async {
        count_status(pool, "delivered").await == 1
    })
    .await;
    worker
}

/// The claimer keeps its session from one claim to the next (no pool checkout, so no liveness
/// round trips in front of a claim). A session the server ended while the worker was idle must
/// cost nothing: the next claim fails on it, and is made again at once on a new session. With
/// polling every 10 minutes, an event enqueued after the kill reaches the receiver within the
/// wait only if that happens (a claimer that waited for its next poll after the failure would
/// not deliver it). Sessions killed mid-drain, the claimer's and the completer's, lose nothing:
/// every event reaches the receiver, which keeps one effect per event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_claimer_and_completer_sessions_are_replaced_and_lose_nothing() {
    let db = database().await;
    let pool = db.pool().clone();
    let _w =
        listening_worker_with_one_delivery(&db.url(), &pool, "sessions", &["--delay-ms", "10"])
            .await;

    for round in 1..=2i64 {
        assert_eq!(
            terminate_sessions(&pool, &application_name(SessionRole::Claimer, "sessions")).await,
            1,
            "the idle worker holds exactly one claimer session"
        );
        enqueue_jobs(&pool, round * 10, round * 10 + 1, true).await;
        wait_until(
            WAIT,
            "the event enqueued after the claimer's session was killed is delivered",
            || async { count_status(&pool, "delivered").await == 1 + round },
        )
        .await;
    }

    // Mid-drain: 400 events, each receiver call 10 ms on 4 slots (a second in all), and the
    // claimer's and the completer's sessions killed while they are being delivered.
    enqueue_jobs(&pool, 100, 500, true).await;
    for kills in 0..4 {
        wait_until(WAIT, "more events are delivered", || {
            let pool = pool.clone();
            async move { count_status(&pool, "delivered").await > 3 + 60 * kills }
        })
        .await;
        terminate_sessions(&pool, &application_name(SessionRole::Claimer, "sessions")).await;
        terminate_sessions(&pool, &application_name(SessionRole::Completer, "sessions")).await;
    }
    wait_until(WAIT, "every event is delivered", || async {
        count_status(&pool, "delivered").await == 403
    })
    .await;
    let log = received(&pool).await;
    let events = by_event(&log);
    assert_eq!(events.len(), 403, "every event reached the receiver");
    assert_eq!(
        effects(&pool).await,
        403,
        "the receiver kept one effect per event"
    );
    assert_eq!(
        session_pids(&pool, &application_name(SessionRole::Claimer, "sessions"))
            .await
            .len(),
        1,
        "the claimer holds one session again, not one per failure"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_mid_stream_loses_nothing_and_charges_no_unstarted_event() {
    let db = database().await;
    let pool = db.pool().clone();
    enqueue_jobs(&pool, 0, 30, false).await;

    let mut first = WorkerProcess::spawn(
        &db.url(),
        "first",
        &["--concurrency", "4", "--delay-ms", "700"],
    );
    wait_until(
        WAIT,
        "the first worker delivered some and holds more",
        || async {
            received(&pool).await.len() >= 4
                && count_claimed_by(&pool, "first", "processing").await > 0
        },
    )
    .await;
    first.terminate();
    assert!(
        first.wait_exit(WAIT).await,
        "graceful shutdown exits cleanly"
    );
    assert_eq!(first.reported("stale").as_deref(), Some("0"));

    let after = events(&pool).await;
    assert_eq!(
        after.iter().filter(|r| r.status == "processing").count(),
        0,
        "nothing left claimed: {after:?}"
    );
    let log = received(&pool).await;
    let delivered: Vec<_> = after.iter().filter(|r| r.status == "delivered").collect();
    assert!(delivered.len() >= 4);
    assert_eq!(
        log.len(),
        delivered.len(),
        "every delivery the receiver saw was completed, and only those"
    );
    let attempts: HashMap<i64, i32> = queue_rows(&pool)
        .await
        .into_iter()
        .map(|q| (q.id, q.attempts))
        .collect();
    for r in &after {
        let seen: Vec<i32> = log
            .iter()
            .filter(|l| l.event_id == r.event_id)
            .map(|l| l.attempt)
            .collect();
        match r.status.as_str() {
            "delivered" => assert_eq!(seen, [1], "{r:?}"),
            "pending" => assert_eq!(
                (seen.len(), attempts.get(&r.id)),
                (0, Some(&0)),
                "an unstarted event is not charged: {r:?}"
            ),
            other => panic!("unexpected status {other}: {r:?}"),
        }
    }
    assert_eq!(
        first
            .reported("delivered")
            .map(|d| d.parse::<usize>().unwrap()),
        Some(delivered.len())
    );

    let _second = WorkerProcess::spawn(&db.url(), "second", &["--concurrency", "8"]);
    wait_until(WAIT, "the rest is delivered", || async {
        count_status(&pool, "delivered").await == 30
    })
    .await;
    let log = received(&pool).await;
    assert_eq!(log.len(), 30);
    assert_eq!(
        by_event(&log).len(),
        30,
        "each event exactly once across both workers"
    );
    assert!(log.iter().all(|r| r.attempt == 1), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_aggregate_order_holds_under_four_workers_with_retries() {
    let db = database().await;
    let pool = db.pool().clone();
    const ACCOUNTS: usize = 12;
    const PER_ACCOUNT: i64 = 10;
    enqueue_steps(&pool, ACCOUNTS, PER_ACCOUNT).await;
    let total = ACCOUNTS as i64 * PER_ACCOUNT;

    // Every first attempt fails, so every event is retried: an unordered worker would now
    // deliver later steps first.
    let _workers: Vec<WorkerProcess> = (0..4)
        .map(|i| {
            WorkerProcess::spawn(
                &db.url(),
                &format!("ordered-{i}"),
                &[
                    "--ordered",
                    "--concurrency",
                    "4",
                    "--fail-first",
                    "1",
                    "--retry-base-ms",
                    "50",
                    "--poll-ms",
                    "100",
                ],
            )
        })
        .collect();
    wait_until(WAIT, "every step is delivered", || async {
        count_status(&pool, "delivered").await == total
    })
    .await;

    let log = received(&pool).await;
    let mut per_account: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
    for r in &log {
        per_account
            .entry(r.aggregate_id.clone().unwrap())
            .or_default()
            .push((r.aggregate_version.unwrap(), r.outcome.clone()));
    }
    assert_eq!(per_account.len(), ACCOUNTS);
    let workers_used: std::collections::HashSet<&str> =
        log.iter().map(|r| r.worker.as_str()).collect();
    assert!(
        workers_used.len() > 1,
        "the work was shared between processes: {workers_used:?}"
    );
    for (account, seen) in per_account {
        let expected: Vec<(i64, String)> = (1..=PER_ACCOUNT)
            .flat_map(|s| [(s, "failed".to_owned()), (s, "ok".to_owned())])
            .collect();
        assert_eq!(
            seen, expected,
            "account {account} saw its steps out of order"
        );
    }
    assert_eq!(effects(&pool).await, total);
}
